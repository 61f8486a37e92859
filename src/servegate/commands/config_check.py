from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

from servegate import envfile, hostpaths
from servegate.commands import args as common_args
from servegate.commands import config_box
from servegate.config import Config
from servegate.engine import lint as lint_mod
from servegate.engine import managers
from servegate.engine.launch import ENV_REF, launch_spec
from servegate.engine.lint import ruleset
from servegate.errors import ConfigError, ServegateError
from servegate.output import Output
from servegate.release import bench_gate
from servegate.release.gate import build_checks


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "items"):
        return dict(value.items())
    return value


def _all_of(failed: list[ServegateError]) -> ServegateError:
    """The first failure a promote would meet (its class, its exit code), saying the
    others too: a new box's problems are fixed in one round, not one a run."""
    first, rest = failed[0], failed[1:]
    if not rest:
        return first
    others = "\n".join(f"  also ({e.exit_code}): {e}" for e in rest)
    hints = "; ".join(dict.fromkeys(e.hint for e in failed if e.hint))
    return type(first)(f"{first}\n{others}", hint=hints)


def run(cfg: Config, out: Output, offline: bool = False) -> int:
    checks = [c.name for c in build_checks(cfg)]
    # the launch resolves (profile, includes, parameters, placeholders) and the rules load
    spec = launch_spec(cfg, hostpaths.of(cfg).current, "0" * 40)
    rules = ruleset(cfg)
    warnings, planned = bench_gate.noise_check(cfg) if "bench" in checks else ([], "")
    # the secrets file is checked (owner, mode, format); references it and the
    # environment leave unfilled would stop a promote (exit 2) before the service is touched
    environ = envfile.environ_with(cfg.service.env_file, os.environ)
    for key, raw in spec.env.items():
        for name in ENV_REF.findall(raw):
            if name not in environ:
                warnings.append(
                    f"the service environment's {key} refers to ${{{name}}}, set neither in "
                    + (f"{cfg.service.env_file} nor " if cfg.service.env_file else "")
                    + "this environment: a promote run here would stop (exit 2)"
                )
    try:
        filled = spec.expanded(environ)
    except ConfigError:  # an unfilled reference: warned of above
        filled = None
    if filled is not None:  # what promote checks before the switch (exit 2)
        managers.refuse(managers.make_manager(cfg), filled)
    # the lint rules, as promote's lint stage runs them before the switch (exit 15)
    cache = hostpaths.of(cfg).cache
    with tempfile.TemporaryDirectory(prefix="servegate-check-") as spare:
        findings = lint_mod.lint(
            filled or spec, rules, cache if cache.parent.is_dir() else Path(spare)
        )
    failed: list[ServegateError] = []
    warnings += [
        f"lint {f.severity}: {f.rule}: {f.message}" for f in findings if f.severity == "warn"
    ]
    # what this box shows before any promote: port, remote, build, program, engine, model
    box = config_box.check(cfg, filled or spec, offline, failed)
    if planned:
        box.append(planned)
    box += _signing_and_gpus(cfg, failed)
    if any(f.severity == "fail" for f in findings):  # promote lints after its build
        where = f"profile {spec.profile}" if spec.profile else "service.command"
        failed.insert(len([e for e in failed if e.exit_code != 7]),
                      lint_mod.failure(findings, where))  # fmt: skip
    if failed:
        raise _all_of(failed)
    if out.json_mode:
        return out.emit({**_plain(cfg), "warnings": warnings, "box": box})
    out.line(f"{cfg.path}: OK")
    out.line(f"  stack    {cfg.stack.remote} ({cfg.stack.branch})")
    out.line(f"  host     {cfg.host.root} ({cfg.host.strategy}, keep {cfg.host.keep_releases})")
    out.line(f"  service  {cfg.service.unit} via {cfg.service.manager} on port {cfg.service.port}")
    launch = f"profile {spec.profile}" if spec.profile else "service.command"
    out.line(f"  launch   {launch}: {spec.argv[0]} … ({len(spec.argv)} words, {len(spec.env)} env)")
    out.line(f"  rules    {len(rules.of('lint'))} lint, {len(rules.of('log'))} log")
    out.line(f"  gate     {', '.join(checks)}")
    for line in box:
        out.line(f"  box      {line}")
    for warning in warnings:
        out.err.print(f"warning: {warning}", markup=False)
    return 0


def _signing_and_gpus(cfg: Config, failed: list[ServegateError]) -> list[str]:
    """What a promote checks before it changes anything: the signing key (exit 2) and the
    GPUs' health (exit 23), where the config asks for them."""
    from servegate.gpu import health
    from servegate.release import attest
    from servegate.release.record import host_id

    said: list[str] = []
    try:
        signer = attest.signer_of(cfg, host_id(cfg))
    except ServegateError as exc:
        failed.append(exc)
    else:
        said.append(
            f"attestations signed by {signer.principal} ({signer.public_key.keyid})"
            if signer else "attestations unsigned (attest.key is not set)"
        )  # fmt: skip
    snap = health.for_release(cfg, os.environ)
    if snap is None:
        why = 'gpu.check = "off"' if cfg.gpu.check == "off" else "no nvidia-smi or amd-smi here"
        said.append(f"GPU health not checked ({why})")
    elif snap.healthy:
        said.append(f"GPUs {snap.summary()}")
    else:
        from servegate.commands.gpu import failure

        failed.append(failure(snap))
    return said


def add_arguments(p: argparse.ArgumentParser) -> None:
    common_args.common(p)
    p.add_argument(
        "--offline", action="store_true", help="skip what needs the network (the remote)"
    )


def main(args: argparse.Namespace, out: Output) -> int:
    from servegate import config as config_mod

    return run(config_mod.load(args.config, os.environ), out, args.offline)
