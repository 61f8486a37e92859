from __future__ import annotations

import argparse
from typing import Any

from servegate import documents, hostpaths
from servegate.commands import args as common_args
from servegate.config import Config
from servegate.engine import openai
from servegate.engine.launch import engine_of
from servegate.engine.managers import make_manager
from servegate.errors import RollbackFailed, ServegateError, ServiceFailed
from servegate.output import Output
from servegate.release.record import unpushed
from servegate.release.state import Entry, HostState


def _entry(e: Entry | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return {
        "sha": e.sha,
        "tag": e.tag,
        "at": e.at,
        "verdict": e.verdict,
        "release_dir": e.release_dir,
    }


def run(cfg: Config, out: Output) -> int:
    state = HostState.load(hostpaths.of(cfg).state)
    waiting = unpushed(cfg)
    manager = make_manager(cfg)
    svc = manager.state()
    endpoint = openai.Endpoint(
        f"http://{cfg.service.host}:{cfg.service.port}", engine=engine_of(cfg)
    )
    healthy, why = openai.health(endpoint)
    result = {
        "current": _entry(state.current),
        "previous": _entry(state.previous),
        "service": {
            "manager": manager.name,
            "unit": cfg.service.unit,
            "state": svc.raw,
            "pid": svc.pid,
            "healthy": healthy,
            "why_not": why,
        },
        "last_attempt": _entry(state.history[-1]) if state.history else None,
        "pending": documents.plain(state.pending),
        "unpushed": waiting,
    }
    problem = _problem(state, healthy, why, svc.pid)
    code = problem.exit_code if problem else 0
    if out.json_mode:
        return out.emit(result, code, problem)
    cur, prev = state.current, state.previous
    out.line(f"live release: {cur.sha if cur else '(none)'}  {cur.tag if cur else ''}")
    out.line(f"previous:     {prev.sha if prev else '(none)'}")
    out.line(
        f"service:      {cfg.service.unit} via {manager.name}: {svc.raw}, pid {svc.pid}, "
        + ("healthy" if healthy else f"NOT healthy ({why})")
    )
    last = state.history[-1] if state.history else None
    if last is not None and last.verdict == "failed":
        out.line(
            f"NO VERIFIED RELEASE SERVING: {last.sha[:12]} failed at {last.at} and its rollback "
            "failed too; `release recover` or `release rollback` puts a release back"
        )
    for ref in waiting:
        out.line(f"UNPUSHED:     {ref} (kept here; the next release command pushes it)")
    if state.pending:
        p = state.pending
        out.line(
            f"INTERRUPTED:  a {p.kind} of {p.sha[:12]} started "
            f"{p.at} stopped after the switch; the next promote or rollback undoes it"
        )
    last = state.history[-1] if state.history else None
    if last is not None and last.verdict == "rolled_back":
        out.line(f"last attempt: {last.sha[:12]} rolled back at {last.at}: {last.reason}")
        if cur is None:
            out.line(
                "no release has been released on this host yet: the service is stopped and "
                "nothing was lost. Fix the release and `release promote` it again"
            )
    return code


def _problem(state: HostState, healthy: bool, why: str, pid: int | None) -> ServegateError | None:
    """Status is a check too: it exits non-zero when the box is not serving what it says."""
    last = state.history[-1] if state.history else None
    if last is not None and last.verdict == "failed":
        return RollbackFailed(
            f"no verified release is serving: {last.sha[:12]} failed and its rollback too",
            hint="`release recover` or `release rollback` puts a release back",
        )
    if state.pending:
        return ServiceFailed(
            f"a {state.pending.kind} of {state.pending.sha[:12]} stopped after its switch",
            hint="`release recover` undoes it (the next promote or rollback would too)",
        )
    if state.current is not None and not healthy:
        return ServiceFailed(
            f"the live release {state.current.sha[:12]} is not healthy (pid {pid}): {why}",
            hint="see the service log under the host root's logs/; `release verify` proves "
            "what runs",
        )
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    common_args.common(p)


def main(cfg: Config, args: argparse.Namespace, out: Output) -> int:
    return run(cfg, out)
