"""Typed documents: the JSON files servegate writes and reads back, as dataclasses.

One strict reader, :func:`read`, turns a parsed JSON value into a dataclass by its type
hints, with the config loader's rules: an unknown field is an error that names it, a
missing field without a default is one, every value must be of its field's type (a bool
is not a number, a string is not a list), and nested dataclasses, lists, string maps,
``Literal`` choices and ``X | None`` are read the same way. A command then holds a typed
object or has a :class:`DocumentError` saying where the document is wrong, never a dict
to probe. :func:`plain` writes one back.

Why written here rather than with pydantic or cattrs: the documents are a handful of flat
dataclasses, the errors must name the field as the user's file spells it (``history[3].
startup_seconds``) and become servegate's own failure classes, and servegate keeps its
import time small for ``release status``; the reader is the config loader's rules applied
to JSON, in about a hundred lines.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

T = TypeVar("T")


class DocumentError(ValueError):
    """Where a document is not what its class says (``where``: the field's path)."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where} {why}" if where else why)
        self.where = where


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {str(value)[:40]!r}"


def _read(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return read(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _read(rest[0], value, where)
        raise TypeError(f"{where}: only X | None unions are read")
    if origin is Literal:
        if value not in args:
            raise DocumentError(where, f"is {_kind(value)}, not one of {list(args)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise DocumentError(where, f"is not a list ({_kind(value)})")
        return [_read(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, dict):
            raise DocumentError(where, f"is not an object ({_kind(value)})")
        kt, vt = args or (str, Any)
        return {_read(kt, k, where): _read(vt, v, f"{where}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise DocumentError(where, f"is {_kind(value)}, not a number")
        return float(value)
    if tp in (str, int, bool):
        if type(value) is not tp:
            want = {str: "a string", int: "a whole number", bool: "a boolean"}[tp]
            raise DocumentError(where, f"is {_kind(value)}, not {want}")
        return value
    raise TypeError(f"{where}: no reader for {tp!r}")


def read(cls: type[T], value: Any, where: str = "") -> T:
    """``value`` (parsed JSON) as a ``cls`` dataclass, or :class:`DocumentError`."""
    if not isinstance(value, dict):
        raise DocumentError(where, f"is not an object ({_kind(value)})")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    prefix = f"{where}." if where else ""
    for key in value:
        if key not in fields:
            raise DocumentError(f"{prefix}{key}", "is not a field of this document")
    kwargs: dict[str, Any] = {}
    for name, fld in fields.items():
        if name in value:
            kwargs[name] = _read(hints[name], value[name], f"{prefix}{name}")
        elif fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING:
            raise DocumentError(f"{prefix}{name}", "is missing")
    return cls(**kwargs)


def plain(doc: Any) -> Any:
    """A document (or any value in one) as JSON-ready data."""
    if dataclasses.is_dataclass(doc) and not isinstance(doc, type):
        return {f.name: plain(getattr(doc, f.name)) for f in dataclasses.fields(doc) if f.init}
    if isinstance(doc, list | tuple):
        return [plain(v) for v in doc]
    if isinstance(doc, Mapping):
        return {k: plain(v) for k, v in doc.items()}
    return doc
