"""Is this box's GPU fit to run a job, or to measure a release? (``servegate gpu health``,
docs/gpu-health.md)

One snapshot of every GPU through the vendor's own tool — NVIDIA's ``nvidia-smi -q -x``
(:mod:`servegate.gpu.nvidia`), AMD's ``amd-smi`` JSON (:mod:`servegate.gpu.amd`) — the
kernel log's GPU errors since the last check, and the disk under the host root, judged
against what the config expects. Each finding says what it is and what to do. A tool that
is missing where a GPU is expected, fails, times out or prints what its parser does not
know is a finding that fails, never a pass.

The vendors' health daemons (DCGM's ``dcgmi health``, AMD's GPU operator) are not
required: a self-hosted runner box rarely runs them, and the checks here need only the
driver's own tool. Where ``dcgmi`` is installed its passive health is read too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from servegate.pipeline.lease import state_dir

if TYPE_CHECKING:
    from servegate.config import Config

#: a finding that makes the box unhealthy, or one worth knowing that does not
Severity = Literal["fail", "warn"]


@dataclass
class Finding:
    """One thing wrong (or unknown) with the box."""

    #: which check: tool, count, arch, memory, ecc, pages, xid, throttle, temperature,
    #: power, driver, runtime, disk, dcgm
    check: str
    severity: Severity
    #: what is wrong, with the numbers
    what: str
    #: what to do about it
    do: str
    #: the GPU (its index and bus id), "" for the box
    gpu: str = ""

    def line(self) -> str:
        where = f"GPU {self.gpu}: " if self.gpu else ""
        return f"{self.severity.upper()} {self.check}: {where}{self.what} — {self.do}"


@dataclass
class Process:
    pid: int
    name: str
    memory_mib: float


@dataclass
class Gpu:
    """One GPU as its tool reported it (None: not reported)."""

    index: int
    name: str
    bus: str
    #: the arch servegate builds for: ``sm_90``, ``gfx1030``
    arch: str = ""
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    processes: list[Process] = field(default_factory=list)
    temperature_c: float | None = None
    #: where the GPU starts slowing itself down
    temperature_limit_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    #: active clock slowdown reasons that are a fault (thermal, power brake, hardware)
    throttle: list[str] = field(default_factory=list)
    #: uncorrectable ECC errors since the driver loaded (volatile)
    ecc_uncorrectable: int | None = None
    #: pages (rows) waiting to be retired or remapped at the next reset; failed remaps
    pages_pending: int | None = None
    pages_failed: bool = False
    #: what the driver says it cannot read or repair ("GPU is lost", a reset required)
    unreadable: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.index} ({self.bus})" if self.bus else str(self.index)


@dataclass
class Expect:
    """What the config says the box has (``[gpu]`` and ``build.archs``)."""

    #: GPUs the box must show; 0: at least one
    count: int = 0
    #: the archs the stack is built for; each GPU must be one of them (empty: any)
    archs: tuple[str, ...] = ()
    #: the driver version the stack was built for (a prefix); "": any
    driver: str = ""
    #: the CUDA or ROCm version (a prefix); "": any
    runtime: str = ""
    #: memory a GPU may hold beyond its processes' (the driver's own), MiB
    stray_memory_mib: float = 1024.0
    #: processes may hold GPU memory (the live service during a promote); False: the
    #: GPUs must be idle (before a runner's job)
    busy_ok: bool = True
    #: degrees below the slowdown temperature that count as too hot
    temperature_margin_c: float = 5.0
    #: free space the disk under the host root must keep, GiB
    min_free_disk_gib: float = 10.0
    #: the directory whose disk is checked ("": none)
    root: str = ""
    #: seconds a tool may take
    timeout: float = 60.0


@dataclass
class Snapshot:
    """The box at one moment: what the tools said and what was judged of it."""

    at: str
    #: nvidia-smi, amd-smi or "" (none found)
    tool: str = ""
    driver: str = ""
    runtime: str = ""
    gpus: list[Gpu] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def healthy(self) -> bool:
        return not any(f.severity == "fail" for f in self.findings)

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "fail"]

    def as_dict(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["healthy"] = self.healthy
        return doc

    def summary(self) -> str:
        if self.healthy:
            return f"healthy: {len(self.gpus)} GPU(s) by {self.tool or 'no tool'}"
        return "unhealthy: " + "; ".join(f.line() for f in self.failures[:5])


class ToolFailed(Exception):
    """A tool that did not answer as its parser expects (missing, failed, timed out, a
    format it does not know)."""


#: runs a tool: argv and timeout → its stdout (raises ToolFailed)
Runner = Callable[[Sequence[str], float], str]


#: the most output a tool may print (nvidia-smi -q -x of eight GPUs is ~200 kB)
MAX_OUTPUT = 16 * 1024 * 1024


def run_tool(argv: Sequence[str], timeout: float) -> str:
    """The tool's stdout; ToolFailed when it is missing, cannot run, fails, times out or
    prints more than :data:`MAX_OUTPUT`. Not :func:`servegate.pipeline.proc.run`, which
    merges stdout with stderr and keeps all of it: a health tool gone wrong must be cut
    off before it fills memory, and its stderr must not be parsed as its report. The
    tool and anything it started are ended (its own process group) when it times out;
    its bytes are read as UTF-8, replacing what is not."""
    try:
        popen = subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
    except FileNotFoundError:
        raise ToolFailed(f"{argv[0]} is not installed") from None
    except OSError as exc:
        raise ToolFailed(f"{argv[0]} cannot run: {exc}") from None
    chunks: list[bytes] = []
    err: list[bytes] = []
    flooded = threading.Event()

    def drain(stream: Any, into: list[bytes]) -> None:
        size = 0
        while block := stream.read(65536):
            size += len(block)
            if size > MAX_OUTPUT:  # a tool gone wrong: stop it before it fills memory
                flooded.set()
                with contextlib.suppress(OSError):
                    os.killpg(popen.pid, signal.SIGKILL)
                return
            into.append(block)

    readers = [threading.Thread(target=drain, args=(popen.stdout, chunks), daemon=True),
               threading.Thread(target=drain, args=(popen.stderr, err), daemon=True)]  # fmt: skip
    for r in readers:
        r.start()
    try:
        popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()
        raise ToolFailed(f"{argv[0]} did not answer within {timeout:.0f} s") from None
    finally:
        with contextlib.suppress(OSError):  # what it left running (a child on its pipe)
            os.killpg(popen.pid, signal.SIGKILL)
        for r in readers:
            r.join(timeout=5)
        for stream in (popen.stdout, popen.stderr):
            if stream is not None:
                stream.close()
    if flooded.is_set():
        raise ToolFailed(f"{argv[0]} printed more than {MAX_OUTPUT // 2**20} MiB")
    out = b"".join(chunks)
    text = out.decode("utf-8", errors="replace")
    if popen.returncode:
        said = (b"".join(err).decode(errors="replace") or text).strip().splitlines()[-1:] or [""]
        raise ToolFailed(f"{' '.join(argv[:3])} exited {popen.returncode}: {said[0][:300]}")
    return text


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check(
    expect: Expect,
    run: Runner = run_tool,
    which: Callable[[str], str | None] = shutil.which,
    kernel_log: Callable[[], str | None] | None = None,
    last: Path | None = None,
) -> Snapshot:
    """One snapshot of the box, judged against ``expect``. ``last``: the file that keeps
    the time of the last check (the kernel log's faults are counted since then, and it
    is set to this check's time); None: every fault of this boot counts."""
    from servegate.gpu import amd, nvidia, rocm

    start = time.monotonic()
    snap = Snapshot(at=now())
    vendor = next((v for v in (nvidia, amd, rocm) if which(v.TOOL)), None)
    if vendor is None:
        snap.findings.append(
            Finding(
                "tool",
                "fail",
                "none of nvidia-smi, amd-smi and rocm-smi is on PATH: no GPU can be seen",
                "install the driver's tools (NVIDIA: nvidia-utils; AMD: amd-smi from ROCm), or "
                "run this where the GPUs are",
            )
        )
    else:
        snap.tool = vendor.TOOL
        try:
            vendor.read(snap, run, expect.timeout)
        except Exception as exc:  # a format the parser does not know: never a pass
            what = str(exc) if isinstance(exc, ToolFailed) else f"unreadable output ({exc!r:.300})"
            if not isinstance(exc, ToolFailed):
                snap.gpus = []  # half read: nothing of it is judged
            snap.findings.append(
                Finding(
                    "tool",
                    "fail",
                    f"{vendor.TOOL} gave no usable answer: {what}",
                    "check the driver (a GPU fallen off the bus or a hung driver answers so); "
                    "reboot or reset the GPU",
                )
            )
        if which("dcgmi") and vendor is nvidia:
            nvidia.dcgm(snap, run, expect.timeout)
    try:
        judge(snap, expect)
        _kernel_errors(snap, kernel_log or read_kernel_log, _state(last), last)
        _disk(snap, expect)
    except Exception as exc:  # a check that breaks is no pass
        snap.findings.append(
            Finding(
                "tool",
                "fail",
                f"the health check itself failed: {exc!r:.300}",
                "report it as a bug, with `servegate gpu health --json`",
            )
        )
    snap.seconds = round(time.monotonic() - start, 3)
    return snap


def judge(snap: Snapshot, expect: Expect) -> None:
    """The findings of what the tool reported, against what is expected."""
    add = snap.findings.append
    if snap.tool and not snap.gpus and not snap.failures:
        add(
            Finding(
                "count",
                "fail",
                f"{snap.tool} lists no GPU",
                "check that the driver is loaded and the cards are seen (lspci)",
            )
        )
    if expect.count and snap.gpus and len(snap.gpus) != expect.count:
        add(
            Finding(
                "count",
                "fail",
                f"{len(snap.gpus)} GPU(s) visible, the config expects {expect.count} (gpu.count)",
                "a card lost from the bus needs a reset or a reboot; or fix gpu.count",
            )
        )
    if expect.driver and snap.driver and not snap.driver.startswith(expect.driver):
        add(
            Finding(
                "driver",
                "fail",
                f"driver {snap.driver}, the stack was built for {expect.driver}",
                "install the driver the stack was built for, or rebuild and set gpu.driver",
            )
        )
    if expect.runtime and snap.runtime and not snap.runtime.startswith(expect.runtime):
        add(
            Finding(
                "runtime",
                "fail",
                f"runtime {snap.runtime}, the stack was built for {expect.runtime}",
                "install that CUDA/ROCm version, or rebuild and set gpu.runtime",
            )
        )
    if expect.driver and not snap.driver and snap.gpus:
        add(
            Finding(
                "driver",
                "fail",
                f"{snap.tool} names no driver version; the stack was built for {expect.driver}",
                "check the driver's installation",
            )
        )
    if expect.runtime and not snap.runtime and snap.gpus:
        add(
            Finding(
                "runtime",
                "fail",
                f"{snap.tool} names no CUDA/ROCm version; the stack was built for {expect.runtime}",
                "check the driver's installation",
            )
        )
    for gpu in snap.gpus:
        _judge_gpu(snap, gpu, expect)


def _judge_gpu(snap: Snapshot, gpu: Gpu, expect: Expect) -> None:
    def add(check: str, what: str, do: str, severity: Severity = "fail") -> None:
        snap.findings.append(Finding(check, severity, what, do, gpu.label))

    if gpu.unreadable:
        add(
            "tool",
            f"the driver cannot read this GPU: {'; '.join(gpu.unreadable[:4])}",
            "a lost or wedged GPU: reset it (nvidia-smi -r / amdgpu recovery) or reboot",
        )
    if gpu.memory_total_mib is None and gpu.temperature_c is None:
        add(
            "tool",
            "its memory and temperature cannot be read: the tool reports nothing usable",
            "check the driver; reset the GPU or reboot",
        )
    if expect.archs and not gpu.arch:
        add(
            "arch",
            f"its arch cannot be read; the stack is built for {', '.join(expect.archs)}",
            "check the driver's tools (nvidia-smi's compute_cap needs driver 510+; rocminfo)",
        )
    if expect.archs and gpu.arch and gpu.arch not in expect.archs:
        add(
            "arch",
            f"{gpu.name} is {gpu.arch}; the stack is built for {', '.join(expect.archs)}",
            "add the arch to build.archs and rebuild, or run on the GPUs it was built for",
        )
    held = sum(p.memory_mib for p in gpu.processes)
    if gpu.processes and not expect.busy_ok:
        who = ", ".join(f"{p.pid} {p.name} ({p.memory_mib:.0f} MiB)" for p in gpu.processes[:5])
        add(
            "memory",
            f"processes hold the GPU: {who}",
            "end them (a job that did not clean up) before the next job",
        )
    if gpu.memory_used_mib is not None and gpu.memory_used_mib - held > expect.stray_memory_mib:
        add(
            "memory",
            f"{gpu.memory_used_mib - held:.0f} MiB in use by no process "
            f"({gpu.memory_used_mib:.0f} MiB used, {held:.0f} MiB by its processes)",
            "a dead job's memory: end its leftover processes, else reset the GPU",
        )
    if gpu.ecc_uncorrectable:
        add(
            "ecc",
            f"{gpu.ecc_uncorrectable} uncorrectable ECC error(s) since the driver loaded",
            "drain the box and reset the GPU; if they return, replace the card",
        )
    if gpu.pages_pending:
        add(
            "pages",
            f"{gpu.pages_pending} memory page(s)/row(s) pending retirement or remap",
            "reset the GPU (or reboot) so they are retired before the next job",
        )
    if gpu.pages_failed:
        add(
            "pages",
            "a row remap failed: the memory cannot be repaired in place",
            "take the card out of service",
        )
    if gpu.throttle:
        add(
            "throttle",
            f"clocks held down: {', '.join(gpu.throttle)}",
            "check cooling, power and the power brake; a throttled GPU measures slower",
        )
    t, limit = gpu.temperature_c, gpu.temperature_limit_c
    if t is not None and limit is not None and t >= limit - expect.temperature_margin_c:
        add(
            "temperature",
            f"{t:.0f} C, within {expect.temperature_margin_c:.0f} C of its "
            f"slowdown at {limit:.0f} C",
            "check the fans and the airflow",
        )
    p, plimit = gpu.power_w, gpu.power_limit_w
    if p is not None and plimit is not None and p > plimit * 1.02:
        add("power", f"{p:.0f} W over its limit of {plimit:.0f} W", "check the power cap")


#: the kernel log lines of GPU faults: NVIDIA's Xid, AMD's RAS and ring resets
KERNEL_ERRORS = re.compile(
    r"NVRM: Xid \(PCI:(?P<bus>[0-9a-fA-F:.]+)\): (?P<xid>\d+)"
    r"|SXid \(PCI:[0-9a-fA-F:.]+\): (?P<sxid>\d+)"
    r"|amdgpu (?P<amdbus>[0-9a-fA-F:.]+): .*(?:uncorrectable|ring \S+ timeout|GPU reset|RAS)"
    r"|amdgpu_job_timedout.*ring \S+ timeout",
)


def read_kernel_log() -> str | None:
    """The kernel's messages (``journalctl -k``, else ``dmesg``); None when this user may
    not read them."""
    for argv in (
        ["journalctl", "-k", "-b", "--no-pager", "-o", "short-iso", "-q"],
        ["dmesg", "--time-format", "iso"],
    ):
        if not shutil.which(argv[0]):
            continue
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            continue
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout
    return None


def _state(path: Path | None) -> dict[str, Any]:
    """The last check's time and the faults seen and not yet acknowledged; a state that
    cannot be read (none yet, damaged, a link) counts every fault of this boot again."""
    if path is None:
        return {}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _last_check(state: Mapping[str, Any]) -> dt.datetime | None:
    """When the last check read the kernel log; None (all of this boot) when it is
    unknown, or later than now (a clock set back, a planted file): never a reason to
    skip a fault."""
    try:
        at = dt.datetime.fromisoformat(str(state["at"]).replace("Z", "+00:00"))
    except (KeyError, ValueError, TypeError):
        return None
    current = dt.datetime.fromisoformat(now().replace("Z", "+00:00"))
    return at if at <= current else None


def _faults(state: Mapping[str, Any]) -> list[dict[str, str]]:
    found = state.get("faults")
    if not isinstance(found, list):
        return []
    return [f for f in found if isinstance(f, dict) and isinstance(f.get("line"), str)]


def _save(path: Path, at: str, faults: list[dict[str, str]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"at": at, "faults": faults[-500:]}))
        os.replace(tmp, path)  # replaces a link itself, never its target
    except OSError:
        pass  # the next check counts from further back: more faults seen, never fewer


def acknowledge(path: Path) -> list[dict[str, str]]:
    """Forget the kernel-log faults seen so far (after the GPU was reset): the ones
    forgotten."""
    state = _state(path)
    _save(path, str(state.get("at") or now()), [])
    return _faults(state)


#: the time a kernel log line starts with (journalctl's short-iso, dmesg's iso)
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[.,]\d+)?([+-]\d\d:?\d\d|Z)?")


def _stamp(line: str) -> dt.datetime | None:
    m = STAMP.match(line)
    if not m:
        return None
    zone = (m[2] or "+00:00").replace("Z", "+00:00")
    if len(zone) == 5:
        zone = zone[:3] + ":" + zone[3:]
    try:
        return dt.datetime.fromisoformat(m[1] + zone)
    except ValueError:
        return None


def _kernel_errors(
    snap: Snapshot,
    read: Callable[[], str | None],
    state: Mapping[str, Any] | None = None,
    path: Path | None = None,
) -> bool:
    """GPU faults in the kernel log (NVIDIA Xid and SXid, amdgpu RAS, ring timeouts and
    resets). A fault, once seen by any check, stays a finding of every check until it is
    acknowledged (``servegate gpu health --acknowledge``, after the GPU was reset): the
    first check to read it does not use it up. ``state``: the last check's time and the
    faults kept (``path`` keeps them; None: this boot's faults, kept nowhere). Lines of the
    same second as the last check are read again (they are told apart by their text).
    Whether the log could be read (an unreadable one is said, as a warning)."""
    state = state or {}
    text = read()
    kept = _faults(state)
    if text is None:
        snap.findings.append(
            Finding(
                "xid",
                "warn",
                "the kernel log cannot be read by this user: GPU faults there "
                "(NVIDIA Xid, amdgpu RAS) are not seen",
                "let the user read it (group systemd-journal or adm), or run as root",
            )
        )
    else:
        since = _last_check(state)
        known = {f["line"] for f in kept}
        for line in text.splitlines():
            m = KERNEL_ERRORS.search(line)
            if not m:
                continue
            when = _stamp(line)
            if since is not None and when is not None and when < since.replace(microsecond=0):
                continue
            entry = line.strip()[:300]
            if entry in known:
                continue
            known.add(entry)
            key = (f"Xid {m['xid']}" if m["xid"] else f"SXid {m['sxid']}" if m["sxid"]
                   else "amdgpu error")  # fmt: skip
            kept.append({"key": key, "bus": m["bus"] or m["amdbus"] or "", "line": entry})
    if path is not None and text is not None:
        _save(path, snap.at, kept)
    grouped: dict[tuple[str, str], list[str]] = {}
    for fault in kept:
        grouped.setdefault((fault.get("bus", ""), fault.get("key", "fault")), []).append(
            fault["line"]
        )
    for (bus, key), lines in grouped.items():
        snap.findings.append(
            Finding(
                "xid",
                "fail",
                f"{len(lines)} x {key} in the kernel log, not yet acknowledged (last: {lines[-1]})",
                "look the error up (NVIDIA's Xid catalog); reset the GPU or reboot, then "
                "`servegate gpu health --acknowledge`",
                bus,
            )
        )
    return text is not None


def _disk(snap: Snapshot, expect: Expect) -> None:
    if not expect.root:
        return
    where = Path(expect.root)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        st = os.statvfs(where)
    except OSError as exc:
        snap.findings.append(
            Finding(
                "disk",
                "fail",
                f"cannot read the disk of {where}: {exc}",
                "check the host root's mount",
            )
        )
        return
    free = st.f_bavail * st.f_frsize / 2**30
    if free < expect.min_free_disk_gib:
        snap.findings.append(
            Finding(
                "disk",
                "fail",
                f"{free:.1f} GiB free under {where}, below "
                f"{expect.min_free_disk_gib:g} GiB (gpu.min_free_disk_gib)",
                "free space (old releases: host.keep_releases; compile caches; logs)",
            )
        )


def to_json(snap: Snapshot) -> str:
    return json.dumps(snap.as_dict(), sort_keys=True)


def expect_of(cfg: Config | None, busy_ok: bool = True) -> Expect:
    """What ``cfg`` expects of the box (None: no config, the defaults)."""
    if cfg is None:
        return Expect(busy_ok=busy_ok)
    g = cfg.gpu
    return Expect(
        count=g.count,
        archs=tuple(cfg.build.archs),
        driver=g.driver,
        runtime=g.runtime,
        stray_memory_mib=g.stray_memory_mib,
        busy_ok=busy_ok,
        temperature_margin_c=g.temperature_margin,
        min_free_disk_gib=g.min_free_disk_gib,
        root=cfg.host.root,
        timeout=g.timeout,
    )


def last_check_file(environ: Mapping[str, str]) -> Path:
    """Where the time of the box's last check is kept (the user's state directory)."""
    return state_dir(environ) / "gpu-health.json"


def any_tool(which: Callable[[str], str | None] = shutil.which) -> bool:
    """Whether this box has a GPU tool (a CPU box has none)."""
    return bool(which("nvidia-smi") or which("amd-smi") or which("rocm-smi"))


def for_release(cfg: Config, environ: Mapping[str, str]) -> Snapshot | None:
    """The check a promote makes before it builds and around each measuring check: None
    where ``gpu.check`` says not to (``"off"``; ``"auto"`` on a box without a GPU tool).
    Processes may hold the GPUs (the live service does)."""
    if cfg.gpu.check == "off" or (cfg.gpu.check == "auto" and not any_tool()):
        return None
    return check(expect_of(cfg), last=last_check_file(environ))


def brief(snap: Snapshot | None) -> dict[str, Any] | None:
    """A snapshot as a record keeps it."""
    if snap is None:
        return None
    return {
        "at": snap.at, "healthy": snap.healthy, "tool": snap.tool, "driver": snap.driver,
        "runtime": snap.runtime,
        "gpus": [{"index": g.index, "name": g.name, "arch": g.arch, "bus": g.bus,
                  "memory_used_mib": g.memory_used_mib, "temperature_c": g.temperature_c,
                  "power_w": g.power_w, "throttle": g.throttle,
                  "ecc_uncorrectable": g.ecc_uncorrectable, "processes": len(g.processes)}
                 for g in snap.gpus],
        "findings": [dataclasses.asdict(f) for f in snap.findings],
    }  # fmt: skip
