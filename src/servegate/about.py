"""Which servegate this is: its version and the commit it was installed from.

The commit comes from what the installer recorded, never from a guess: pip and pipx
write the PEP 610 ``direct_url.json`` for every install from a URL or a directory —
``vcs_info.commit_id`` for a Git URL (``pipx install git+https://…@<sha>``, or
``git+file://`` of a local checkout), ``dir_info.editable`` for ``pip install -e``, whose
code *is* the checkout, so its HEAD (and whether files changed) is what runs. An install
from a plain directory or a wheel records no commit, and the answer says so.

Kept to the standard library and one small file read, so ``servegate --version``
answers without importing the rest of servegate.
"""

from __future__ import annotations

import json
from pathlib import Path

from servegate import __version__


def installed_from() -> dict[str, str]:
    """``{"commit", "source", "how"}`` as the installer recorded them (empty values when
    it recorded nothing)."""
    from importlib import metadata  # 28 ms: only a record or --version asks

    try:
        text = metadata.distribution("servegate").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        text = None
    if not text:
        return {"commit": "", "source": "", "how": "a wheel or an index (no commit recorded)"}
    try:
        info = json.loads(text)
    except ValueError:
        return {"commit": "", "source": "", "how": "unreadable direct_url.json"}
    url = str(info.get("url", ""))
    vcs = info.get("vcs_info") or {}
    if vcs.get("commit_id"):
        return {"commit": str(vcs["commit_id"]), "source": url, "how": f"{vcs.get('vcs')} URL"}
    if (info.get("dir_info") or {}).get("editable") and url.startswith("file://"):
        where = url.removeprefix("file://")
        return {"commit": _checkout_head(where), "source": where, "how": "editable checkout"}
    return {"commit": "", "source": url, "how": "a directory (no commit recorded)"}


def _checkout_head(where: str) -> str:
    """HEAD of an editable checkout, with ``+changes`` when its tracked files differ."""
    if not (Path(where) / ".git").exists():
        return ""
    from servegate.pipeline import gitenv

    head = gitenv.run(["-C", where, "rev-parse", "HEAD"], timeout=10)
    dirty = gitenv.run(["-C", where, "status", "--porcelain", "--untracked-files=no"], timeout=10)
    if not (head.ok and dirty.ok):
        return ""
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def version_line() -> str:
    """``servegate 0.1.0 (commit 1a2b3c4d5e6f, git URL git+https://…)``."""
    info = installed_from()
    if info["commit"]:
        return f"servegate {__version__} (commit {info['commit'][:12]}{_tail(info)})"
    return f"servegate {__version__} (commit unknown: installed from {info['how']})"


def _tail(info: dict[str, str]) -> str:
    changed = " with uncommitted changes" if info["commit"].endswith("+changes") else ""
    return f"{changed}, {info['how']} {info['source']}"
