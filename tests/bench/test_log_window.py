"""The measured window's log is read or the trial says it was not: a log that is gone,
unreadable or truncated never lets a compile line go unchecked as a clean window."""

from __future__ import annotations

from pathlib import Path

from servegate.bench.driver import LogWindow


def test_the_window_is_what_was_written_since_the_mark(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    log.write_text("before\n")
    window = LogWindow(log)
    mark = window.mark()
    with log.open("a") as f:
        f.write("Compiling a graph for dynamic shape\n")
    assert window.since(mark) == "Compiling a graph for dynamic shape\n"


def test_a_rotated_log_is_read_across_the_rotation(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    log.write_text("x" * 100)
    window = LogWindow(log)
    mark = window.mark()
    with log.open("a") as f:
        f.write("\nTriton autotune in the window\n")
    log.rename(tmp_path / "svc.log.1")  # supervisord's rotation
    log.write_text("after the rotation\n")
    assert window.since(mark) == "\nTriton autotune in the window\nafter the rotation\n"


def test_a_log_gone_or_truncated_is_no_window(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    log.write_text("x" * 100)
    window = LogWindow(log)
    mark = window.mark()
    log.write_text("short")  # truncated below the mark, nothing rotated
    assert window.since(mark) is None
    log.unlink()
    assert window.since(mark) is None
