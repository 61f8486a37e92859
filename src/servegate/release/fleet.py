"""Hosts over SSH: one box, or a fleet promoted canary first, then in waves.

Every host runs servegate itself (``ssh.servegate`` with its own config): the same code
as a local promote, with its own records, state file and /proc. This module only decides
the order, reads each host's JSON answer, and rolls back the hosts a failed wave touched.
Git stays the only carrier of code: each host fetches the SHA from the stack's remote.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegate.config import Config, FleetHost
from servegate.errors import HostKeyRejected, HostUnreachable, RollbackFailed, ServegateError
from servegate.pipeline.stages import Reporter
from servegate.pipeline.transport import Ssh, Transport


@dataclass
class Answer:
    """One servegate command's answer on a host: its JSON envelope."""

    host: str
    exit_code: int
    result: Any
    error: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def message(self) -> str:
        return str(self.error.get("message", "")) if self.error else ""


def parse_envelope(host: str, exit_code: int, text: str) -> Answer:
    start = text.find('{\n  "schema"')
    if start < 0:
        raise HostUnreachable(
            f"{host}: servegate gave no JSON answer (exit {exit_code}):\n{text.strip()[-1500:]}",
            hint="check ssh.servegate (servegate installed on the host?) and ssh.config",
        )
    doc, _ = json.JSONDecoder().raw_decode(text[start:])
    return Answer(host, int(doc.get("exit_code", exit_code)), doc.get("result"),
                  doc.get("error") or {})  # fmt: skip


class RemoteHost:
    """servegate on one host, through a transport."""

    def __init__(self, cfg: Config, host: FleetHost, transport: Transport) -> None:
        self.address = host.address
        self.config = host.config or cfg.ssh.config
        self.servegate = cfg.ssh.servegate
        self.timeout = cfg.ssh.command_timeout
        self.transport = transport

    def argv(self, *args: str, json_mode: bool = True) -> list[str]:
        return [self.servegate, *args, "--config", self.config, *(["--json"] if json_mode else [])]

    def call(self, *args: str) -> Answer:
        start = time.monotonic()
        out = self.transport.run(self.argv(*args), timeout=self.timeout)
        answer = parse_envelope(self.address, out.exit_code, out.text)
        answer.seconds = time.monotonic() - start
        return answer

    def passthrough(self, args: Sequence[str]) -> tuple[int, str]:
        out = self.transport.run(self.argv(*args, json_mode=False), timeout=self.timeout)
        return out.exit_code, out.text


def connect(cfg: Config) -> list[RemoteHost]:
    known = Path(cfg.ssh.known_hosts).expanduser()
    return [
        RemoteHost(
            cfg,
            h,
            Ssh(h.address, known, cfg.ssh.identity, cfg.ssh.connect_timeout),
        )
        for h in cfg.remote_hosts
    ]


def waves(hosts: Sequence[RemoteHost], canary: int, size: int) -> list[list[RemoteHost]]:
    """Each canary alone, then the rest ``size`` at a time."""
    first = [[h] for h in hosts[:canary]]
    rest = list(hosts[canary:])
    return first + [rest[i : i + size] for i in range(0, len(rest), size)]


def live_sha(status: Answer) -> str | None:
    current = (status.result or {}).get("current") if isinstance(status.result, dict) else None
    return str(current["sha"]) if isinstance(current, dict) and current.get("sha") else None


@dataclass
class FleetRun:
    cfg: Config
    hosts: list[RemoteHost]
    reporter: Reporter
    rows: list[dict[str, Any]] = field(default_factory=list)
    before: dict[str, str | None] = field(default_factory=dict)

    def row(self, host: RemoteHost, **values: Any) -> dict[str, Any]:
        row = next((r for r in self.rows if r["host"] == host.address), None)
        if row is None:
            row = {"host": host.address, "before": self.before.get(host.address)}
            self.rows.append(row)
        row.update(values)
        return row


def survey(run: FleetRun) -> None:
    """Reach every host and read its live release before anything changes: an unreachable
    host or a rejected key stops the promote here, with no host touched."""
    for host in run.hosts:
        status = host.call("release", "status")
        if not status.ok:
            raise HostUnreachable(
                f"{host.address}: `release status` failed: {status.message}",
                hint="fix that host first; no host was changed",
            )
        run.before[host.address] = live_sha(status)
        pending = (status.result or {}).get("pending")
        note = (
            f" (an interrupted release {pending['sha'][:12]} will be undone first)"
            if pending
            else ""
        )
        run.reporter.note(f"{host.address}: live {str(run.before[host.address])[:12]}{note}")


def promote(cfg: Config, sha: str, allow_non_ff: bool, reporter: Reporter) -> dict[str, Any]:
    """Canary first, then waves; on a failure, roll back what the failing wave touched."""
    hosts = connect(cfg)
    run = FleetRun(cfg, hosts, reporter)
    try:
        if len(hosts) > 1:  # one host reports its own faults; a fleet checks all first
            survey(run)
        return _promote_waves(run, sha, allow_non_ff)
    finally:
        for h in hosts:
            h.transport.close()


def _promote_waves(run: FleetRun, sha: str, allow_non_ff: bool) -> dict[str, Any]:
    cfg = run.cfg
    plan = waves(run.hosts, cfg.fleet.canary, cfg.fleet.wave_size)
    touched_all: list[RemoteHost] = []
    extra = ["--allow-non-ff"] if allow_non_ff else []
    for number, wave in enumerate(plan, 1):
        kind = "canary" if number <= cfg.fleet.canary else "wave"
        touched: list[RemoteHost] = []
        for host in wave:
            run.reporter.note(f"{kind} {number}: promoting {sha[:12]} on {host.address} …")
            answer = _promote_one(run, host, sha, extra)
            if answer is not None and answer.ok:
                sha = str(answer.result.get("sha") or sha)  # every host gets the canary's SHA
                touched.append(host)
                if cfg.fleet.require_attestation:
                    answer = _attested(run, host, sha)  # a failure rolls it back with its wave
                if answer.ok:
                    continue
            failed = host
            victims = touched + (touched_all if cfg.fleet.on_failure == "all" else [])
            if answer is None and _released_before_the_link_went(run, host, sha):
                victims.append(host)
            rolled = [_roll_back_host(run, h) for h in victims]
            code = answer.exit_code if answer is not None else HostUnreachable.exit_code
            if not all(rolled):
                code = RollbackFailed.exit_code
            return _summary(run, sha, "not released" if all(rolled) else "failed", code, failed)
        touched_all += touched
    return _summary(run, sha, "released", 0, None)


def _promote_one(run: FleetRun, host: RemoteHost, sha: str, extra: list[str]) -> Answer | None:
    try:
        host.transport.connect()
    except (HostUnreachable, HostKeyRejected) as exc:  # nothing was sent: nothing changed
        run.row(host, verdict="unreachable", exit_code=exc.exit_code, reason=str(exc))
        return Answer(host.address, exc.exit_code, None, {"message": str(exc)})
    try:
        answer = host.call("release", "promote", sha, *extra)
    except HostUnreachable as exc:
        run.row(host, verdict="connection lost", exit_code=exc.exit_code, reason=str(exc))
        _recover_after_lost_connection(run, host)
        return None
    result = answer.result if isinstance(answer.result, dict) else {}
    run.row(
        host,
        verdict=result.get("verdict") or ("refused" if not answer.ok else "released"),
        exit_code=answer.exit_code,
        reason=result.get("reason") or answer.message,
        seconds=round(answer.seconds, 1),
        live=(result.get("rollback") or {}).get("sha") if not answer.ok else result.get("sha"),
    )
    return answer


def _attested(run: FleetRun, host: RemoteHost, sha: str) -> Answer:
    """``release verify --attestation`` of ``sha`` on ``host``, after its promote."""
    try:
        answer = host.call("release", "verify", "--attestation", sha)
    except HostUnreachable as exc:
        answer = Answer(host.address, exc.exit_code, None, {"message": str(exc)})
    if answer.ok:
        run.row(host, attestation="verified")
    else:
        run.row(host, verdict="attestation not verified", exit_code=answer.exit_code,
                reason=answer.message, attestation="not verified")  # fmt: skip
    return answer


def _recover_after_lost_connection(run: FleetRun, host: RemoteHost) -> None:
    """Reconnect once and run ``release recover`` there. A promote cut off after its
    switch left ``pending`` in the host's state, and recover puts the last proven release
    back; one cut off before its switch touched nothing live, and recover leaves it so (a
    plain rollback would take the host one release further back than it served). The
    host's ``release status`` then says what it serves. The host's promote may still run:
    one whose session hung up (SIGHUP) after its switch puts the previous release back
    itself, holding the host lock, and recover waits for it (a stop, a start and a
    proof)."""
    host.transport.close()
    cfg = run.cfg.service
    wait = str(int(cfg.stop_timeout + cfg.startup_timeout + 300))
    try:
        answer = host.call("release", "recover", "--wait", wait)
        status = host.call("release", "status")
    except ServegateError as exc:
        run.row(host, recovery=f"not reachable again: {exc}")
        return
    result = answer.result if isinstance(answer.result, dict) else {}
    undone = result.get("recovered")
    if not answer.ok:
        recovery = f"FAILED: {answer.message}"
    elif isinstance(undone, dict):
        recovery = f"undid the interrupted release: {str(undone.get('sha'))[:12]} is back"
    else:
        recovery = "nothing to undo: no switch was left half done"
    run.row(host, recovery=recovery, live=live_sha(status))


def _released_before_the_link_went(run: FleetRun, host: RemoteHost, sha: str) -> bool:
    """Whether a host whose connection was lost had recorded the release first: it serves
    it, proven, and goes back with its wave like any host that took it. (A host not
    surveyed, a lone one, has no earlier release known to go back to: it keeps it.)"""
    served = run.row(host).get("live")
    return served == sha and host.address in run.before and run.before[host.address] != sha


def _roll_back_host(run: FleetRun, host: RemoteHost) -> bool:
    previous = run.before.get(host.address)
    if previous is None:
        run.row(host, rollback="it had no release before; the new release stays (verified)")
        return True
    run.reporter.note(f"rolling back {host.address} to {previous[:12]} …")
    try:
        answer = host.call("release", "rollback", "--to", previous)
    except ServegateError as exc:
        run.row(host, rollback=f"FAILED: {exc}")
        return False
    ok = answer.ok or answer.exit_code == 12  # already live
    run.row(
        host, rollback="ok" if ok else f"FAILED: {answer.message}", live=previous if ok else None
    )
    return ok


def _summary(
    run: FleetRun, sha: str, verdict: str, code: int, failed: RemoteHost | None
) -> dict[str, Any]:
    return {
        "sha": sha,
        "verdict": verdict,
        "exit_code": code,
        "failed_host": failed.address if failed else None,
        "waves": [
            [h.address for h in w]
            for w in waves(run.hosts, run.cfg.fleet.canary, run.cfg.fleet.wave_size)
        ],
        "hosts": run.rows,
    }


def each(cfg: Config, call: Callable[[RemoteHost], Answer]) -> list[Answer]:
    """Run one servegate command on every host (status, verify, rollback, history)."""
    out: list[Answer] = []
    for host in connect(cfg):
        try:
            out.append(call(host))
        except ServegateError as exc:
            out.append(Answer(host.address, exc.exit_code, None, {"message": str(exc)}))
        finally:
            host.transport.close()
    return out
