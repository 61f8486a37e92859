"""The vendors' tools' outputs read as the box's GPUs: AMD's amd-smi JSON (fixtures
written from the CLI's source, fixtures/amd/SOURCES.md), NVIDIA's nvidia-smi XML
(fixtures/nvidia-*.xml), and the runner hooks and the command against a stand-in
``nvidia-smi`` on PATH that prints a fixture (the tool is the edge). The real nvidia-smi
is read by the ``gpu`` test at the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from servegate.gpu import health
from servegate.gpu.health import Expect

FIXTURES = Path(__file__).parent / "fixtures"
AMD = FIXTURES / "amd"


def amd_runner(files: dict[str, str], where: Path = AMD) -> health.Runner:
    def run(argv: Sequence[str], timeout: float) -> str:
        command = argv[1]
        if command not in files:
            raise health.ToolFailed(f"amd-smi {command} exited 1")
        path = where / files[command]
        return (path if path.exists() else AMD / files[command]).read_text()

    return run


AMD_FILES = {
    "static": "amd-smi-static.json", "metric": "amd-smi-metric.json",
    "process": "amd-smi-process.json", "bad-pages": "amd-smi-bad-pages.json",
    "version": "amd-smi-version.json",
}  # fmt: skip


def amd_check(files: dict[str, str], where: Path = AMD, **expect: object) -> health.Snapshot:
    return health.check(
        Expect(**expect),  # type: ignore[arg-type]
        run=amd_runner(files, where),
        which=lambda n: f"/opt/rocm/bin/{n}" if n == "amd-smi" else None,
        kernel_log=lambda: "",
    )


def test_two_v620s_read_from_amd_smi() -> None:
    snap = amd_check(AMD_FILES, count=2, archs=("gfx1030",))
    assert snap.tool == "amd-smi"
    assert snap.runtime == "6.3.0"
    assert [g.arch for g in snap.gpus] == ["gfx1030", "gfx1030"]
    first, second = snap.gpus
    assert first.bus == "0000:03:00.0"
    assert first.memory_total_mib == 32752
    assert [(p.name, round(p.memory_mib)) for p in first.processes] == [("python3", 8192)]
    assert second.processes == []
    assert first.temperature_limit_c is not None
    assert first.power_limit_w == 300
    assert first.ecc_uncorrectable == 0
    # the fixture's GPU 0 has one page pending retirement: that is the one finding
    assert [(f.check, f.gpu) for f in snap.failures] == [("pages", "0 (0000:03:00.0)")]


def test_rocm7s_wrapped_lists_read_alike() -> None:
    wrapped = {**AMD_FILES, "static": "amd-smi-static.rocm7-gpu_data.json",
               "metric": "amd-smi-metric.rocm7-gpu_data.json"}  # fmt: skip
    assert [g.arch for g in amd_check(wrapped).gpus] == ["gfx1030", "gfx1030"]


def test_amd_sickness_and_broken_output_are_findings(tmp_path: Path) -> None:
    metric = json.loads((AMD / "amd-smi-metric.json").read_text())
    metric[1]["ecc"]["total_uncorrectable_count"] = 2
    metric[1]["power"]["throttle_status"] = "THROTTLED"
    metric[1]["mem_usage"]["used_vram"] = {"value": 9000, "unit": "MB"}
    (tmp_path / "metric.json").write_text(json.dumps(metric))
    snap = amd_check({**AMD_FILES, "metric": "metric.json"}, tmp_path, archs=("gfx942",))
    by_gpu = {(f.gpu.split()[0], f.check) for f in snap.failures}
    assert {
        ("1", "ecc"),
        ("1", "throttle"),
        ("1", "memory"),
        ("0", "arch"),
        ("1", "arch"),
    } <= by_gpu
    broken = amd_check({**AMD_FILES, "metric": "amd-smi-version.json"})
    assert [f.check for f in broken.failures] == ["tool"]
    assert "not a list of GPUs" in broken.failures[0].what


def nvidia_check(xml: str, caps: str = "", **expect: object) -> health.Snapshot:
    def run(argv: Sequence[str], timeout: float) -> str:
        return xml if "-q" in argv else caps

    return health.check(
        Expect(**expect),  # type: ignore[arg-type]
        run=run,
        which=lambda n: f"/usr/bin/{n}" if n == "nvidia-smi" else None,
        kernel_log=lambda: "",
    )


def test_an_older_drivers_names_and_every_sickness_read_from_nvidia_smi() -> None:
    """An older driver's element names, made here (fixtures/nvidia-made-sick.xml):
    throttle reasons, power readings, retired pages and double-bit ECC are read under
    them, and a GPU the driver lost (2 attached, 1 reported) is found."""
    xml = (FIXTURES / "nvidia-made-sick.xml").read_text()
    snap = nvidia_check(xml, "00000000:3B:00.0, 7.0\n", archs=("sm_90",), driver="550.")
    (gpu,) = snap.gpus
    assert (gpu.arch, gpu.ecc_uncorrectable, gpu.pages_pending) == ("sm_70", 2, 1)
    assert gpu.throttle == ["hardware slowdown", "hardware thermal slowdown"]  # not the cap
    assert (gpu.power_w, gpu.power_limit_w) == (320.5, 300.0)
    found = {f.check for f in snap.failures}
    assert found == {"count", "arch", "driver", "memory", "ecc", "pages", "throttle",
                     "temperature", "power"}  # fmt: skip
    memory = next(f for f in snap.failures if f.check == "memory")
    assert "16384 MiB in use by no process" in memory.what


FAKE_SMI = """#!/bin/sh
case "$*" in
  *-q*) cat "{xml}" ;;
  *compute_cap*) echo "{bus}, {cap}" ;;
  *) exit 2 ;;
esac
"""


def fake_smi(tmp_path: Path, xml: Path, bus: str = "00000000:3B:00.0", cap: str = "7.0") -> Path:
    """A directory with a stand-in ``nvidia-smi`` that prints ``xml``: the tool is the
    edge of the hooks under test."""
    where = tmp_path / "bin"
    where.mkdir(exist_ok=True)
    tool = where / "nvidia-smi"
    tool.write_text(FAKE_SMI.format(xml=xml, bus=bus, cap=cap))
    tool.chmod(0o755)
    return where


def hook(event: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servegate", "runner", "hook", event],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_runner_refuses_a_job_on_sick_gpus_and_takes_itself_offline_after_one(
    tmp_path: Path,
) -> None:
    sick = FIXTURES / "nvidia-made-sick.xml"
    well = tmp_path / "well.xml"
    text = sick.read_text()
    for old, new in [("<attached_gpus>2", "<attached_gpus>1"), ("20480 MiB</used>", "1 MiB</used>"),
                     (">Active<", ">Not Active<"), ("<total>2</total>", "<total>0</total>"),
                     ("<device_memory>2<", "<device_memory>0<"), ("Yes", "No"),
                     ("86 C", "40 C"), ("320.50 W", "70 W")]:  # fmt: skip
        text = text.replace(old, new)
    text = text.replace("<processes>", "<processes><!--").replace("</processes>", "--></processes>")
    well.write_text(text)
    state = tmp_path / "state"
    env = {**os.environ, "PATH": f"{fake_smi(tmp_path, well)}:{os.environ['PATH']}",
           "SERVEGATE_RUNNER": "box-gpu-1", "XDG_STATE_HOME": str(state),
           "GITHUB_WORKSPACE": str(tmp_path / "ws")}  # fmt: skip
    (tmp_path / "ws").mkdir()
    started = hook("started", env)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "GPUs healthy: 1 GPU(s) by nvidia-smi" in started.stdout

    # the job leaves the GPU sick: the runner takes itself offline and fails the job
    shutil.copy(sick, well)
    done = hook("completed", env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "takes itself offline" in done.stdout
    assert "uncorrectable ECC" in done.stdout
    assert "servegate runner online box-gpu-1" in done.stdout

    # every later job is refused, whatever the GPUs say now, until it is taken back
    well.write_text(text)
    refused = hook("started", env)
    assert refused.returncode == 1
    assert "is offline since" in refused.stdout
    back = subprocess.run(
        [sys.executable, "-m", "servegate", "runner", "online", "box-gpu-1"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert back.returncode == 0, back.stdout + back.stderr
    assert "online again" in back.stdout
    assert hook("started", env).returncode == 0

    # still sick: taking it back is refused, and it stays offline
    shutil.copy(sick, well)
    assert hook("completed", env).returncode == 1
    again = subprocess.run(
        [sys.executable, "-m", "servegate", "runner", "online", "box-gpu-1"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 23
    assert hook("started", env).returncode == 1


def test_gpu_health_command_and_a_tool_that_hangs(tmp_path: Path) -> None:
    bin_dir = fake_smi(tmp_path, FIXTURES / "nvidia-made-sick.xml")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "XDG_STATE_HOME": str(tmp_path / "state")}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "servegate", "gpu", "health", "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 23, done.stderr
    doc = json.loads(done.stdout)
    assert doc["exit_code"] == 23
    assert doc["result"]["healthy"] is False
    assert {"ecc", "pages"} <= {f["check"] for f in doc["result"]["findings"]}
    # a tool that hangs past gpu.timeout is unhealthy, not a pass
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nsleep 30\n")
    (tmp_path / "servegate.toml").write_text(
        f'[stack]\nremote = "x"\n[host]\nroot = "{tmp_path / "host"}"\n'
        '[service]\nport = 8000\ncommand = ["true"]\n[gpu]\ntimeout = 1.0\n'
    )
    hung = subprocess.run(
        [sys.executable, "-m", "servegate", "gpu", "health", "--json"],
        env=env, capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert hung.returncode == 23, hung.stdout + hung.stderr
    (finding,) = [f for f in json.loads(hung.stdout)["result"]["findings"] if f["check"] == "tool"]
    assert "did not answer within 1 s" in finding["what"]


ROCMINFO = """\
*******
Agent 1
*******
  Name:                    AMD EPYC 7763 64-Core Processor
  Device Type:             CPU
*******
Agent 2
*******
  Name:                    gfx1030
  Marketing Name:          AMD Radeon PRO V620
  Device Type:             GPU
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx1030
*******
Agent 3
*******
  Name:                    gfx1030
  Device Type:             GPU
"""


def test_rocm_smi_alone_is_a_weaker_check_that_still_judges_count_arch_and_memory() -> None:
    def run(argv: Sequence[str], timeout: float) -> str:
        if argv[0] == "rocminfo":
            return ROCMINFO
        return (AMD / "rocm-smi-showallinfo.json").read_text()

    def which(name: str) -> str | None:
        return f"/opt/rocm/bin/{name}" if name == "rocm-smi" else None

    snap = health.check(Expect(count=2, archs=("gfx1030",)), run=run, which=which,
                        kernel_log=lambda: "")  # fmt: skip
    assert snap.tool == "rocm-smi"
    assert [g.arch for g in snap.gpus] == ["gfx1030", "gfx1030"]
    assert snap.healthy, snap.failures
    assert [f.check for f in snap.findings if f.severity == "warn"] == ["tool"]
    assert [(p.pid, round(p.memory_mib)) for p in snap.gpus[0].processes] == [(48213, 8192)]
    busy = health.check(Expect(busy_ok=False, count=4), run=run, which=which,
                        kernel_log=lambda: "")  # fmt: skip
    assert {f.check for f in busy.failures} == {"memory", "count"}


def test_a_fault_the_jobs_own_check_saw_still_takes_the_runner_offline(tmp_path: Path) -> None:
    """The job runs ``servegate gpu health`` itself and sees an Xid: the completed hook
    must see it too (a fault is not used up by the first reader), and taking the runner
    back needs the fault acknowledged after a reset."""
    well = tmp_path / "well.xml"
    well.write_text(
        (FIXTURES / "nvidia-made-sick.xml").read_text()
        .replace("<attached_gpus>2", "<attached_gpus>1").replace("20480 MiB</used>", "1 MiB</used>")
        .replace(">Active<", ">Not Active<").replace("<total>2</total>", "<total>0</total>")
        .replace("<device_memory>2<", "<device_memory>0<").replace("Yes", "No")
        .replace("86 C", "40 C").replace("320.50 W", "70 W")
        .replace("<processes>", "<processes><!--").replace("</processes>", "--></processes>")
    )  # fmt: skip
    bin_dir = fake_smi(tmp_path, well)
    journal = bin_dir / "journalctl"
    journal.write_text(
        "#!/bin/sh\necho '2026-12-07T09:00:00+0000 box kernel: NVRM: Xid (PCI:0000:3b:00): "
        "48, pid=7, An uncorrectable double bit error'\n"
    )
    journal.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "SERVEGATE_RUNNER": "box-gpu-2", "XDG_STATE_HOME": str(tmp_path / "state"),
           "GITHUB_WORKSPACE": str(tmp_path / "ws")}  # fmt: skip
    (tmp_path / "ws").mkdir()

    def servegate(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "servegate", *argv], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip

    assert servegate("gpu", "health").returncode == 23  # the job's own step saw it
    done = hook("completed", env)
    assert done.returncode == 1, done.stdout
    assert "Xid 48" in done.stdout
    assert servegate("runner", "online", "box-gpu-2").returncode == 23  # not acknowledged
    acked = servegate("gpu", "health", "--acknowledge")
    assert acked.returncode == 0, acked.stdout + acked.stderr
    assert "1 kernel-log fault(s) acknowledged" in acked.stdout
    assert servegate("runner", "online", "box-gpu-2").returncode == 0
    assert hook("started", env).returncode == 0
    assert hook("started", {**env, "SERVEGATE_RUNNER": "../../escape"}).returncode != 0


def test_what_a_lost_or_wedged_gpu_prints_is_never_healthy() -> None:
    base = (FIXTURES / "nvidia-made-sick.xml").read_text()
    lost = base.replace("<product_name>Tesla V100-SXM2-32GB</product_name>",
                        "<product_name>Unknown Error</product_name>")  # fmt: skip
    assert "tool" in {f.check for f in nvidia_check(lost).failures}
    empty = '<nvidia_smi_log><attached_gpus>1</attached_gpus><gpu id="0"/></nvidia_smi_log>'
    assert "tool" in {f.check for f in nvidia_check(empty).failures}
    reset = base.replace("</product_name>", "</product_name><gpu_reset_status><reset_required>"
                         "Yes</reset_required></gpu_reset_status>")  # fmt: skip
    assert any("reset_required" in f.what for f in nvidia_check(reset).failures)
    huge = base.replace("<pid>4321</pid>", f"<pid>{'9' * 400}</pid>")
    assert not nvidia_check(huge).healthy  # read, not a crash
    negative = base.replace("<device_memory>2</device_memory><total>2</total>",
                            "<device_memory>-5</device_memory><total>-5</total>")  # fmt: skip
    assert "tool" in {f.check for f in nvidia_check(negative).failures}
    unknown_arch = nvidia_check(base, "", archs=("sm_70",))
    assert any(f.check == "arch" and "cannot be read" in f.what for f in unknown_arch.failures)


def test_a_tool_that_prints_bytes_floods_or_leaves_a_child_is_cut_off(tmp_path: Path) -> None:
    bad = tmp_path / "bad-bytes"
    bad.write_text("#!/bin/sh\nprintf '\\377\\376 not text'\n")
    flood = tmp_path / "flood"
    flood.write_text("#!/bin/sh\nexec yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n")
    child = tmp_path / "child"
    child.write_text("#!/bin/sh\n(sleep 60; echo late) &\necho early\n")
    notexe = tmp_path / "not-executable-format"
    notexe.write_bytes(b"\x7fELF garbage")
    for tool in (bad, flood, child, notexe):
        tool.chmod(0o755)
    assert "not text" in health.run_tool([str(bad)], 10)
    start = time.monotonic()
    with pytest.raises(health.ToolFailed, match="printed more than|did not answer"):
        health.run_tool([str(flood)], 20)
    assert time.monotonic() - start < 25
    start = time.monotonic()
    assert health.run_tool([str(child)], 10).strip() == "early"  # its child is ended
    assert time.monotonic() - start < 8
    with pytest.raises(health.ToolFailed, match="cannot run"):
        health.run_tool([str(notexe)], 10)


def test_a_real_h100s_report_reads_as_one_healthy_gpu_and_its_process() -> None:
    """nvidia-smi -q -x captured on one H100 (driver 580, CUDA 13.0) by the gpu tests
    (fixtures/nvidia-h100-*.xml): its temperature limit comes as T.Limit margins, its
    power as average and instant draws."""
    caps = "00000000:00:06.0, 9.0\n"
    idle = nvidia_check((FIXTURES / "nvidia-h100-idle.xml").read_text(), caps, count=1,
                        archs=("sm_90",), driver="580.", runtime="13.", busy_ok=False)  # fmt: skip
    assert idle.healthy, idle.findings
    (gpu,) = idle.gpus
    assert (gpu.name, gpu.arch, gpu.memory_total_mib) == ("NVIDIA H100 80GB HBM3", "sm_90", 81559)
    assert gpu.temperature_limit_c is not None
    assert gpu.temperature_c is not None
    assert 80 <= gpu.temperature_limit_c <= 95  # its slowdown, from the T.Limit margin
    assert gpu.power_limit_w == 700
    assert (gpu.ecc_uncorrectable, gpu.pages_pending, gpu.pages_failed) == (0, 0, False)
    busy_xml = (FIXTURES / "nvidia-h100-busy.xml").read_text()
    busy = nvidia_check(busy_xml, caps, archs=("sm_90",))
    assert busy.healthy, busy.findings  # a process may hold it (a live service)
    (held,) = busy.gpus[0].processes
    assert held.pid == 849
    assert held.memory_mib >= 2048
    refused = nvidia_check(busy_xml, caps, busy_ok=False)
    assert [f.check for f in refused.failures] == ["memory"]
