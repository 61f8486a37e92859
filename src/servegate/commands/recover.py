"""``release recover``: finish what an interrupted promote or rollback left half done."""

from __future__ import annotations

import os

from servegate.config import Config
from servegate.output import Output
from servegate.pipeline.lock import HostLock
from servegate.release.context import Context
from servegate.release.rollback import recover


def run(cfg: Config, out: Output) -> int:
    ctx = Context.create(cfg, out.reporter(), os.environ)
    with HostLock(ctx.lock_path, "release recover"):
        result = recover(ctx)
    if out.json_mode:
        return out.emit({"recovered": result})
    if result is None:
        out.line("nothing to recover: no promote or rollback was interrupted on this host")
    else:
        out.line(f"undid the interrupted release of {result['recovered'][:12]}: "
                 f"{str(result.get('sha'))[:12]} is live again and verified")  # fmt: skip
    return 0
