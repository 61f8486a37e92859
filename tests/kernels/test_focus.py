"""servegate focus on a real git checkout of the demo stack, with its real focus map."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import git
import pytest

from servegate import config
from servegate.cli import main
from servegate.demo.sandbox import Sandbox, config_text
from servegate.errors import GitRefusal
from servegate.kernels.focus import build_outputs, matches, select
from tests.conftest import DEV

STACK = resources.files("servegate.demo") / "stack"
KERNEL_TESTS = ["tests/test_scale_add_gpu.py", "tests/test_version_gpu.py"]


def copy_stack(dest: Path) -> None:
    with resources.as_file(STACK) as src:
        shutil.copytree(src, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "stack"
    copy_stack(root)
    repo = git.Repo.init(root, initial_branch="main")
    with repo.git.custom_environment(**DEV.env):
        repo.git.add("--all")
        repo.git.commit("-q", "-m", "stack")
    repo.git.switch("-q", "-c", "feature")
    return root


@pytest.fixture
def cfg(tmp_path: Path, checkout: Path) -> config.Config:
    text = config_text(Sandbox(tmp_path, Path(sys.executable), 8000))
    path = tmp_path / "servegate.toml"
    path.write_text(text.replace('base = "origin/main"', 'base = "main"'))
    return config.load(path, {})


def edit(checkout: Path, rel: str, text: str = "\n// changed\n") -> None:
    path = checkout / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((path.read_text() if path.exists() else "") + text)


def test_globs_with_double_star_and_exclusions() -> None:
    assert matches("kernels/a/b.hip", ("kernels/**",))
    assert matches("x/y/notes.md", ("**/*.md",))
    assert matches("notes.md", ("**/*.md",))
    assert not matches("kernels/README.md", ("kernels/**", "!kernels/README.md"))
    assert not matches("kernelsx/a.hip", ("kernels/**",))
    assert not matches("src/a/b.py", ("src/*.py",))


def test_kernel_only_change_selects_the_kernel_tests(cfg: config.Config, checkout: Path) -> None:
    edit(checkout, "kernels/demo_kernels.hip")
    sel = select(cfg.focus, checkout, "main", {}, [])
    assert sel.changed == ["kernels/demo_kernels.hip"]
    assert sorted(sel.tests) == KERNEL_TESTS
    assert sel.tests["tests/test_scale_add_gpu.py"] == ["kernels/demo_kernels.hip (rule 1)"]
    assert sel.warnings == []


def test_docs_only_change_selects_nothing(
    cfg: config.Config, checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit(checkout, "README.md", "more words\n")
    edit(checkout, "kernels/README.md", "notes\n")
    assert select(cfg.focus, checkout, "main", {}, []).tests == {}
    assert main(["focus", "--config", str(cfg.path), "--dir", str(checkout), "--run"]) == 0
    assert "nothing selected" in capsys.readouterr().out


def test_uncovered_source_falls_back_to_the_wider_set(cfg: config.Config, checkout: Path) -> None:
    edit(checkout, "tools/bench.py", "print(1)\n")
    sel = select(cfg.focus, checkout, "main", {}, [])
    assert list(sel.tests) == ["tests"]
    assert sel.tests["tests"] == ["tools/bench.py matched no rule: fallback"]


def test_run_all_by_environment_or_label(
    cfg: config.Config, checkout: Path, tmp_path: Path
) -> None:
    edit(checkout, "kernels/demo_kernels.hip")
    by_env = select(cfg.focus, checkout, "main", {"SERVEGATE_RUN_ALL_GPU_TESTS": "1"}, [])
    assert list(by_env.tests) == ["tests"]
    assert by_env.run_all == "SERVEGATE_RUN_ALL_GPU_TESTS=1"
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"labels": [{"name": "run-all-gpu-tests"}]}}))
    by_label = select(cfg.focus, checkout, "main", {"GITHUB_EVENT_PATH": str(event)}, [])
    assert by_label.run_all == "label 'run-all-gpu-tests'"


def test_missing_base_and_stale_map_entries(cfg: config.Config, checkout: Path) -> None:
    with pytest.raises(GitRefusal, match="'origin/nope' does not exist"):
        select(cfg.focus, checkout, "origin/nope", {}, [])
    shutil.rmtree(checkout / "kernels")
    git.Repo(checkout).git.add("--all")
    sel = select(cfg.focus, checkout, "main", {}, [])
    assert "focus rule 1: source glob 'kernels/**' matches no file" in sel.warnings


def test_run_without_gpu_says_how_many_were_skipped(
    cfg: config.Config, checkout: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    edit(checkout, "kernels/demo_kernels.hip")
    code = main(["focus", "--config", str(cfg.path), "--dir", str(checkout), "--run"])
    out = capfd.readouterr().out
    assert code == 0
    assert "no GPU here: pytest ran 7 selected test(s), 7 of them skipped" in out
    assert "7 skipped" in out


def test_run_json_prints_one_document_and_what_pytest_ran(
    cfg: config.Config, checkout: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    edit(checkout, "kernels/demo_kernels.hip")
    argv = ["focus", "--config", str(cfg.path), "--dir", str(checkout), "--run", "--json"]
    code = main(argv)
    captured = capfd.readouterr()
    doc = json.loads(captured.out)  # nothing but the document on stdout
    assert code == doc["exit_code"] == 0
    assert (doc["result"]["ran"], doc["result"]["skipped"]) == (7, 7)
    assert doc["result"]["pytest_exit_code"] == 0
    assert "7 skipped" in captured.err  # pytest's own lines, and the human ones, on stderr
    assert "no GPU here" in captured.err


def test_a_gpu_run_that_skipped_every_test_is_not_green(
    cfg: config.Config,
    checkout: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A runner whose GPU the tests cannot see: GPU detection says there is one (the
    detection is this test's edge: an nvidia-smi that lists a GPU), every test skips."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    edit(checkout, "kernels/demo_kernels.hip")
    code = main(["focus", "--config", str(cfg.path), "--dir", str(checkout), "--run"])
    captured = capfd.readouterr()
    assert code == 19
    assert "7 skipped" in captured.out
    assert "yet all 7 selected GPU test(s) were skipped" in captured.err


def test_what_the_build_writes_is_no_change(cfg: config.Config, checkout: Path) -> None:
    """After ``servegate build`` the checkout holds untracked libraries and logs: they
    select nothing (an edited source still does)."""
    outputs = [t.output for t in cfg.build.targets if t.output] or ["build/libdemo.so"]
    for out in [*outputs, "build/logs/demo.log"]:
        edit(checkout, out, "built\n")
    sel = select(cfg.focus, checkout, "main", {}, [], build_outputs(cfg.build))
    assert sel.tests == {}
    edit(checkout, "kernels/demo_kernels.hip")
    sel = select(cfg.focus, checkout, "main", {}, [], build_outputs(cfg.build))
    assert sorted(sel.tests) == KERNEL_TESTS


def test_run_without_pytest_says_so(
    cfg: config.Config, checkout: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    text = (
        Path(str(cfg.path))
        .read_text()
        .replace("[focus]", f'[focus]\npython = "{venv / "bin" / "python"}"', 1)
    )
    Path(str(cfg.path)).write_text(text)
    edit(checkout, "kernels/demo_kernels.hip")
    code = main(["focus", "--config", str(cfg.path), "--dir", str(checkout), "--run"])
    err = capfd.readouterr().err
    assert code == 2
    assert "pytest is not installed for" in err
    assert "focus.python" in err


def commit(checkout: Path, message: str) -> None:
    repo = git.Repo(checkout)
    with repo.git.custom_environment(**DEV.env):
        repo.git.add("--all")
        repo.git.commit("-q", "-m", message)


def on_main(checkout: Path, message: str) -> None:
    """Commit the working tree on main and start the feature branch again from it."""
    repo = git.Repo(checkout)
    repo.git.switch("-q", "main")
    commit(checkout, message)
    repo.git.switch("-q", "-C", "feature")


def test_a_rename_counts_its_old_path(cfg: config.Config, checkout: Path) -> None:
    """A kernel header moved into docs/ breaks the build: its old path selects the kernel
    tests, whatever the user's diff config says."""
    repo = git.Repo(checkout)
    for key, value in [("diff.renames", "copies"), ("diff.external", "false"),
                       ("diff.relative", "true"), ("diff.noprefix", "true")]:  # fmt: skip
        repo.git.config(key, value)
    (checkout / "docs").mkdir()
    repo.git.mv("kernels/version.h", "docs/version.h")
    commit(checkout, "move the version header to the docs")
    sel = select(cfg.focus, checkout, "main", {}, [])
    assert sel.changed == ["docs/version.h", "kernels/version.h"]
    assert sorted(sel.tests) == KERNEL_TESTS
    assert sel.tests["tests/test_version_gpu.py"] == ["kernels/version.h (rule 1)"]


def test_a_submodule_bump_counts_though_git_is_told_to_ignore_it(
    cfg: config.Config, checkout: Path, tmp_path: Path
) -> None:
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    (vendor / "x.h").write_text("#define X 1\n")
    sub = git.Repo.init(vendor, initial_branch="main")
    commit(vendor, "1")
    repo = git.Repo(checkout)
    repo.git.switch("-q", "main")
    repo.git.execute(["git", "-c", "protocol.file.allow=always", "submodule", "add", "-q",
                      str(vendor), "kernels/vendor"])  # fmt: skip
    repo.git.config("-f", ".gitmodules", "submodule.kernels/vendor.ignore", "all")
    on_main(checkout, "vendor kernels")
    (vendor / "x.h").write_text("#define X 2\n")
    commit(vendor, "2")
    inner = git.Repo(checkout / "kernels" / "vendor")
    inner.git.execute(["git", "-c", "protocol.file.allow=always", "pull", "-q", "origin", "main"])
    assert inner.head.commit.hexsha == sub.head.commit.hexsha
    commit(checkout, "bump the vendored kernels")
    repo.git.config("diff.ignoreSubmodules", "all")
    sel = select(cfg.focus, checkout, "main", {}, [])
    assert sel.changed == ["kernels/vendor"]
    assert sorted(sel.tests) == KERNEL_TESTS


def test_a_path_git_would_quote_is_matched_as_it_is(cfg: config.Config, checkout: Path) -> None:
    edit(checkout, "kernels/ñandú.h", "#define N 1\n")
    git.Repo(checkout).git.add("--all")
    edit(checkout, "kernels/tab\there.h", "#define T 1\n")  # untracked
    sel = select(cfg.focus, checkout, "main", {}, [])
    assert sel.changed == ["kernels/tab\there.h", "kernels/ñandú.h"]
    assert sel.tests["tests/test_scale_add_gpu.py"] == [
        "kernels/tab\there.h (rule 1)",
        "kernels/ñandú.h (rule 1)",
    ]


def test_a_change_behind_a_tracked_symlink_counts_for_the_link(
    cfg: config.Config, checkout: Path
) -> None:
    """kernels/version.h links into docs/, kernels/shared links to a folder there: an edit
    of the docs files changes the build, so it selects the kernel tests."""
    (checkout / "docs" / "shared").mkdir(parents=True)
    (checkout / "kernels" / "version.h").rename(checkout / "docs" / "kernels-version.h")
    (checkout / "kernels" / "version.h").symlink_to("../docs/kernels-version.h")
    (checkout / "docs" / "shared" / "common.h").write_text("#define C 1\n")
    (checkout / "kernels" / "shared").symlink_to("../docs/shared")
    on_main(checkout, "share headers with the docs")
    edit(checkout, "docs/kernels-version.h")
    sel = select(cfg.focus, checkout, "main", {}, [])
    assert sel.changed == ["docs/kernels-version.h"]
    assert sel.linked == {"kernels/version.h": "docs/kernels-version.h"}
    assert sel.tests["tests/test_version_gpu.py"] == [
        "kernels/version.h (links to changed docs/kernels-version.h) (rule 1)"
    ]
    git.Repo(checkout).git.checkout("--", "docs/kernels-version.h")
    edit(checkout, "docs/shared/common.h")
    sel = select(cfg.focus, checkout, "main", {}, [])
    assert sel.linked == {"kernels/shared/common.h": "docs/shared/common.h"}
    assert sorted(sel.tests) == KERNEL_TESTS


def test_nothing_changed_says_so(
    cfg: config.Config, checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head = git.Repo(checkout).head.commit.hexsha
    assert main(["focus", "--config", str(cfg.path), "--dir", str(checkout), "--run"]) == 0
    out = capsys.readouterr().out
    assert f"nothing changed between main (merge base {head[:12]}) and HEAD ({head[:12]})" in out
    assert "docs" not in out


def test_require_gpu_fails_a_run_with_no_gpu_visible(
    cfg: config.Config,
    checkout: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A GPU runner whose GPU is invisible must not go green on skipped tests. The PATH
    holds git and nothing that could list a GPU (this test's edge)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(str(shutil.which("git")))
    monkeypatch.setenv("PATH", str(bin_dir))
    edit(checkout, "kernels/demo_kernels.hip")
    argv = ["focus", "--config", str(cfg.path), "--dir", str(checkout), "--run"]
    assert main([*argv, "--require-gpu"]) == 21
    err = capfd.readouterr().err
    assert "neither nvidia-smi nor rocminfo lists a GPU here: the 7 selected GPU test(s)" in err
    assert main(argv) == 0
    assert "no GPU here: pytest ran 7 selected test(s), 7 of them skipped" in capfd.readouterr().out
    assert main([*argv[:-1], "--require-gpu"]) == 2


def test_the_map_check_sees_the_untracked_files_focus_selects_on(tmp_path: Path) -> None:
    """A new kernel not yet committed (csrc/new.cu) is a change focus selects on; the map
    check must not call its glob one that "matches no file"."""
    from servegate.config import Focus, FocusRule
    from servegate.kernels.focus import check_map

    repo = git.Repo.init(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_k.py").write_text("def test_k() -> None: ...\n")
    repo.git.add("-A")
    repo.git.commit("-m", "t", env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})  # fmt: skip
    focus = Focus(rules=(FocusRule(("csrc/**",), ("tests/test_k.py",)),))
    assert check_map(focus, tmp_path) == ["focus rule 1: source glob 'csrc/**' matches no file"]
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "new.cu").write_text("__global__ void k() {}\n")
    assert check_map(focus, tmp_path) == []


def test_run_json_names_a_pytest_failure_as_pytest_s_not_by_a_servegate_class(
    cfg: config.Config, checkout: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """focus --run exits with pytest's own code, which overlaps servegate's (4 is
    LockHeld's): the error object says it is pytest's and what it means."""
    edit(checkout, "kernels/demo_kernels.hip")
    (checkout / "tests" / "test_scale_add_gpu.py").unlink()  # selected, but not there
    argv = ["focus", "--config", str(cfg.path), "--dir", str(checkout), "--run", "--json"]
    code = main(argv)
    doc = json.loads(capfd.readouterr().out)
    assert code == doc["exit_code"] == doc["result"]["pytest_exit_code"] == 4
    assert doc["error"]["class"] == "PytestFailed"
    assert "usage error" in doc["error"]["message"]
