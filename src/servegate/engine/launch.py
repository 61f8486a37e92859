"""The exact command and environment a release is launched with.

It comes from the service's launch profile (``service.profile``, see
:mod:`servegate.engine.profiles`) or from ``service.command``/``service.env``; either
way servegate keys the compile caches per compilation config and release
(:func:`keyed_caches`), so a changed config never reuses a stale graph.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from servegate import hostpaths
from servegate.config import Config, fill
from servegate.engine import adapters, profiles
from servegate.engine.adapters import Engine
from servegate.engine.profiles import Expect, UnitSettings
from servegate.errors import ConfigError
from servegate.pipeline import redact

#: ``${NAME}`` in an environment value: filled from servegate's environment at launch
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

#: a name the environment of a process can carry and every unit format can write
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: C0 controls and DEL: a newline in a unit or program file starts a new directive
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

#: compile caches servegate keys per compilation config and release → directory name
COMPILE_CACHES = {
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
    "VLLM_CACHE_ROOT": "vllm",
}


def _control(value: str) -> str:
    """The first control character of ``value`` named (U+000A, a newline), or ""."""
    found = CONTROL.search(value)
    if found is None:
        return ""
    code = ord(found.group())
    names = {0x0A: "a newline", 0x0D: "a carriage return", 0x00: "a NUL"}
    return f"U+{code:04X}" + (f", {names[code]}" if code in names else "")


def unsafe(spec: LaunchSpec) -> list[str]:
    """What in the launch no unit or program file can carry exactly, said without the
    value (it may be a secret): a control character in an argument, an environment
    value (``${NAME}`` filled from servegate's own environment included: a secret with
    a trailing newline) or the working directory, and an environment name a process
    environment or a unit cannot hold. A newline in a systemd unit or a supervisord
    program file starts a directive of its own."""
    problems = []
    for i, arg in enumerate(spec.argv):
        if what := _control(arg):
            problems.append(f"argument {i} of the command holds a control character ({what})")
    for name, value in spec.env.items():
        if not ENV_NAME.match(name):
            problems.append(
                f"environment name {name!r} is not a valid name (letters, digits and _, "
                "not starting with a digit)"
            )
        elif what := _control(value):
            source = (
                " (filled from ${...} in servegate's environment)"
                if (name in spec.filled_names)
                else ""
            )
            problems.append(f"the value of {name}{source} holds a control character ({what})")
    if what := _control(str(spec.cwd)):
        problems.append(f"the working directory holds a control character ({what})")
    return problems


@dataclass(frozen=True)
class LaunchSpec:
    """argv + environment + working directory of one release's server, and its unit."""

    unit: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    sha: str
    limits: UnitSettings = field(default_factory=UnitSettings)
    engine: str = "vllm"
    #: the launch profile's name ("" for ``service.command``)
    profile: str = ""
    expect: Expect = field(default_factory=Expect)
    #: the ``--options`` as values (JSON arguments as objects)
    args: Mapping[str, Any] = field(default_factory=dict)
    #: the compile-cache key (empty: caches not keyed)
    cache_key: str = ""
    #: placeholders or parameters left unfilled (only with ``strict=False``)
    unresolved: tuple[str, ...] = ()
    #: environment names whose value was filled from ``${NAME}``: secret whatever the
    #: name (records hide them, texts are scrubbed of them)
    filled_names: frozenset[str] = frozenset()
    #: the values ``${NAME}`` references were filled with
    filled_values: frozenset[str] = field(default=frozenset(), repr=False)

    def expanded(self, environ: Mapping[str, str]) -> LaunchSpec:
        """``${NAME}`` in the environment's values filled from servegate's own environment,
        so a secret need not be written in servegate.toml (nor in a profile)."""
        env = {}
        names: set[str] = set()
        values: set[str] = set()
        for key, raw in self.env.items():
            missing = [n for n in ENV_REF.findall(raw) if n not in environ]
            if missing:
                raise ConfigError(
                    f"the service environment's {key} refers to ${{{missing[0]}}}, which is not "
                    "set in servegate's environment",
                    hint=f"export {missing[0]} where servegate runs (the CI job's secrets, or "
                    "the runner's environment file)",
                )
            env[key] = ENV_REF.sub(lambda m: environ[m.group(1)], raw)
            if env[key] != raw or ENV_REF.search(raw):
                names.add(key)
                values |= {environ[n] for n in ENV_REF.findall(raw)}
        return replace(
            self,
            env=env,
            filled_names=self.filled_names | names,
            filled_values=self.filled_values | values,
        )

    def secrets(self) -> set[str]:
        """Every secret value of this launch (:func:`redact.secrets_of`)."""
        return redact.secrets_of(self.env, self.argv, self.filled_names) | redact.plain_dropped(
            self.filled_values
        )

    def redacted(self, salt: str = "") -> dict[str, Any]:
        """argv and environment as a record may hold them (:mod:`servegate.pipeline.redact`)."""
        out: dict[str, Any] = {
            "argv": redact.argv(self.argv, salt),
            "env": redact.env(self.env, salt, self.filled_names),
            "cwd": str(self.cwd),
        }
        if self.profile:
            out["profile"] = self.profile
        if self.cache_key:
            out["compile_cache_key"] = self.cache_key
        return out

    def stored(self) -> dict[str, Any]:
        """The launch whole, values in clear: what a rollback installs again. Kept on the
        host beside the unit it was installed as (0600), never in a record."""
        doc = dataclasses.asdict(self)
        doc.update(
            cwd=str(self.cwd),
            filled_names=sorted(self.filled_names),
            filled_values=sorted(self.filled_values),
        )
        return doc

    @classmethod
    def from_stored(cls, doc: Mapping[str, Any]) -> LaunchSpec:
        """:meth:`stored` read back (KeyError, TypeError or ValueError when it is not)."""

        def tuples(d: Mapping[str, Any]) -> dict[str, Any]:
            return {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}

        return cls(
            unit=str(doc["unit"]),
            argv=tuple(str(a) for a in doc["argv"]),
            env={str(k): str(v) for k, v in doc["env"].items()},
            cwd=Path(doc["cwd"]),
            sha=str(doc["sha"]),
            limits=UnitSettings(**doc["limits"]),
            engine=str(doc["engine"]),
            profile=str(doc["profile"]),
            expect=Expect(**tuples(doc["expect"])),
            args=dict(doc["args"]),
            cache_key=str(doc["cache_key"]),
            unresolved=tuple(doc["unresolved"]),
            filled_names=frozenset(doc["filled_names"]),
            filled_values=frozenset(doc["filled_values"]),
        )


def placeholders(cfg: Config, release_dir: Path, sha: str) -> dict[str, str]:
    return {
        "release": str(release_dir),
        "port": str(cfg.service.port),
        "sha": sha,
        "short": sha[:12],
        "host_root": str(cfg.host_root),
    }


def parse_options(argv: tuple[str, ...]) -> dict[str, Any]:
    """``--name value…`` → {name: value}: no value → True, one → the string (a JSON
    object parsed), several → a list. Everything before the first option is skipped."""
    out: dict[str, Any] = {}
    name = ""
    values: list[str] = []

    def flush() -> None:
        if not name:
            return
        if not values:
            out[name] = True
        elif len(values) == 1:
            out[name] = _maybe_json(values[0])
        else:
            out[name] = list(values)

    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            flush()
            name, _, inline = arg[2:].partition("=")
            values = [inline] if inline else []
        elif name:
            values.append(arg)
    flush()
    return out


def _maybe_json(value: str) -> Any:
    if value.startswith("{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def load_profile(cfg: Config) -> profiles.Profile:
    base = Path(cfg.path).parent if cfg.path and not cfg.path.startswith("<") else None
    return profiles.load(cfg.service.profile, base)


def engine_of(cfg: Config) -> Engine:
    """The adapter of the configured service's engine (its profile's, or service.engine)."""
    name = load_profile(cfg).header.engine if cfg.service.profile else cfg.service.engine
    return adapters.by_name(name)


def launch_spec(cfg: Config, release_dir: Path, sha: str, *, strict: bool = True) -> LaunchSpec:
    """What ``sha`` in ``release_dir`` is started with; ``strict=False`` (render) leaves
    unknown placeholders and missing parameters in place instead of failing."""
    places = placeholders(cfg, release_dir, sha)
    svc = cfg.service
    if svc.profile:
        prof = load_profile(cfg)
        res = profiles.resolve(prof, svc.params, places, strict=strict)
        env = _merge_service_env(prof, res.env, {k: fill(v, **places) for k, v in svc.env.items()})
        spec = LaunchSpec(
            unit=svc.unit,
            argv=res.argv,
            env=env,
            cwd=Path(res.cwd),
            sha=sha,
            limits=prof.unit,
            engine=prof.header.engine,
            profile=prof.name,
            expect=prof.expect,
            args=res.args,
            unresolved=res.unresolved,
        )
    else:
        argv = tuple(fill(a, **places) for a in svc.command)
        spec = LaunchSpec(
            unit=svc.unit,
            argv=argv,
            env={k: fill(v, **places) for k, v in svc.env.items()},
            cwd=release_dir,
            sha=sha,
            limits=UnitSettings(
                memory_max=svc.memory_max,
                memory_swap_max=svc.memory_swap_max,
                start_limit_interval=svc.start_limit_interval,
                start_limit_burst=svc.start_limit_burst,
                timeout_stop=int(svc.stop_timeout),
            ),
            engine=svc.engine,
            args=parse_options(argv),
        )
    if svc.compile_cache and spec.engine == "vllm":
        return keyed_caches(spec, hostpaths.of(cfg).compile_cache)
    return spec


def _merge_service_env(
    prof: profiles.Profile, env: Mapping[str, str], extra: Mapping[str, str]
) -> dict[str, str]:
    merged = dict(env)
    for key, value in extra.items():
        if key in merged and merged[key] != value:
            raise ConfigError(
                f"{key} is set twice with different values: {redact.quoted(key, merged[key])} in "
                f"the profile ({prof.where('env.' + key)}) and {redact.quoted(key, value)} in "
                "[service.env]",
                hint=f"set {key} in one place: a profile that includes {prof.name}, "
                "or [service.env] after removing it from the profile",
            )
        merged[key] = value
    return merged


def cache_key(spec: LaunchSpec) -> str:
    """A fingerprint of the compilation config, the rest of the launch and the release."""
    parts = {
        "sha": spec.sha,
        "compilation-config": spec.args.get("compilation-config"),
        # secrets take no part in a compile and must not be guessable from a recorded key
        "argv": redact.argv(spec.argv, "", mask="<secret>"),
        "env": {
            k: v
            for k, v in sorted(spec.env.items())
            if k not in COMPILE_CACHES and not redact.is_secret(k) and k not in spec.filled_names
        },
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def keyed_caches(spec: LaunchSpec, default_root: Path) -> LaunchSpec:
    """Point the Inductor, Triton and vLLM caches at directories of this launch's key:
    the profile's own directory + ``/<key>``, or ``<host root>/compile-cache/<key>/…``.
    A rollback (same release, same launch) finds its warm cache again."""
    key = cache_key(spec)
    env = dict(spec.env)
    for name, sub in COMPILE_CACHES.items():
        base = spec.env.get(name)
        env[name] = f"{base.rstrip('/')}/{key}" if base else str(default_root / key / sub)
    return dataclasses.replace(spec, env=env, cache_key=key)


KEY_DIR = re.compile(r"^[0-9a-f]{16}$")


def stale_caches(bases: list[Path], keep: set[str]) -> list[Path]:
    """Keyed cache directories under ``bases`` whose key no kept release launches with
    (links are never followed nor listed)."""
    out: list[Path] = []
    for base in bases:
        if base.is_dir() and not base.is_symlink():
            out += [
                d
                for d in sorted(base.iterdir())
                if KEY_DIR.match(d.name)
                and d.name not in keep
                and d.is_dir()
                and not d.is_symlink()
            ]
    return out
