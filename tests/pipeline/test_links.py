"""Tracked symbolic links that leave the work tree: absolute, relative with ``..``, and
through a chain of links, each followed on disk; links that stay inside are not named."""

from __future__ import annotations

from pathlib import Path

import git

from servegate.pipeline.git import escaping_links


def test_links_that_leave_the_tree_are_named_whatever_their_spelling(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "x.py").write_text("pass\n")
    work = tmp_path / "work"
    repo = git.Repo.init(work)
    (work / "pkg").mkdir()
    (work / "pkg" / "real.py").write_text("pass\n")
    (work / "pkg" / "abs.py").symlink_to(outside / "x.py")
    (work / "pkg" / "rel.py").symlink_to("../../elsewhere/x.py")
    (work / "pkg" / "hop").symlink_to(outside)  # a link to a directory outside
    (work / "pkg" / "chain.py").symlink_to("hop/x.py")  # inside by its text, out by its hop
    (work / "pkg" / "fine.py").symlink_to("real.py")
    (work / "up").symlink_to("pkg/../pkg/real.py")
    repo.git.add("-A")
    repo.git.commit("-m", "links", "--author", "t <t@t>", env={"GIT_COMMITTER_NAME": "t",
                    "GIT_COMMITTER_EMAIL": "t@t"})  # fmt: skip
    named = {line.split(" -> ")[0] for line in escaping_links(work)}
    assert named == {"pkg/abs.py", "pkg/rel.py", "pkg/hop", "pkg/chain.py"}
