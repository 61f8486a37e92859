"""The dynamic loader's configured directories are system library directories: a GPU
driver the box's ld.so.conf names (an NVIDIA container's /usr/local/nvidia/lib64) is
runtime code; a configuration file a neighbour could have written names nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servegate.provenance import codeorigin
from servegate.provenance.liveproc import Expectation

pytestmark = pytest.mark.skipif(
    os.getuid() != 0, reason="the loader's configuration counts only when root owns it"
)


def _conf(tmp_path: Path) -> Path:
    (tmp_path / "ld.so.conf.d").mkdir()
    conf = tmp_path / "ld.so.conf"
    conf.write_text("# the box's loader\ninclude ld.so.conf.d/*.conf\n/usr/local/lib\n")
    (tmp_path / "ld.so.conf.d" / "nvidia.conf").write_text("/usr/local/nvidia/lib64 # driver\n")
    (tmp_path / "ld.so.conf.d" / "zz-cuda.conf").write_text("/usr/local/cuda-13.0/lib\n")
    for f in (conf, *(tmp_path / "ld.so.conf.d").iterdir()):
        f.chmod(0o644)
    return conf


def test_the_loaders_directories_follow_its_includes(tmp_path: Path) -> None:
    found = codeorigin.loader_dirs(_conf(tmp_path))
    assert found == [
        Path("/usr/local/nvidia/lib64"),
        Path("/usr/local/cuda-13.0/lib"),
        Path("/usr/local/lib"),
    ]
    assert codeorigin.loader_dirs(tmp_path / "absent.conf") == []


def test_a_configuration_file_others_may_write_names_nothing(tmp_path: Path) -> None:
    conf = _conf(tmp_path)
    planted = tmp_path / "ld.so.conf.d" / "planted.conf"
    planted.write_text(f"{tmp_path / 'drop'}\n")
    planted.chmod(0o666)
    assert Path(tmp_path / "drop") not in codeorigin.loader_dirs(conf)
    conf.chmod(0o666)  # the top file itself: nothing it includes counts either
    assert codeorigin.loader_dirs(conf) == []


def test_a_library_in_a_loader_directory_is_runtime_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = tmp_path / "nvidia" / "lib64"
    driver.mkdir(parents=True)
    (driver / "libcuda.so.1").write_bytes(b"\x7fELF")
    conf = tmp_path / "ld.so.conf"
    conf.write_text(f"{driver}\n")
    conf.chmod(0o644)
    exp = Expectation(release_dir=tmp_path / "release", interpreter="/usr/bin/python3")
    where = codeorigin.Where(exp, codeorigin.runtime_roots(exp), None, frozenset())
    assert where.classify(str(driver / "libcuda.so.1"))[0] == "foreign"
    monkeypatch.setattr(codeorigin, "LD_SO_CONF", conf)
    where = codeorigin.Where(exp, codeorigin.runtime_roots(exp), None, frozenset())
    assert where.classify(str(driver / "libcuda.so.1")) == ("runtime", str(driver))
