from __future__ import annotations

import os

from servegate.config import Config
from servegate.errors import ServegateError
from servegate.output import Output
from servegate.release.context import Context
from servegate.release.rollback import rollback


def run(cfg: Config, out: Output, to: str | None) -> int:
    ctx = Context.create(cfg, out.reporter(), os.environ)
    out.scrub = ctx.scrub
    try:
        result = rollback(ctx, to)
    except ServegateError as err:
        if out.json_mode:
            return out.emit({"stages": ctx.runner.as_list()}, err.exit_code, err)
        return out.error(err)
    if out.json_mode:
        return out.emit(result)
    out.stages(f"release rollback → {result['sha'][:12]}", result["stages"])
    out.line(f"{result['sha']} is live again and verified ({result['seconds']:.1f}s)")
    return 0
