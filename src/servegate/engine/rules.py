"""Rules as data: lint rules over a launch, and log rules over the server's output.

A rule file holds ``[[lint]]`` and ``[[log]]`` tables. Both have an ``id``, a
``severity``, a ``message`` and a ``remedy``; ``when`` is a list of conditions on the
launch, all of which must hold. A condition names a ``path`` (or several ``paths``, any
of which may match) into the launch's facts:

``env.NAME``, ``args.NAME`` (``args.compilation-config.mode`` reaches into JSON),
``unit.restart``, ``expect.kv_cache_bytes``, ``engine``, ``profile``

and one test: ``equals``, ``not_equals``, ``in``, ``not_in``, ``matches`` (a regular
expression), ``present`` (true/false), ``above`` (a number), ``above_path`` or
``differs_path`` (another path; only when that path has a value). ``not_equals`` and
``not_in`` also hold when the path has no value. A lint rule may instead name a built-in
``check`` (``capture-sizes``, ``tunableop-rocblas``, ``unknown-vllm-env``).

A log rule has a ``pattern`` (a line that must not appear) or ``require`` (a line that
must appear by the end of start-up); ``severity = "fact"`` with ``fact = "name"`` records
the pattern's first group instead. ``phases`` says where it applies: ``startup``,
``window`` (a measured bench request).

Shipped rules live in ``servegate/engine/rules/*.toml``; a team adds its own files with
``[lint] rules``, replaces a shipped rule by reusing its id, and turns rules off or
changes their severity with ``[lint] disable`` / ``[lint] severity``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from servegate.errors import ConfigError, did_you_mean
from servegate.pipeline import redact

SEVERITIES = ("fail", "warn", "fact")
TESTS = (
    "equals",
    "not_equals",
    "in",
    "not_in",
    "matches",
    "present",
    "above",
    "above_path",
    "differs_path",
)
MISSING: Any = object()
REFERENCE = re.compile(r"\{([a-z][\w\-]*(?:\.[\w\-]+)+)\}")


@dataclass(frozen=True)
class Condition:
    paths: tuple[str, ...]
    test: str
    operand: Any

    def holds(self, facts: Mapping[str, Any]) -> bool:
        return any(self._holds(lookup(facts, p), facts) for p in self.paths)

    def _holds(self, value: Any, facts: Mapping[str, Any]) -> bool:
        t, op = self.test, self.operand
        if t == "present":
            return (value is not MISSING) == bool(op)
        if t == "not_equals":
            return value is MISSING or not same(value, op)
        if t == "not_in":
            return value is MISSING or not any(same(value, o) for o in op)
        if value is MISSING:
            return False
        if t == "equals":
            return same(value, op)
        if t == "in":
            return any(same(value, o) for o in op)
        if t == "matches":
            return re.search(op, text(value)) is not None
        if t == "above":
            return _number(value) is not None and _number(value) > float(op)  # type: ignore[operator]
        other = lookup(facts, op)
        if other is MISSING:
            return False
        if t == "above_path":
            a, b = _number(value), _number(other)
            return a is not None and b is not None and b > 0 and a > b
        return not same(value, other)  # differs_path


@dataclass(frozen=True)
class Rule:
    id: str
    kind: str  # lint | log
    severity: str
    message: str
    remedy: str = ""
    when: tuple[Condition, ...] = ()
    check: str = ""
    pattern: str = ""
    require: str = ""
    fact: str = ""
    phases: tuple[str, ...] = ("startup", "window")
    source: str = ""

    def applies(self, facts: Mapping[str, Any]) -> bool:
        return all(c.holds(facts) for c in self.when)


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    message: str
    remedy: str = ""
    #: the log line, or where in the profile
    evidence: str = ""

    def as_dict(self) -> dict[str, str]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "message": self.message,
            "remedy": self.remedy,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    files: tuple[str, ...] = ()

    def of(self, kind: str) -> list[Rule]:
        return [r for r in self.rules if r.kind == kind]


# -- facts --------------------------------------------------------------------------------


def lookup(facts: Mapping[str, Any], path: str) -> Any:
    node: Any = facts
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


def same(a: Any, b: Any) -> bool:
    na, nb = _number(a), _number(b)
    if na is not None and nb is not None:
        return na == nb
    return text(a) == text(b)


def text(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def describe(template: str, facts: Mapping[str, Any]) -> str:
    """``{args.max-num-seqs}`` in a message → the launch's value (an environment value only
    when its name may be shown: a finding lands in the record)."""

    def sub(m: re.Match[str]) -> str:
        path = m.group(1)
        value = lookup(facts, path)
        if value is MISSING:
            return "(unset)"
        name = path.split(".", 1)[-1]
        if (path.startswith("env.") and not redact.shown(name)) or redact.is_secret(name):
            return "(not shown)"
        return text(value)

    return REFERENCE.sub(sub, template)


# -- loading ------------------------------------------------------------------------------


def shipped_files() -> list[Path]:
    base = Path(str(resources.files("servegate.engine").joinpath("rules")))
    return sorted(base.glob("*.toml"))


def load(
    extra: Iterable[Path] = (),
    disable: Iterable[str] = (),
    severity: Mapping[str, str] | None = None,
) -> RuleSet:
    """Shipped rules, then the team's files (same id: replaced), minus ``disable``."""
    by_id: dict[str, Rule] = {}
    files = [*shipped_files(), *extra]
    for path in files:
        for rule in load_file(path):
            by_id[rule.id] = rule
    changes = dict(severity or {})
    for rid in [*disable, *changes]:
        if rid not in by_id:
            raise ConfigError(
                f"[lint] names rule {rid!r}, which no rule file defines" + did_you_mean(rid, by_id),
                hint="`servegate lint --rules` lists every rule id",
            )
    for rid, sev in changes.items():
        if sev not in SEVERITIES:
            raise ConfigError(f"[lint] severity of {rid}: {sev!r} is not one of {SEVERITIES}")
        by_id[rid] = dataclasses.replace(by_id[rid], severity=sev)
    gone = set(disable)
    kept = tuple(r for r in by_id.values() if r.id not in gone)
    return RuleSet(kept, tuple(str(p) for p in files))


def load_file(path: Path) -> list[Rule]:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"rule file {path} not found", hint="check [lint] rules") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = set(data) - {"lint", "log"}
    if unknown:
        raise ConfigError(f"{path}: unknown table {sorted(unknown)[0]!r}; use [[lint]] or [[log]]")
    out: list[Rule] = []
    for kind in ("lint", "log"):
        for i, table in enumerate(data.get(kind, [])):
            out.append(_rule(kind, table, f"{path} [[{kind}]] #{i + 1}"))
    return out


_RULE_KEYS = {
    "lint": {"id", "severity", "message", "remedy", "when", "check"},
    "log": {"id", "severity", "message", "remedy", "when", "pattern", "require", "fact", "phases"},
}


def _rule(kind: str, table: dict[str, Any], where: str) -> Rule:
    for key in table:
        if key not in _RULE_KEYS[kind]:
            raise ConfigError(
                f"{where}: unknown key {key!r}" + did_you_mean(key, _RULE_KEYS[kind]),
                hint="docs/profiles.md lists the keys of lint and log rules",
            )
    for key in ("id", "severity", "message"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise ConfigError(f"{where}: {key} is required (a string)")
    where = f"{where} ({table['id']})"
    if table["severity"] not in SEVERITIES:
        raise ConfigError(f"{where}: severity must be one of {', '.join(SEVERITIES)}")
    when = tuple(_condition(c, where) for c in table.get("when", []))
    rule = Rule(
        id=table["id"],
        kind=kind,
        severity=table["severity"],
        message=table["message"],
        remedy=table.get("remedy", ""),
        when=when,
        check=table.get("check", ""),
        pattern=table.get("pattern", ""),
        require=table.get("require", ""),
        fact=table.get("fact", ""),
        phases=tuple(table.get("phases", ("startup", "window"))),
        source=where,
    )
    _check_rule(rule, where)
    return rule


def _check_rule(rule: Rule, where: str) -> None:
    if rule.kind == "lint":
        if rule.check and rule.check not in CHECKS:
            raise ConfigError(
                f"{where}: no built-in check {rule.check!r}" + did_you_mean(rule.check, CHECKS),
                hint=f"built-in checks: {', '.join(sorted(CHECKS))}",
            )
        if not rule.check and not rule.when:
            raise ConfigError(f"{where}: a lint rule needs when = [...] or a check")
        return
    if bool(rule.pattern) == bool(rule.require):
        raise ConfigError(f"{where}: a log rule needs either pattern or require")
    if (rule.severity == "fact") != bool(rule.fact):
        raise ConfigError(f"{where}: a fact rule has severity 'fact' and a fact name")
    for phase in rule.phases:
        if phase not in ("startup", "window"):
            raise ConfigError(f"{where}: phases are 'startup' and 'window', not {phase!r}")
    try:
        re.compile(rule.pattern)
    except re.error as exc:
        raise ConfigError(f"{where}: pattern {rule.pattern!r}: {exc}") from None


def _condition(table: Any, where: str) -> Condition:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: each when entry is a table, e.g. {{ path = ..., equals = 1 }}")
    paths = table.get("paths") or ([table["path"]] if "path" in table else [])
    tests = [k for k in table if k not in ("path", "paths")]
    if not paths or len(tests) != 1 or tests[0] not in TESTS:
        raise ConfigError(
            f"{where}: a condition has path (or paths) and one test of {', '.join(TESTS)}",
            hint=f"got {table!r}",
        )
    test, operand = tests[0], table[tests[0]]
    if test in ("in", "not_in") and not isinstance(operand, list):
        raise ConfigError(f"{where}: {test} takes a list")
    if test == "matches":
        try:
            re.compile(operand)
        except re.error as exc:
            raise ConfigError(f"{where}: matches {operand!r}: {exc}") from None
    return Condition(tuple(paths), test, operand)


# -- built-in lint checks -----------------------------------------------------------------

#: a check gets the facts and a context; returns (message detail, severity override or "")
Check = Callable[[Mapping[str, Any], "CheckContext"], list[tuple[str, str]]]


@dataclass
class CheckContext:
    #: VLLM_* names vLLM knows, and where that list came from
    known_env: frozenset[str] = frozenset()
    known_source: str = ""
    known_installed: bool = False
    #: file paths the TunableOp check may hash
    rocblas_candidates: list[Path] = field(default_factory=list)


def check_capture_sizes(facts: Mapping[str, Any], ctx: CheckContext) -> list[tuple[str, str]]:
    cc = lookup(facts, "args.compilation-config")
    if not isinstance(cc, Mapping) or lookup(facts, "args.enforce-eager") is True:
        return []
    mode = text(cc.get("cudagraph_mode", "")).upper()
    sizes = cc.get("cudagraph_capture_sizes")
    if mode in ("", "NONE") or not sizes:
        return []
    spec = lookup(facts, "args.speculative-config")
    drafts = int(spec.get("num_speculative_tokens", 0)) if isinstance(spec, Mapping) else 0
    per_request = drafts + 1
    seqs_value = lookup(facts, "args.max-num-seqs")
    seqs = int(_number(seqs_value) or 256) if seqs_value is not MISSING else 256
    needed = [per_request * n for n in range(1, seqs + 1)]
    sizes_n = sorted(int(s) for s in sizes)
    missing = [t for t in needed if not any(s >= t and s % per_request == 0 for s in sizes_n)]
    if not missing:
        return []
    shown = ", ".join(str(m) for m in missing[:8]) + (" …" if len(missing) > 8 else "")
    why = f"{per_request} token(s) per request x 1..{seqs} requests"
    if seqs_value is MISSING:
        why += " (max-num-seqs unset: vLLM's default 256)"
    return [(f"capture sizes {sizes_n} leave {shown} tokens without a graph ({why})", "")]


TUNABLE_SUFFIX = re.compile(r"-([0-9a-f]{12})$")


def check_tunableop_rocblas(facts: Mapping[str, Any], ctx: CheckContext) -> list[tuple[str, str]]:
    if not same(lookup(facts, "env.PYTORCH_TUNABLEOP_ENABLED"), "1"):
        return []
    filename = lookup(facts, "env.PYTORCH_TUNABLEOP_FILENAME")
    if filename is MISSING:
        return [("TunableOp is enabled without PYTORCH_TUNABLEOP_FILENAME", "")]
    folder = Path(str(filename)).parent.name
    suffix = TUNABLE_SUFFIX.search(folder)
    if suffix is None:
        return [(f"the TunableOp directory {folder!r} has no -<12 hex of rocBLAS> suffix", "")]
    library = next((p for p in ctx.rocblas_candidates if p.is_file()), None)
    if library is None:
        return [
            (
                "cannot verify the TunableOp table: no librocblas.so on the profile's "
                "LD_LIBRARY_PATH, expect.rocblas_library or /opt/rocm*/lib",
                "warn",
            )
        ]
    digest = hashlib.sha256(library.resolve().read_bytes()).hexdigest()
    if digest[:12] != suffix.group(1):
        return [
            (
                f"the TunableOp table is for rocBLAS {suffix.group(1)}, but "
                f"{library.resolve()} has SHA-256 {digest[:12]}…",
                "",
            )
        ]
    return []


def check_unknown_vllm_env(facts: Mapping[str, Any], ctx: CheckContext) -> list[tuple[str, str]]:
    env = lookup(facts, "env")
    expect = lookup(facts, "expect")
    declared = set(expect.get("engine_env", ())) if isinstance(expect, Mapping) else set()
    known = ctx.known_env | declared
    unknown = sorted(k for k in env if k.startswith("VLLM_") and k not in known)
    severity = "" if ctx.known_installed else "warn"
    out = []
    for name in unknown:
        hint = did_you_mean(name, known)
        out.append((f"{name} is not a variable {ctx.known_source} reads{hint}", severity))
    return out


CHECKS: dict[str, Check] = {
    "capture-sizes": check_capture_sizes,
    "tunableop-rocblas": check_tunableop_rocblas,
    "unknown-vllm-env": check_unknown_vllm_env,
}


def lint(rules: RuleSet, facts: Mapping[str, Any], ctx: CheckContext) -> list[Finding]:
    findings: list[Finding] = []
    for rule in rules.of("lint"):
        if not rule.applies(facts):
            continue
        message = describe(rule.message, facts)
        remedy = describe(rule.remedy, facts)
        if not rule.check:
            findings.append(Finding(rule.id, rule.severity, message, remedy))
            continue
        for detail, severity in CHECKS[rule.check](facts, ctx):
            findings.append(
                Finding(rule.id, severity or rule.severity, f"{message}: {detail}", remedy)
            )
    return findings
