"""Provenance against the attacks an independent review found after the observed checks
were built: a copy of the package outside any site directory, a venv chosen through the
live PATH, start-up hooks that hide in the modules a .pth imports or in the service
user's own site directory, a hook that forges the resolver's answer, code roots a
neighbour may write, and bytecode that is not its source. Real processes and venvs."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from servegate.provenance import startup_hooks as hooks
from servegate.provenance.check import Report, verify
from servegate.provenance.liveproc import read_process
from tests.provenance.test_provenance_observed import (  # the fixtures, shared
    Service,
    checks,
    expect,
    make_venv,
    needs_py_spy,
    release,
    serve,
    services,
)

__all__ = ["release", "services"]


def _libk(release: Path) -> str:
    return str(release / "build" / "libk.so")


@needs_py_spy
def test_a_copy_of_the_package_outside_any_site_directory(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """pip keeps ``-e git+…`` checkouts in ``<venv>/src``: a stale one run by path is a
    copy of the checked package, not runtime code of the venv."""
    venv = tmp_path / "venv"
    make_venv(venv)
    old = venv / "src" / "stackpkg-old" / "stackpkg"
    shutil.copytree(release / "stackpkg", old)
    python = str(venv / "bin" / "python")
    s = Service([python, str(old / "server.py"), _libk(release)], release, dict(os.environ))
    services.append(s)
    report = verify(s.pid, expect(release, interpreter=python))
    copies = [
        f for f in report.findings if f.check == "module stackpkg runs from outside the release"
    ]
    assert copies
    assert copies[0].found == str(old / "server.py")


def test_the_venv_the_live_path_chose_is_the_one_judged(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """Started as plain ``python``: the kernel found it on the process's own PATH, in
    another venv of the same base Python."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    make_venv(mine)
    make_venv(other)
    env = {"PATH": f"{other / 'bin'}:/usr/bin:/bin"}
    s = serve(services, release, argv=["python", "-m", "stackpkg.server"], **env)
    report = verify(s.pid, expect(release, interpreter=str(mine / "bin" / "python")))
    venv = [f for f in report.findings if f.check == "interpreter environment"]
    assert venv
    assert str(other / "bin") in venv[0].found


def test_what_a_pth_imports_and_the_directories_it_adds_are_judged(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    site = make_venv(venv)
    # an innocent-looking .pth line; the module it imports acts for the server alone
    (site / "svhelper.pth").write_text("import svhelper\n")
    (site / "svhelper.py").write_text(
        "import sys\nif 'stack' in ' '.join(sys.orig_argv):\n    pass  # a finder would go here\n"
    )
    # a directory holding a copy of the package, and one holding something else
    elsewhere, other = tmp_path / "elsewhere", tmp_path / "other"
    shutil.copytree(release / "stackpkg", elsewhere / "stackpkg")
    other.mkdir()
    (site / "paths.pth").write_text(f"{elsewhere}\n{other}\n")
    python = str(venv / "bin" / "python")
    s = serve(services, release, python=python)
    report = verify(s.pid, expect(release, interpreter=python))
    by_path = {(h["path"], h["verdict"]): h["why"] for h in report.hooks}
    assert (str(site / "svhelper.py"), "fail") in by_path
    assert "reads the command line" in by_path[(str(site / "svhelper.py"), "fail")]
    assert any(p == str(site / "paths.pth") and v == "fail" and "holds stackpkg" in why
               for (p, v), why in by_path.items())  # fmt: skip
    assert any(p == str(site / "paths.pth") and v == "warn" and str(other) in why
               for (p, v), why in by_path.items())  # fmt: skip
    assert not report.ok


def test_the_service_users_own_site_directory_is_read(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """A base interpreter (no venv) adds ~/.local's site directory of the *service's*
    HOME, not servegate's."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    home = tmp_path / "home"
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    user_site = home / ".local" / "lib" / ver / "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text("import sys\nsys.orig_argv\n")
    s = serve(services, release, python=base, HOME=str(home))
    info = read_process(s.pid)
    assert info is not None
    report = Report()
    hooks.check_hooks([info], expect(release, interpreter=base), report, [])
    mine = [h for h in report.hooks if h["kind"] == "usercustomize"]
    assert mine
    assert mine[0]["path"] == str(user_site / "usercustomize.py")
    assert mine[0]["verdict"] == "fail"


def test_a_hook_that_forges_the_resolvers_answer_is_no_answer(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    site = make_venv(venv)
    # it prints what looks like servegate's answer, naming the release
    forged = json.dumps({"stackpkg": f"{release}/stackpkg/__init__.py"})
    (site / "sitecustomize.py").write_text(
        "import atexit, sys\n"
        "if len(sys.argv) > 1 and sys.argv[1].startswith('servegate-resolved-'):\n"
        f"    atexit.register(lambda: print(sys.argv[1] + {forged!r}))\n"
    )
    python = str(venv / "bin" / "python")
    s = serve(services, release, python=python)
    report = verify(s.pid, expect(release, interpreter=python, py_spy="/nonexistent/py-spy"))
    resolution = [f for f in report.findings if f.check == "module resolution"]
    assert resolution
    assert resolution[0].found.count("servegate-resolved-") == 2  # its answer and ours
    assert report.modules == {}
    assert not report.ok


def test_code_roots_a_neighbour_may_write_are_findings(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    site = make_venv(venv)
    python = str(venv / "bin" / "python")
    s = serve(services, release, python=python)
    assert verify(s.pid, expect(release, interpreter=python)).ok
    site.chmod(0o777)
    report = verify(s.pid, expect(release, interpreter=python))
    assert f"runtime root {site}" in checks(report)


def _doctored_pyc(source: Path, code_text: str, unchecked: bool) -> Path:
    """Bytecode for ``source`` compiled from other text: a timestamp header that matches
    the source's mtime and size (the import system's only check), or an unchecked-hash
    one (never checked against the source at all)."""
    import importlib.util
    import marshal

    code = compile(code_text, str(source), "exec", dont_inherit=True)
    st = source.stat()
    if unchecked:
        header = (1).to_bytes(4, "little") + importlib.util.source_hash(source.read_bytes())
    else:
        header = (0).to_bytes(4, "little") + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(
            4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")  # fmt: skip
    pyc = Path(importlib.util.cache_from_source(str(source)))
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(importlib.util.MAGIC_NUMBER + header + marshal.dumps(code))
    return pyc


@pytest.mark.parametrize("unchecked", [False, True], ids=["timestamp", "unchecked-hash"])
def test_bytecode_that_is_not_its_source(
    release: Path, services: list[Service], tmp_path: Path, unchecked: bool
) -> None:
    """A build (or anyone who may write the release) leaves bytecode for a tracked source
    that Python loads instead of it: the frames name the tracked file, the code is other."""
    source = release / "stackpkg" / "server.py"
    marker = tmp_path / "ran-the-bytecode"
    text = source.read_text().replace(
        'print("ready", flush=True)', f'open({str(marker)!r}, "w"); print("ready", flush=True)'
    )
    pyc = _doctored_pyc(source, text, unchecked)
    s = serve(services, release)
    assert marker.exists()  # the interpreter ran the bytecode, not the source
    report = verify(s.pid, expect(release))
    found = [f for f in report.findings if f.check == "bytecode of stackpkg/server.py"]
    assert found
    assert str(pyc) in found[0].found
    assert ("unchecked hash" if unchecked else "timestamp") in found[0].found
    # bytecode the interpreter wrote from the source itself is no finding
    pyc.unlink()
    s.stop()
    services.remove(s)
    again = serve(services, release, PYTHONDONTWRITEBYTECODE="")
    assert not [f for f in verify(again.pid, expect(release)).findings if "bytecode" in f.check]


@needs_py_spy
def test_borrowed_code_made_only_of_lambdas_and_generators(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """Foreign source exec'd under the release's server.py name with no def at all:
    its lambda and generator frames are checked against that file's own, which has none."""
    foreign = tmp_path / "payload.py"
    foreign.write_text(
        "import time\n\n\n\n\n\n\n\nspin = lambda: any(time.sleep(0.05) for _ in iter(int, 1))\n"
    )
    s = serve(services, release, HOSTILE="exec-borrowed", FOREIGN=str(foreign))
    report = verify(s.pid, expect(release))
    mismatch = [f for f in report.findings if f.check == "frame does not match its file"]
    assert {m.expected.split(" spanning")[0] for m in mismatch} >= {
        "a def or class <lambda>",
        "a def or class <genexpr>",
    }


def test_untracked_code_in_the_release_is_found_even_when_idle(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """An untracked ``mmap.py`` in the release shadows the standard module for an ``-m``
    launch: it runs at the first import and may then sit idle, unseen by any frame."""
    marker = tmp_path / "shadow-ran"
    (release / "mmap.py").write_text(
        f"open({str(marker)!r}, 'w')\n"
        "import sys\ndel sys.modules['mmap']\nsys.path.pop(0)\nimport mmap as _real\n"
        "sys.modules['mmap'] = _real\n"
    )
    s = serve(services, release)
    assert marker.exists()
    report = verify(s.pid, expect(release))
    assert "untracked code mmap.py" in checks(report)


def test_an_untracked_link_to_a_package_directory_is_untracked_code(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """git lists a symbolic link to a directory as a plain name (``mmap``, no suffix), and
    Python imports the package behind it ahead of the standard module."""
    marker = tmp_path / "shadow-ran"
    package = tmp_path / "elsewhere" / "mmap"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w')\n"
        "import sys\ndel sys.modules['mmap']\nsys.path.pop(0)\nimport mmap as _real\n"
        "sys.modules['mmap'] = _real\n"
    )
    (release / "mmap").symlink_to(package)
    (release / "notes.txt").symlink_to(tmp_path / "elsewhere")  # a directory of code
    (release / "settings.yaml").symlink_to(package / "__init__.py")
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"\0" * 16)
    (weights / "config.json").write_text("{}")
    (release / "models").symlink_to(weights)  # data, not code
    s = serve(services, release)
    assert marker.exists()  # the linked package ran
    found = checks(verify(s.pid, expect(release)))
    assert "untracked code mmap" in found
    assert "untracked code notes.txt" in found  # a directory, whatever its name
    assert "untracked code settings.yaml" not in found  # a linked file Python cannot import
    assert "untracked code models" not in found


def test_an_undeclared_pythonpath_outside_the_roots_is_a_finding(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    s = serve(services, release, PYTHONPATH=str(elsewhere))
    report = verify(s.pid, expect(release))
    found = [f for f in report.findings if f.check == "PYTHONPATH"]
    assert found
    assert found[0].found == str(elsewhere)
    # declared by the launch with this very value: the launch's choice, no finding
    declared = verify(s.pid, expect(release, declared_env={"PYTHONPATH": str(elsewhere)}))
    assert "PYTHONPATH" not in checks(declared)


#: exec the service with PYTHONPATH twice: getenv() and os.environ take the first copy, a
#: dict built from /proc/PID/environ in order would take the last
TWICE = """
import ctypes, os, sys
env = [b"PYTHONPATH=" + sys.argv[1].encode()]
env += [f"{k}={v}".encode() for k, v in os.environ.items()]
env += [b"PYTHONPATH=" + sys.argv[2].encode()]
argv = [sys.executable.encode(), b"-m", b"stackpkg.server", sys.argv[3].encode()]
A, E = ctypes.c_char_p * (len(argv) + 1), ctypes.c_char_p * (len(env) + 1)
ctypes.CDLL(None).execve(argv[0], A(*argv, None), E(*env, None))
"""


def test_an_environment_that_gives_a_name_twice_is_read_as_python_reads_it(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    argv = [sys.executable, "-c", TWICE, str(elsewhere), str(release)]
    s = serve(services, release, argv=argv)
    assert read_process(s.pid) is not None
    raw = Path(f"/proc/{s.pid}/environ").read_bytes()
    assert raw.count(b"\0PYTHONPATH=") + raw.startswith(b"PYTHONPATH=") == 2
    report = verify(s.pid, expect(release))
    assert "environment PYTHONPATH" in checks(report)  # given twice
    path = [f for f in report.findings if f.check == "PYTHONPATH"]
    assert path
    assert path[0].found == str(elsewhere)  # the copy Python uses: the first


def test_the_resolver_never_imports_its_own_modules_from_the_release(
    release: Path, services: list[Service], tmp_path: Path
) -> None:
    """The resolver starts where the service started (the release, first on sys.path for
    ``-m``): its own ``import json`` must not run a ``json/`` planted there."""
    marker = tmp_path / "servegate-ran-it"
    (release / "json").mkdir()
    (release / "json" / "__init__.py").write_text(f"open({str(marker)!r}, 'w')\n")
    s = serve(services, release, argv=[sys.executable, "-m", "stackpkg.server"])
    assert not marker.exists()  # the service itself never imports json
    report = verify(s.pid, expect(release, py_spy="/nonexistent/py-spy"))
    assert not marker.exists()
    assert report.modules["stackpkg"] == str(release / "stackpkg" / "__init__.py")
    assert "untracked code json/__init__.py" in checks(report)


def test_bytecode_differing_only_in_a_qualified_name_is_found(
    release: Path, services: list[Service]
) -> None:
    """Code objects compare equal without their qualified names (what a frame shows):
    bytecode that renames a function is still not its source."""
    import importlib.util
    import marshal
    import types

    source = release / "stackpkg" / "server.py"
    code = compile(source.read_bytes(), str(source), "exec", dont_inherit=True)
    consts = tuple(
        c.replace(co_qualname="Elsewhere.main")
        if isinstance(c, types.CodeType) and c.co_name == "main" else c
        for c in code.co_consts
    )  # fmt: skip
    renamed = code.replace(co_consts=consts)
    assert renamed == code  # what plain equality would let through
    st = source.stat()
    header = (0).to_bytes(4, "little") + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
    header += (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    pyc = Path(importlib.util.cache_from_source(str(source)))
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(importlib.util.MAGIC_NUMBER + header + marshal.dumps(renamed))
    s = serve(services, release)
    report = verify(s.pid, expect(release))
    assert "bytecode of stackpkg/server.py" in checks(report)


SETUPTOOLS_PTH = (
    "import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os.environ.get(var, 'local') == "
    "'local'; enabled and __import__('_distutils_hack').add_shim(); "
)


@pytest.mark.parametrize(
    ("code", "why"),
    [
        (SETUPTOOLS_PTH, ""),  # setuptools' own .pth, in nearly every venv
        ("import os", ""),
        ("import coverage; coverage.process_startup()", ""),
        ("import sys; a = getattr(sys, 'orig_' + 'ar' + 'gv')", "computes the name"),
        ("import sys; a = sys.__dict__['orig_' + 'ar' + 'gv']", "uses __dict__"),
        ("import sys; a = vars(sys)['x']", "reads a namespace as a dict"),
        ("__import__('ru' + 'npy')", "computes the name it passes to __import__"),
        ("import importlib.machinery as m; m.SourceFileLoader('x', '/tmp/x.py')", "uses Source"),
        ("import sys; sys.path.insert(0, '/tmp'); import x", "changes sys.path in code"),
        ("import sys; sys.path[:0] = ['/tmp']", "changes sys.path in code"),
        ("import sys, x; sys.modules['vllm'] = x", "changes sys.modules in code"),
        ("import builtins; builtins.print = None", "uses builtins"),
        ("import sys; sys.meta_path.insert(0, object())", "meta_path"),
        ("def (", "is not Python"),
    ],
)
def test_a_hook_that_hides_what_it_does_is_named_however_it_is_spelled(code: str, why: str) -> None:
    """A start-up hook is judged by its text; text built to say nothing (a computed name,
    a namespace read as a dict, a file loaded as a module, the import system changed in
    code) is itself the finding, whatever words it avoids."""
    found = hooks.hidden(code)
    assert (why in found) if why else found == "", found
