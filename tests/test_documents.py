"""The typed document reader: what it reads, and every way a document can be wrong
said with the field's path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from servegate import documents
from servegate.documents import DocumentError


@dataclass(frozen=True)
class Inner:
    name: str
    seconds: float = 0.0


@dataclass(frozen=True)
class Doc:
    schema: int
    kind: Literal["a", "b"] = "a"
    inner: Inner | None = None
    items: list[Inner] = field(default_factory=list)
    hashes: dict[str, str] = field(default_factory=dict)


def test_a_document_reads_back_as_it_was_written() -> None:
    doc = Doc(1, "b", Inner("x", 1.5), [Inner("y")], {"a.so": "0" * 64})
    assert documents.read(Doc, documents.plain(doc)) == doc
    assert documents.read(Doc, {"schema": 1, "inner": {"name": "z", "seconds": 2}}).inner == (
        Inner("z", 2.0)  # a whole number is a number
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ([], "is not an object (list"),
        ({}, "schema is missing"),
        ({"schema": 1, "extra": 1}, "extra is not a field of this document"),
        ({"schema": True}, "schema is bool"),
        ({"schema": 1.0}, "schema is float"),
        ({"schema": 1, "kind": "c"}, "kind is str 'c', not one of ['a', 'b']"),
        ({"schema": 1, "inner": {"name": 3}}, "inner.name is int"),
        ({"schema": 1, "inner": {"name": "x", "seconds": "1"}}, "inner.seconds is str"),
        ({"schema": 1, "inner": {"name": "x", "seconds": True}}, "inner.seconds is bool"),
        ({"schema": 1, "items": {"name": "x"}}, "items is not a list"),
        ({"schema": 1, "items": [{"name": "x"}, {}]}, "items[1].name is missing"),
        ({"schema": 1, "hashes": {"a": None}}, "hashes.a is NoneType"),
    ],
)
def test_a_wrong_document_is_named_by_its_field(value: object, said: str) -> None:
    with pytest.raises(DocumentError) as err:
        documents.read(Doc, value)
    assert said in str(err.value)
