"""The GPU health rules on snapshots and kernel logs made here, and the gate's rule for a
measurement on sick GPUs (docs/gpu-health.md). The tools' real outputs are read in
test_health_tools.py."""

from __future__ import annotations

import json
from pathlib import Path

from servegate.gpu import health
from servegate.gpu.health import Expect, Gpu, Process, Snapshot
from servegate.release.gate import on_healthy_gpus


def gpu(**kw: object) -> Gpu:
    base: dict[str, object] = {
        "index": 0, "name": "NVIDIA H100 80GB HBM3", "bus": "00000000:19:00.0", "arch": "sm_90",
        "memory_total_mib": 81559.0, "memory_used_mib": 1.0, "temperature_c": 30.0,
        "temperature_limit_c": 87.0, "power_w": 70.0, "power_limit_w": 700.0,
        "ecc_uncorrectable": 0, "pages_pending": 0,
    }  # fmt: skip
    base.update(kw)
    return Gpu(**base)  # type: ignore[arg-type]


def judged(*gpus: Gpu, **expect: object) -> Snapshot:
    snap = Snapshot(at=health.now(), tool="nvidia-smi", driver="550.54.15", runtime="12.4")
    snap.gpus = list(gpus)
    health.judge(snap, Expect(**expect))  # type: ignore[arg-type]
    return snap


def checks(snap: Snapshot) -> list[str]:
    return [f.check for f in snap.failures]


def test_a_quiet_gpu_is_healthy() -> None:
    snap = judged(gpu(), count=1, archs=("sm_90",), driver="550.", runtime="12.")
    assert snap.healthy, snap.findings


def test_each_sickness_is_a_finding_that_says_what_to_do() -> None:
    cases = {
        "count": (judged(gpu(), count=4), "1 GPU(s) visible, the config expects 4"),
        "arch": (judged(gpu(), archs=("gfx1030",)), "is sm_90; the stack is built for gfx1030"),
        "ecc": (judged(gpu(ecc_uncorrectable=3)), "3 uncorrectable ECC error(s)"),
        "pages": (judged(gpu(pages_pending=1)), "pending retirement or remap"),
        "throttle": (judged(gpu(throttle=["power brake (external power)"])), "power brake"),
        "temperature": (judged(gpu(temperature_c=84.0)), "within 5 C of its slowdown at 87 C"),
        "power": (judged(gpu(power_w=760.0)), "760 W over its limit of 700 W"),
        "driver": (judged(gpu(), driver="535."), "driver 550.54.15, the stack was built for 535."),
        "runtime": (judged(gpu(), runtime="11."), "runtime 12.4"),
    }
    for check, (snap, words) in cases.items():
        assert checks(snap) == [check], (check, snap.findings)
        (finding,) = snap.failures
        assert words in finding.what, finding
        assert finding.do, finding


def test_memory_held_by_no_process_is_a_dead_jobs_and_busy_gpus_fail_an_idle_check() -> None:
    live = gpu(memory_used_mib=60_000.0, processes=[Process(4242, "python", 59_500.0)])
    assert judged(live).healthy  # the live service holds it: fine during a promote
    dead = gpu(memory_used_mib=60_000.0, processes=[])
    (finding,) = judged(dead).failures
    assert "60000 MiB in use by no process" in finding.what
    busy = judged(live, busy_ok=False)
    assert checks(busy) == ["memory"]
    assert "4242 python (59500 MiB)" in busy.failures[0].what


def test_a_missing_or_failing_tool_is_never_a_pass(tmp_path: Path) -> None:
    none = health.check(Expect(), which=lambda name: None, kernel_log=lambda: "")
    assert not none.healthy
    assert checks(none) == ["tool"]

    def broken(argv: object, timeout: float) -> str:
        raise health.ToolFailed("nvidia-smi -q -x exited 9: Unable to determine the device handle")

    failing = health.check(
        Expect(), run=broken, which=lambda n: f"/usr/bin/{n}" if n == "nvidia-smi" else None,
        kernel_log=lambda: "",
    )  # fmt: skip
    assert checks(failing) == ["tool"]
    assert "Unable to determine the device handle" in failing.failures[0].what
    changed = health.check(
        Expect(), run=lambda argv, timeout: "<nvidia_smi_log><gpu>", which=lambda n: (
            f"/usr/bin/{n}" if n == "nvidia-smi" else None), kernel_log=lambda: "",
    )  # fmt: skip
    assert checks(changed) == ["tool"]
    assert "is not XML" in changed.failures[0].what
    empty = health.check(
        Expect(), run=lambda argv, timeout: "<nvidia_smi_log></nvidia_smi_log>",
        which=lambda n: f"/usr/bin/{n}" if n == "nvidia-smi" else None, kernel_log=lambda: "",
    )  # fmt: skip
    assert checks(empty) == ["tool"]  # no GPU and no count of them: nothing usable


XID_LOG = """\
2026-12-07T09:00:00+0000 box kernel: NVRM: Xid (PCI:0000:19:00): 79, pid=1234, GPU has fallen off the bus.
2026-12-07T09:00:01+0000 box kernel: usb 1-1: new device
2026-12-07T11:30:00+0000 box kernel: NVRM: Xid (PCI:0000:19:00): 48, pid=99, An uncorrectable double bit error
2026-12-07T11:31:00,123456+00:00 box kernel: amdgpu 0000:03:00.0: amdgpu: GPU reset begin!
"""


def test_kernel_log_faults_stay_until_acknowledged_and_an_unreadable_log_is_said(
    tmp_path: Path,
) -> None:
    snap = Snapshot(at=health.now())
    health._kernel_errors(snap, lambda: XID_LOG)
    assert [f.what.split(" in the kernel log")[0] for f in snap.failures] == [
        "1 x Xid 79", "1 x Xid 48", "1 x amdgpu error",
    ]  # fmt: skip
    # a fault before the last check was seen by it (and kept): not read again
    later = Snapshot(at=health.now())
    health._kernel_errors(later, lambda: XID_LOG, {"at": "2026-12-07T10:00:00Z"})
    assert [f.what.split(" in the kernel log")[0] for f in later.failures] == [
        "1 x Xid 48", "1 x amdgpu error",
    ]  # fmt: skip
    # a last check in the future (a clock set back, a planted file) skips nothing
    planted = Snapshot(at=health.now())
    health._kernel_errors(planted, lambda: XID_LOG, {"at": "2999-01-01T00:00:00Z"})
    assert len(planted.failures) == 3
    blind = Snapshot(at=health.now())
    health._kernel_errors(blind, lambda: None)
    assert blind.healthy
    assert [f.check for f in blind.findings] == ["xid"]
    assert "cannot be read" in blind.findings[0].what

    # the first check to read a fault does not use it up: every later check reports it
    # until it is acknowledged (after the GPU was reset)
    last = tmp_path / "state" / "gpu-health.json"
    first = health.check(Expect(), which=lambda n: None, kernel_log=lambda: XID_LOG, last=last)
    assert sum(f.check == "xid" for f in first.failures) == 3
    again = health.check(Expect(), which=lambda n: None, kernel_log=lambda: XID_LOG, last=last)
    assert sum(f.check == "xid" for f in again.failures) == 3
    unread = health.check(Expect(), which=lambda n: None, kernel_log=lambda: None, last=last)
    assert sum(f.check == "xid" and f.severity == "fail" for f in unread.findings) == 3
    assert len(health.acknowledge(last)) == 3
    after = health.check(Expect(), which=lambda n: None, kernel_log=lambda: XID_LOG, last=last)
    assert not any(f.check == "xid" for f in after.failures)
    fresh = XID_LOG + "2999-01-01T00:00:00+0000 box kernel: NVRM: Xid (PCI:0000:19:00): 13, x\n"
    new = health.check(Expect(), which=lambda n: None, kernel_log=lambda: fresh, last=last)
    assert [f.what.split(" in")[0] for f in new.failures if f.check == "xid"] == ["1 x Xid 13"]


def test_too_little_disk_under_the_host_root(tmp_path: Path) -> None:
    snap = Snapshot(at=health.now())
    health._disk(snap, Expect(root=str(tmp_path / "not-yet"), min_free_disk_gib=10**9))
    (finding,) = snap.failures
    assert finding.check == "disk"
    assert "GiB free under" in finding.what


def test_a_measurement_on_sick_gpus_is_inconclusive_never_a_pass_or_a_fail(
    tmp_path: Path,
) -> None:
    well = judged(gpu())
    sick = judged(gpu(ecc_uncorrectable=2))
    result = tmp_path / "bench.json"
    result.write_text(json.dumps({"schema": 1, "cases": []}))
    for verdict in ("PASS", "FAIL"):
        evidence = {"verdict": verdict, "why": "the rows say so", "result_file": str(result)}
        out = on_healthy_gpus(dict(evidence), well, sick)
        assert out["verdict"] == "INCONCLUSIVE"
        assert "not healthy after the measurement" in out["why"]
        assert f"the measurement alone: {verdict}" in out["why"]
        assert out["gpu_health"]["after"]["healthy"] is False
    kept = on_healthy_gpus({"verdict": "PASS", "why": "ok", "result_file": str(result)}, well, well)
    assert kept["verdict"] == "PASS"
    assert json.loads(result.read_text())["gpu_health"]["before"]["healthy"] is True
    assert on_healthy_gpus({"verdict": "FAIL", "why": "x"}, None, None) == {
        "verdict": "FAIL",
        "why": "x",
    }
