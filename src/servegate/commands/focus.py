from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path
from xml.etree import ElementTree

from servegate.commands import args as common_args
from servegate.config import Config
from servegate.errors import ConfigError, GpuTestsSkipped, NoGpuVisible
from servegate.kernels import gpu
from servegate.kernels.focus import Selection, build_outputs, select
from servegate.output import Output
from servegate.pipeline import proc


def _pytest(selection: Selection, cfg: Config, extra: list[str]) -> list[str]:
    marker = ["-m", cfg.focus.marker] if cfg.focus.marker else []
    python = os.path.expanduser(cfg.focus.python) or sys.executable
    return [python, "-m", "pytest", *selection.tests, *marker, "-rs", *extra]


def _require_pytest(python: str, checkout: Path) -> None:
    """The tests run with ``python -m pytest``: say so plainly when that cannot work,
    rather than report every selected test as skipped."""
    found = proc.run([python, "-c", "import pytest"], cwd=checkout, check=False, timeout=120)
    if found.returncode != 0:
        raise ConfigError(
            f"pytest is not installed for {python}, which runs the selected tests",
            hint="install pytest there, or set focus.python to the stack's test environment "
            "(e.g. the venv the noxfile's gpu_tests session makes)",
        )


def _count(argv: list[str], checkout: Path) -> int:
    out = proc.run([*argv, "--collect-only", "-q"], cwd=checkout, check=False, timeout=600)
    found = re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", out.output)
    return int(found.group(1)) if found else 0


def run(
    cfg: Config,
    out: Output,
    checkout: Path,
    base: str | None,
    labels: list[str],
    execute: bool,
    extra: list[str],
    require_gpu: bool = False,
) -> int:
    if require_gpu and not execute:
        raise ConfigError("--require-gpu needs --run", hint="add --run, or drop --require-gpu")
    selection = select(
        cfg.focus, checkout, base or cfg.focus.base, os.environ, labels, build_outputs(cfg.build)
    )
    if out.json_mode and not execute:
        return out.emit(selection.as_dict())

    def say(text: str) -> None:  # under --json people read stderr; stdout is the document
        if out.json_mode:
            out.err.print(text, markup=False, soft_wrap=True)
        else:
            out.line(text)

    for warning in selection.warnings:
        out.err.print(f"warning: {warning}", markup=False)
    base = base or cfg.focus.base
    if selection.changed or selection.run_all:
        say(f"{len(selection.changed)} file(s) changed since the merge base with {base}")
    else:
        say(
            f"nothing changed between {base} (merge base {selection.merge_base[:12]}) and "
            f"HEAD ({selection.head[:12]}), working tree included: nothing selected"
        )
        return out.emit({**selection.as_dict(), "ran": 0, "skipped": 0}) if out.json_mode else 0
    for link, target in selection.linked.items():
        say(f"  {link} links to {target}, which changed")
    if selection.run_all:
        say(f"running everything ({selection.run_all})")
    for test, why in selection.tests.items():
        more = f" (+{len(why) - 3} more)" if len(why) > 3 else ""
        say(f"  {test:<40} ← {'; '.join(why[:3])}{more}")
    if not selection.tests:
        say("nothing selected: only ignored files (docs) changed")
        return out.emit({**selection.as_dict(), "ran": 0, "skipped": 0}) if out.json_mode else 0
    if not execute:
        return 0
    argv = _pytest(selection, cfg, extra)
    _require_pytest(argv[0], checkout)
    has_gpu = gpu.detect()
    if not has_gpu and require_gpu:
        raise NoGpuVisible(
            f"neither nvidia-smi nor rocminfo lists a GPU here: the "
            f"{_count(argv, checkout)} selected GPU test(s) would all skip",
            hint="check the runner's driver, /dev/kfd or /dev/nvidia* permissions and its "
            "environment; run without --require-gpu on a machine that has no GPU",
        )
    with tempfile.TemporaryDirectory(prefix="servegate-focus-") as tmp:
        report = Path(tmp) / "junit.xml"
        # under --json pytest's own output goes to stderr: stdout is the JSON document
        done = proc.run([*argv, f"--junitxml={report}"], cwd=checkout, check=False,
                        capture=out.json_mode)  # fmt: skip
        if out.json_mode:
            sys.stderr.write(done.output)
        code = done.returncode
        ran, skipped = _tally(report)
    if not has_gpu:
        say(f"no GPU here: pytest ran {ran} selected test(s), {skipped} of them skipped (the "
            "GPU tests run on a machine with one)")  # fmt: skip
    if code == 0 and has_gpu and ran and skipped == ran:
        raise GpuTestsSkipped(
            f"this machine has a GPU ({has_gpu}), yet all {ran} selected GPU test(s) were "
            "skipped: a run that tested nothing is not green",
            hint="the tests do not see the GPU: check the driver, device permissions and the "
            "runner's environment (the skip reasons are printed above)",
        )
    if out.json_mode:
        failed = None
        if code:
            failed = {
                "class": "PytestFailed",
                "message": f"pytest exited {code}: {PYTEST_EXITS.get(code, 'see its output')}",
                "hint": "the exit code is pytest's own (docs/exit-codes.md); its output is on "
                "stderr",
            }
        return out.emit({**selection.as_dict(), "ran": ran, "skipped": skipped,
                         "gpu": has_gpu or None, "pytest_exit_code": code}, code,
                        error_doc=failed)  # fmt: skip
    return code


#: pytest's exit codes (``pytest.ExitCode``), said in words
PYTEST_EXITS = {
    1: "tests failed",
    2: "interrupted",
    3: "an internal error",
    4: "a usage error (a test path that does not exist, a bad option)",
    5: "no tests were collected",
}


def _tally(report: Path) -> tuple[int, int]:
    """(tests, skipped) from pytest's JUnit XML; (0, 0) when there is none."""
    try:
        root = ElementTree.parse(report).getroot()
    except (OSError, ElementTree.ParseError):
        return 0, 0
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return (sum(int(s.get("tests", 0)) for s in suites),
            sum(int(s.get("skipped", 0)) for s in suites))  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, default=Path("."), help="the stack checkout (default: .)")
    p.add_argument("--base", help="diff base (default: focus.base from the config)")
    p.add_argument("--label", action="append", default=[], help="a pull-request label (repeatable)")
    p.add_argument("--run", action="store_true", help="run the selected tests with pytest")
    p.add_argument(
        "--require-gpu",
        action="store_true",
        help="with --run: fail (exit 21) when no GPU is visible instead of skipping (a GPU CI job)",
    )
    p.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    common_args.common(p)


def main(args: argparse.Namespace, out: Output) -> int:
    from servegate import config as config_mod

    cfg = config_mod.load(args.config, os.environ, build_only=True)
    return run(
        cfg, out, args.dir, args.base, args.label, args.run, args.pytest_args, args.require_gpu
    )
