from __future__ import annotations

import argparse
import os

from servegate.commands import args as common_args
from servegate.commands.bench import print_gate
from servegate.config import Config
from servegate.errors import RollbackFailed, ServegateError
from servegate.output import Output
from servegate.release.context import Context
from servegate.release.promote import Outcome, promote


def show(out: Output, outcome: Outcome) -> None:
    out.stages(f"release promote {outcome.sha[:12]}", outcome.stages)
    for check in (outcome.record or {}).get("gate", {}).get("checks", []):
        if check.get("name") == "bench" and check["evidence"].get("rows"):
            print_gate(out, check["evidence"])
            out.line(f"bench baseline: {check['evidence'].get('baseline')}; "
                     f"result file: {check['evidence'].get('result_file')}")  # fmt: skip
    record = outcome.record or {}
    for finding in record.get("lint", []):
        out.line(f"lint {finding['severity']}: {finding['rule']}: {finding['message']}")
    facts = (record.get("startup_log") or {}).get("facts") or {}
    if facts:
        out.line("start-up: " + ", ".join(f"{k} {v}" for k, v in facts.items()))
    if outcome.verdict == "released":
        out.line(f"released {outcome.sha} as {outcome.tag} in {outcome.seconds:.1f}s")
    elif outcome.verdict == "rolled_back" and outcome.rollback.get("stopped"):
        out.line(f"NOT released: {outcome.reason}")
        out.line(f"not an emergency: {outcome.rollback.get('reason', '')}")
    elif outcome.verdict == "rolled_back":
        back = outcome.rollback.get("sha") or "nothing"
        out.line(f"NOT released: {outcome.reason}")
        out.line(f"rolled back to {str(back)[:12]}: serving again, verified")
    else:
        out.line(f"NOT released: {outcome.reason}")
        out.line(f"ROLLBACK FAILED: {outcome.rollback.get('reason', '')}")


def run(cfg: Config, out: Output, sha: str, allow_non_ff: bool) -> int:
    ctx = Context.create(cfg, out.reporter(), os.environ)
    out.scrub = ctx.scrub
    try:
        outcome = promote(ctx, sha, allow_non_ff=allow_non_ff)
    except ServegateError as err:
        if out.json_mode:
            return out.emit({"stages": ctx.runner.as_list()}, err.exit_code, err)
        return out.error(err)
    if out.json_mode:
        return out.emit(outcome.as_dict(), outcome.exit_code, outcome.error)
    show(out, outcome)
    if outcome.verdict == "failed":
        out.error(
            RollbackFailed(
                outcome.rollback.get("reason", ""),
                hint=f"see `release status`; logs are under {cfg.host_root}/logs",
            )
        )
    return outcome.exit_code


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sha", help="the commit to release (on the configured branch)")
    p.add_argument(
        "--allow-non-ff",
        action="store_true",
        help="allow a SHA that is not a descendant of the live release",
    )
    common_args.common(p)


def main(cfg: Config, args: argparse.Namespace, out: Output) -> int:
    return run(cfg, out, args.sha, args.allow_non_ff)
