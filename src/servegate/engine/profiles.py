"""Launch profiles: a server's environment, interpreter, arguments and unit limits in TOML.

A profile file has the tables ``[profile]`` (description, engine, include, required),
``[params]`` (named values used as ``{name}`` placeholders, with defaults), ``[launch]``
(interpreter + module, or executable; positional arguments; working directory),
``[env]``, ``[args]`` (``--name`` → value), ``[unit]`` (the systemd unit's limits) and
``[expect]`` (what the lint rules hold the launch to).

``include`` names shipped profiles or paths (relative to the including file). Included
files are merged in order, then the including file overrides what it names: ``[env]`` and
``[args]`` key by key, ``false`` removes an argument, object-valued arguments (inline
tables, or JSON strings such as ``'{"mode":0}'``) merge key by key, every other table
field by field. Two included files that set one variable to different values are an
error unless the including file says which wins.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from servegate.errors import ConfigError, did_you_mean
from servegate.pipeline import redact

Engine = Literal["vllm", "transformers", "openai"]
SECTIONS = ("profile", "params", "launch", "env", "args", "unit", "expect")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
BUILTIN_PLACES = ("release", "port", "sha", "short", "host_root")
T = TypeVar("T")


@dataclass(frozen=True)
class Header:
    description: str = ""
    #: ``vllm``, ``transformers`` (``transformers serve``) or ``openai`` (any other
    #: OpenAI-compatible server)
    engine: Engine = "vllm"
    include: tuple[str, ...] = ()
    #: parameters that must be given (``[service.params]`` or ``--param``)
    required: tuple[str, ...] = ()


@dataclass(frozen=True)
class Launch:
    #: the Python that runs ``module``
    interpreter: str = ""
    #: ``python -m MODULE``; or leave empty and give ``executable``
    module: str = ""
    executable: str = ""
    #: arguments before the ``--options`` (e.g. the model of ``vllm serve``)
    positional: tuple[str, ...] = ()
    cwd: str = "{release}"


@dataclass(frozen=True)
class UnitSettings:
    """The service unit's restart policy and limits (systemd names in the comments)."""

    restart: str = "on-failure"  # Restart=
    restart_sec: int = 5  # RestartSec=
    kill_mode: str = "control-group"  # KillMode=
    memory_max: str = ""  # MemoryMax=
    memory_swap_max: str = ""  # MemorySwapMax=
    start_limit_interval: int = 600  # StartLimitIntervalSec=
    start_limit_burst: int = 3  # StartLimitBurst=
    timeout_stop: int = 120  # TimeoutStopSec=


@dataclass(frozen=True)
class Expect:
    """What the launch is held to by the lint and log rules."""

    #: ``--kv-cache-memory-bytes`` the profile was measured with (0: not checked)
    kv_cache_bytes: int = 0
    #: the highest ``--max-num-seqs`` known to be safe on this box (0: not checked)
    safe_max_num_seqs: int = 0
    #: ``VLLM_*`` variables the engine (a fork) adds beyond upstream vLLM
    engine_env: tuple[str, ...] = ()
    #: the rocBLAS library TunableOp tables are keyed to; empty: searched on LD_LIBRARY_PATH
    rocblas_library: str = ""
    #: log lines start-up must show (e.g. ``rdna_ar: one-shot all-reduce active``)
    log_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class Profile:
    name: str
    #: the files merged, base first
    files: tuple[str, ...]
    header: Header
    params: Mapping[str, str]
    launch: Launch
    env: Mapping[str, str]
    args: Mapping[str, Any]
    unit: UnitSettings
    expect: Expect
    #: "env.NAME" / "args.NAME" → "file:line" of the value that won
    origins: Mapping[str, str] = field(default_factory=dict)

    def where(self, key: str) -> str:
        return self.origins.get(key, self.files[-1])


@dataclass(frozen=True)
class Resolved:
    """A profile with every placeholder filled: what the service is started with."""

    profile: Profile
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    #: ``[args]`` with placeholders filled (objects kept as objects)
    args: Mapping[str, Any]
    unresolved: tuple[str, ...] = ()


# -- loading ------------------------------------------------------------------------------


def shipped_dir() -> Path:
    return Path(str(resources.files("servegate.engine").joinpath("profiles")))


def shipped() -> list[str]:
    return sorted(p.stem for p in shipped_dir().glob("*.toml"))


def locate(ref: str, base: Path | None = None) -> Path:
    """A shipped profile's name, or a path (relative to ``base``)."""
    if "/" not in ref and not ref.endswith(".toml"):
        path = shipped_dir() / f"{ref}.toml"
        if not path.is_file():
            raise ConfigError(
                f"no shipped profile named {ref!r}" + did_you_mean(ref, shipped()),
                hint=f"shipped: {', '.join(shipped())}; or give a path to a .toml file",
            )
        return path
    path = Path(ref).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    if not path.is_file():
        raise ConfigError(f"profile file {path} not found", hint="check the path or the name")
    return path


def load(ref: str, base: Path | None = None) -> Profile:
    path = locate(ref, base)
    merged = _load_file(path, ())
    return _finish(Path(ref).stem if "/" in ref else ref.removesuffix(".toml"), merged)


@dataclass
class _Merged:
    files: list[str]
    tables: dict[str, dict[str, Any]]
    origins: dict[str, str]


def _load_file(path: Path, chain: tuple[Path, ...]) -> _Merged:
    real = path.resolve()
    if real in chain:
        cycle = " → ".join(p.name for p in (*chain, real))
        raise ConfigError(f"include cycle: {cycle}", hint="remove one of the includes")
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    own = _check_tables(path, text, data)
    base = _Merged([], {s: {} for s in SECTIONS}, {})
    for ref in own["profile"].get("include", []):
        sibling = _load_file(locate(ref, path.parent), (*chain, real))
        _merge_included(base, sibling, own, path)
    base.files.append(str(path))
    _overlay(base, own, path, text)
    return base


def _check_tables(path: Path, text: str, data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    for key, value in data.items():
        if key not in SECTIONS:
            raise ConfigError(
                f"{_at(path, text, '', key)}: unknown table [{key}]" + did_you_mean(key, SECTIONS),
                hint=f"a profile has the tables {', '.join(SECTIONS)}",
            )
        if not isinstance(value, dict):
            raise ConfigError(f"{_at(path, text, '', key)}: {key} must be a table, [{key}]")
    typed = {"profile": Header, "launch": Launch, "unit": UnitSettings, "expect": Expect}
    for section, cls in typed.items():
        names = [f.name for f in dataclasses.fields(cls)]
        for key in data.get(section, {}):
            if key not in names:
                raise ConfigError(
                    f"{_at(path, text, section, key)}: unknown key {key!r} in [{section}]"
                    + did_you_mean(key, names),
                    hint="see docs/profiles.md for every key",
                )
    tables = {s: dict(data.get(s, {})) for s in SECTIONS}
    for name, value in tables["env"].items():
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ConfigError(
                f'{_at(path, text, "env", name)}: [env] {name} must be a string, e.g. {name} = "1"'
            )
        tables["env"][name] = str(value)
    for name, value in tables["params"].items():
        if not isinstance(value, str):
            raise ConfigError(
                f"{_at(path, text, 'params', name)}: [params] {name} must be a string"
            )
    for name, value in list(tables["args"].items()):
        tables["args"][name] = _arg_value(path, text, name, value)
    return tables


def _arg_value(path: Path, text: str, name: str, value: Any) -> Any:
    where = _at(path, text, "args", name)
    if name.startswith("-"):
        raise ConfigError(
            f"{where}: write the argument without dashes: {name.lstrip('-')} = …",
            hint="[args] keys are option names; servegate adds the --",
        )
    if isinstance(value, str) and value.lstrip().startswith("{") and not PLACEHOLDER.match(value):
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise ConfigError(
                f"{where}: --{name} is not valid JSON: {exc}",
                hint="check the quotes and commas, or write it as an inline table",
            ) from None
        return parsed
    if isinstance(value, list) and not all(isinstance(v, str | int | float) for v in value):
        raise ConfigError(f"{where}: --{name}: a list holds strings or numbers")
    return value


def _merge_included(
    base: _Merged, sibling: _Merged, own: dict[str, dict[str, Any]], path: Path
) -> None:
    """Merge one included file into what earlier includes gave; conflicts need a decision."""
    for section in ("env", "args"):
        for key, value in sibling.tables[section].items():
            ours = base.tables[section].get(key, _MISSING)
            decided = key in own[section]
            if ours is not _MISSING and ours != value and not decided:
                first = base.origins.get(f"{section}.{key}", "an earlier include")
                second = sibling.origins.get(f"{section}.{key}", sibling.files[-1])
                raise ConfigError(
                    f"{path}: {section} {key} is set twice with different values: "
                    f"{_shown(section, key, ours)} ({first}) and {_shown(section, key, value)} "
                    f"({second})",
                    hint=f"set {key} in [{section}] of {path.name} to say which value holds",
                )
    for section in SECTIONS:
        base.tables[section].update(sibling.tables[section])
    base.origins.update(sibling.origins)
    base.files.extend(f for f in sibling.files if f not in base.files)


_MISSING = object()


def _overlay(base: _Merged, own: dict[str, dict[str, Any]], path: Path, text: str) -> None:
    for section in SECTIONS:
        for key, value in own[section].items():
            if section == "profile" and key == "include":
                continue
            target = base.tables[section]
            if section == "args" and value is False:
                target.pop(key, None)
            elif section == "args" and isinstance(value, dict):
                prior = target.get(key)
                target[key] = _deep_merge(prior, value) if isinstance(prior, dict) else value
            else:
                target[key] = value
            if section in ("env", "args"):
                base.origins[f"{section}.{key}"] = _at(path, text, section, key)


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        prior = out.get(key)
        out[key] = (
            _deep_merge(prior, value)
            if isinstance(prior, dict) and isinstance(value, dict)
            else value
        )
    return out


def _finish(name: str, merged: _Merged) -> Profile:
    t = merged.tables
    header = _typed(Header, t["profile"], merged.files[-1])
    if header.engine not in get_args(Engine):
        names = " or ".join(repr(e) for e in get_args(Engine))
        raise ConfigError(f"{merged.files[-1]}: [profile] engine must be {names}")
    launch = _typed(Launch, t["launch"], merged.files[-1])
    if bool(launch.module) == bool(launch.executable):
        raise ConfigError(
            f"{merged.files[-1]}: [launch] needs either module (with interpreter) or executable",
            hint='e.g. interpreter = "{runtime}/.venv/bin/python" and '
            'module = "vllm.entrypoints.openai.api_server"',
        )
    if launch.module and not launch.interpreter:
        raise ConfigError(f"{merged.files[-1]}: [launch] module needs an interpreter")
    return Profile(
        name=name,
        files=tuple(merged.files),
        header=header,
        params=dict(t["params"]),
        launch=launch,
        env=dict(t["env"]),
        args=dict(t["args"]),
        unit=_typed(UnitSettings, t["unit"], merged.files[-1]),
        expect=_typed(Expect, t["expect"], merged.files[-1]),
        origins=dict(merged.origins),
    )


def _typed(cls: type[T], values: Mapping[str, Any], where: str) -> T:
    kwargs: dict[str, Any] = {}
    for fld in dataclasses.fields(cls):  # type: ignore[arg-type]
        if fld.name not in values:
            continue
        value = values[fld.name]
        default = getattr(cls(), fld.name)
        if isinstance(default, tuple):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}: {fld.name} must be a list of strings")
            value = tuple(value)
        elif isinstance(default, bool) or type(value) is not type(default):
            if not (isinstance(default, str) and isinstance(value, int)):
                kind = type(default).__name__
                raise ConfigError(f"{where}: {fld.name} must be of type {kind}, not {value!r}")
            value = str(value)
        kwargs[fld.name] = value
    return cls(**kwargs)


# -- resolving ----------------------------------------------------------------------------


def resolve(
    profile: Profile,
    params: Mapping[str, str],
    builtins: Mapping[str, str],
    *,
    strict: bool = True,
) -> Resolved:
    """Fill every ``{name}``; ``strict``: an unknown or missing name is an error."""
    unknown = sorted(set(params) - set(profile.params))
    if unknown:
        raise ConfigError(
            f"profile {profile.name} has no parameter {unknown[0]!r}"
            + did_you_mean(unknown[0], profile.params),
            hint=f"its parameters: {', '.join(sorted(profile.params)) or 'none'}",
        )
    missing = [p for p in profile.header.required if not params.get(p)]
    if missing and strict:
        raise ConfigError(
            f"profile {profile.name} needs the parameter(s) {', '.join(missing)}",
            hint="set them in [service.params] (or pass --param NAME=VALUE to render/lint)",
        )
    places = dict(builtins)
    values = {**profile.params, **params}
    places.update({k: _fill(v, places) for k, v in values.items() if k not in missing})
    left: set[str] = set()

    def fill(value: str, where: str) -> str:
        out = _fill(value, places)
        names = [n for n in PLACEHOLDER.findall(out) if n not in places]
        if names and strict:
            raise ConfigError(
                f"{where}: unknown placeholder {{{names[0]}}}" + did_you_mean(names[0], places),
                hint=f"known: {', '.join('{' + p + '}' for p in sorted(places))}",
            )
        left.update(names)
        return out

    env = {k: fill(v, profile.where(f"env.{k}")) for k, v in profile.env.items()}
    args = {
        k: _fill_tree(v, _filler(fill, profile.where(f"args.{k}"))) for k, v in profile.args.items()
    }
    launch = profile.launch
    head = (
        [fill(launch.interpreter, "[launch] interpreter"), "-m", launch.module]
        if launch.module
        else [fill(launch.executable, "[launch] executable")]
    )
    head += [fill(p, "[launch] positional") for p in launch.positional]
    argv = tuple(head + args_to_argv(args))
    cwd = fill(launch.cwd, "[launch] cwd")
    return Resolved(profile, argv, env, cwd, args, tuple(sorted(left | set(missing))))


def args_to_argv(args: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for name, value in args.items():
        flag = f"--{name}"
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, dict):
            out += [flag, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, list):
            out += [flag, *(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def _filler(fill: Callable[[str, str], str], where: str) -> Callable[[str], str]:
    return lambda value: fill(value, where)


def _fill(value: str, places: Mapping[str, str]) -> str:
    return PLACEHOLDER.sub(lambda m: places.get(m.group(1), m.group(0)), value)


def _fill_tree(value: Any, fill: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fill(value)
    if isinstance(value, list):
        return [_fill_tree(v, fill) for v in value]
    if isinstance(value, dict):
        return {k: _fill_tree(v, fill) for k, v in value.items()}
    return value


# -- where in the file --------------------------------------------------------------------

_HEADER = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")
_KEY = re.compile(r"""^\s*(["']?)([^"'=\s]+)\1\s*=""")


@functools.lru_cache(maxsize=64)
def _index(text: str) -> dict[tuple[str, str], int]:
    """(section, key) → line number, for every ``key =`` line and ``[table]`` header."""
    out: dict[tuple[str, str], int] = {}
    current = ""
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            current = header.group(1).strip()
            out.setdefault(("", current), number)
            continue
        key = _KEY.match(line)
        if key:
            out.setdefault((current, key.group(2)), number)
    return out


def line_of(text: str, section: str, key: str) -> int:
    """The line ``key = …`` of ``[section]`` (0 if not found; "" is the top level)."""
    return _index(text).get((section, key), 0)


def _at(path: Path, text: str, section: str, key: str) -> str:
    number = line_of(text, section, key)
    return f"{path}:{number}" if number else str(path)


def _shown(section: str, key: str, value: object) -> str:
    """An env value in a message only when its name may be shown; other sections as is."""
    return redact.quoted(key, value) if section == "env" else repr(value)
