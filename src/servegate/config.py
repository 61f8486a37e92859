"""servegate.toml → frozen, typed objects.

Every section is a dataclass; the loader walks the type hints, so a key that is not a
field is rejected (with a "did you mean"), and a field without a default is required.
``$VAR`` / ``${VAR}`` in path-like values expand from the environment mapping passed in.
Placeholders ``{release}``, ``{port}``, ``{sha}``, ``{short}``, ``{host_root}`` in the
service and build settings are filled per release (see :func:`fill`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import string
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from servegate.archs import check_arch_names
from servegate.bench.tiers import TIERS
from servegate.errors import ConfigError, did_you_mean
from servegate.flags import setting

Strategy = Literal["worktree", "in-place"]
Manager = Literal["supervisor", "systemd-user"]


@dataclass(frozen=True)
class Stack:
    #: URL or path of the stack's Git remote; the only way code reaches the host
    remote: str
    #: releases must be commits on this branch of the remote
    branch: str = "main"


@dataclass(frozen=True)
class Host:
    #: everything servegate keeps on the host lives under this directory
    root: str = ""
    #: ``user@box[:port]``: the host is reached over SSH and runs servegate itself
    #: (its own config: ``ssh.config``); empty: this machine
    ssh: str = ""
    #: ``worktree``: releases/<sha> per release + ``current`` symlink; ``in-place``: one checkout
    strategy: Strategy = "worktree"
    #: release worktrees kept (the live and previous release are always kept)
    keep_releases: int = 5
    #: where the host-wide GPU lease lives; empty: $SERVEGATE_STATE_DIR or ~/.local/state/servegate
    state_dir: str = ""
    #: seconds promote and rollback wait for the GPU lease
    lease_timeout: float = 3600.0
    #: this host's identity in release records: the gate compares only with samples this
    #: id recorded; empty: the machine id (/etc/machine-id), else the hostname
    id: str = ""


KernelKind = Literal["portable", "hipcc", "nvcc", "cmake"]


@dataclass(frozen=True)
class KernelTarget:
    """One GPU extension built for ``build.archs`` (a ``[[build.targets]]`` table)."""

    name: str
    #: ``hipcc`` / ``nvcc``: compile ``sources`` into ``output``; ``portable``: hipcc for
    #: gfx archs, nvcc for sm archs (one source through a portability header);
    #: ``cmake``: configure + build
    kind: KernelKind
    #: globs (relative to the checkout) of the inputs; they key the build cache, and for
    #: hipcc/nvcc the .hip/.cu/.cpp/.c files among them are compiled
    sources: tuple[str, ...]
    #: hipcc/nvcc: the library to write
    output: str = ""
    #: cmake: globs of the libraries the build leaves (relative to the checkout)
    outputs: tuple[str, ...] = ()
    #: extra compiler flags (hipcc/nvcc)
    flags: tuple[str, ...] = ()
    #: cmake: the source and build directories and extra -D arguments
    source_dir: str = "."
    build_dir: str = "build"
    cmake_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Build:
    #: argv run in the new release directory while the old release still serves; empty: none
    command: tuple[str, ...] = ()
    #: globs (relative to the release) of what the build produces; hashed into the record
    artifacts: tuple[str, ...] = ()
    timeout: float = 3600.0
    env: Mapping[str, str] = field(default_factory=dict)
    #: GPU archs every built ``*.so`` artifact must hold device code for (gfx1030, sm_90, …)
    archs: tuple[str, ...] = ()
    #: GPU extensions built (and cached) before ``command`` runs
    targets: tuple[KernelTarget, ...] = ()
    #: parallel compile jobs for CMake builds; 0: the number of CPUs
    jobs: int = 0
    #: reuse an earlier build whose sources, toolchain, flags and archs are the same
    cache: bool = True


@dataclass(frozen=True)
class Service:
    port: int
    #: argv of the server, e.g. ``[".../python", "-m", "vllm.entrypoints.openai.api_server", ...]``
    #: (or give ``profile`` instead)
    command: tuple[str, ...] = ()
    #: a launch profile: a shipped name (``v620-tp4``) or a path relative to this file
    profile: str = ""
    #: the profile's parameters (``[service.params]``)
    params: Mapping[str, str] = field(default_factory=dict)
    #: ``vllm`` or ``openai`` (any other OpenAI-compatible server); a profile says its own
    engine: Literal["vllm", "transformers", "openai"] = "vllm"
    #: point the Inductor/Triton/vLLM compile caches at a directory keyed by the
    #: compilation config and the release (a rollback reuses its warm cache)
    compile_cache: bool = True
    #: start a new release's empty compile caches as a copy of the live release's: the
    #: engines' own keys then decide what is reused. Off by default: a vLLM fork whose
    #: release changes a kernel path the engine's key leaves out would load the live
    #: release's graphs; on for stacks that add to an unchanged engine
    compile_cache_seed: bool = False
    #: ``supervisor`` (works anywhere) or ``systemd-user`` (a user unit)
    manager: Manager = "supervisor"
    unit: str = "servegate-stack"
    #: address the health checks and probes talk to
    host: str = "127.0.0.1"
    startup_timeout: float = 900.0
    stop_timeout: float = 120.0
    #: restarts the manager may make within ``start_limit_interval`` seconds
    start_limit_burst: int = 3
    start_limit_interval: int = 600
    memory_max: str = ""
    memory_swap_max: str = ""
    #: model name for probes; empty: the first model /v1/models lists
    model: str = ""
    #: name of the environment variable holding the API key the server expects (never recorded)
    api_key_env: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    #: a file of ``NAME=value`` lines (0600, this user's) that ``${NAME}`` in ``env`` and
    #: ``api_key_env`` are filled from before servegate's own environment
    #: (:mod:`servegate.envfile`); empty: servegate's environment only
    env_file: str = ""


@dataclass(frozen=True)
class Provenance:
    #: interpreter every process of the service must run; empty: ``service.command[0]``
    interpreter: str = ""
    #: names of ``service.env`` variables checked in every process; empty list: all of them
    env: tuple[str, ...] = ()
    #: globs (relative to the release) of extensions the live processes must map
    extensions: tuple[str, ...] = ()
    #: Python modules the service's interpreter must resolve inside the release
    modules: tuple[str, ...] = ()
    #: directories code of the live processes may also come from, beside the release,
    #: the interpreter's venv and base, the system library dirs and the compile caches
    runtime_roots: tuple[str, ...] = ()
    #: the py-spy that reads the live frames (empty: beside servegate, then PATH)
    py_spy: str = ""
    #: a Python process whose frames cannot be read is a finding (not inference)
    require_observed: bool = False
    #: the interpreter's venv, its base and the system library directories must not be
    #: writable by the user servegate (and the service, and the release's build) runs as
    read_only_runtime: bool = False
    #: py-spy dumps per process (0.1 s apart): code that runs now and then is seen more often
    samples: int = 3
    #: start-up hooks (paths) accepted although they run code the check cannot see
    allowed_hooks: tuple[str, ...] = ()
    #: executable anonymous memory: "record" (JIT engines make it) or "fail"
    anonymous_code: Literal["record", "fail"] = "record"


@dataclass(frozen=True)
class Probes:
    smoke_prompt: str = "Say hello in one short sentence."
    smoke_max_tokens: int = 16
    timeout: float = 120.0
    #: correctness prompts, each asked twice; empty: the seeds' set
    correctness: tuple[CorrectnessCase, ...] = ()
    #: prefix reuse: tokens of the first turn (a tier name), cached share and TTFT ratio
    prefix_tier: str = "16k"
    prefix_min_cached: float = 0.70
    prefix_max_ttft_ratio: float = 0.5
    #: vision: side of the generated square RGB image, in pixels
    vision_size: int = 1260
    #: vision: tokens of the long conversation that keeps the image first
    vision_followup_tier: str = "8k"
    #: speculative decoding: the lowest acceptable acceptance rate (0: record only)
    #: lowest acceptance rate of speculative decoding's drafted tokens (0.05: 5 %); a
    #: draft model nothing of which is accepted only slows decoding
    spec_min_acceptance: float = 0.05


@dataclass(frozen=True)
class CorrectnessCase:
    """One correctness prompt: the answer must contain / start with ``expect``."""

    prompt: str
    expect: str
    mode: Literal["contains", "starts-with"] = "contains"
    #: only the first ``within`` characters of the answer count (0: all)
    within: int = 0


DEFAULT_CORRECTNESS = (
    CorrectnessCase("What is the capital of France? Answer in one word.", "Paris", "contains", 32),
    CorrectnessCase("1+1=", "2", "starts-with"),
    CorrectnessCase(
        "What is the capital of Germany? Answer in one word.", "Berlin", "contains", 32
    ),
    CorrectnessCase("19+23=", "42", "contains", 16),
    CorrectnessCase("9*7=", "63", "contains", 16),
    CorrectnessCase("13-5=", "8", "contains", 16),
    CorrectnessCase("36/4=", "9", "contains", 16),
)


@dataclass(frozen=True)
class Bench:
    """The long-context bench (``servegate bench`` and the ``bench`` gate check)."""

    #: ``regular`` (prose) and/or ``coding`` (source code)
    profiles: tuple[str, ...] = setting(
        ("regular", "coding"), "--profiles", "regular,coding", "LIST"
    )
    #: of 8k 16k 32k 64k 128k (tokens of the served model's tokenizer)
    tiers: tuple[str, ...] = setting(
        ("16k",), "--tiers", "of 8k,16k,32k,64k,128k, or 1k,2k,4k for smoke-sized runs", "LIST",
        normalise=str.lower,
    )  # fmt: skip
    #: streams started together per group; one case per value
    concurrency: tuple[int, ...] = setting(
        (1,), "--concurrency", "streams started together, e.g. 1,4", "LIST"
    )
    repetitions: int = setting(3, "--repetitions", "groups per case", "N")
    #: the gate measures more (up to this many) while a required row is INCONCLUSIVE;
    #: 10 a side, one a service start, is what the plan needs at CV 2 % with a 1 % restart
    #: offset (docs/bench.md, "Figures"); clear cases stop at the first looks
    max_repetitions: int = 10
    #: the model's tokenizer files (a model directory), to size prompts exactly for a
    #: server without /tokenize (transformers serve); "": /tokenize, else an estimate
    tokenizer: str = setting(
        "", "--tokenizer", "the model's tokenizer files, to size prompts for a server "
        "without /tokenize", "DIR",
    )  # fmt: skip
    #: the Python (with transformers) that reads ``tokenizer`` ("": servegate's own)
    tokenizer_python: str = setting(
        "", "--tokenizer-python", "a Python with transformers that reads --tokenizer", "PATH"
    )
    #: when the box's measured restart offset (``servegate bench noise``) needs it, the
    #: gate spreads the candidate's repetitions over up to this many service starts (the
    #: service is restarted, re-proven and warmed up in between; with the fresh baseline
    #: the live release and the candidate alternate, ABAB); 1: never restart; never more
    #: than ``max_repetitions`` (one repetition a start)
    max_starts: int = 10
    max_tokens: int = setting(1024, "--max-tokens", "exact output tokens", "N")
    #: allowed drift of the prompt from the tier, in percent
    tolerance_pct: float = setting(2.0, "--tolerance", "prompt size tolerance in %%", "PCT")
    warmup: bool = setting(True, "--no-warmup", "skip the warm-up request")
    #: never on a measured request unless set here (the output would be forced)
    ignore_eos: bool = setting(False, "--ignore-eos", "force the output length (recorded)")
    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 20
    min_p: float = 0.0
    #: per-request seed; -1: not sent (vLLM's CPU backend crashes on per-request seeds
    #: once a prompt is prefilled in chunks: "CPU Generator does not use offset")
    seed: int = setting(3407, "--seed", "per-request seed; -1: none sent")
    #: JSON object passed through, e.g. '{"enable_thinking": false}'
    chat_template_kwargs: str = ""
    #: seconds per request
    timeout: float = 1800.0
    #: case ids shown but never deciding the gate (e.g. "coding-128k")
    report_only: tuple[str, ...] = ()
    #: where result files go; empty: <host.root>/bench
    results_dir: str = ""
    #: regular expressions: a matching server-log line inside a measured window
    #: invalidates that trial (empty: the built-in compile/JIT patterns)
    window_log_patterns: tuple[str, ...] = ()
    min_text_tokens: int = 128
    min_unique_ratio: float = 0.08
    max_dominant_ratio: float = 0.20
    min_zlib_ratio: float = 0.15
    #: validity: how far usage's output tokens may exceed the streamed text counted again
    max_usage_excess: float = 0.02
    #: validity: the largest share of an answer's text one chunk may carry (beyond 256
    #: characters)
    max_chunk_share: float = 0.10
    #: validity where the engine has no TTFT clock of its own: the longest wait in a
    #: stream's start, as a share of the time to its first text, before that text counts
    #: as sent ahead of the prefill
    max_first_gap_share: float = 0.5
    #: measure the reference workload (a fixed CPU matrix product) beside every group,
    #: so the gate can tell a change of the box from a change of the release
    reference: bool = True


@dataclass(frozen=True)
class GateRule:
    """One gated metric (a ``[[gate.rules]]`` table)."""

    metric: str
    #: ``higher`` or ``lower`` is better
    direction: Literal["higher", "lower"] = "higher"
    #: allowed loss against the baseline median, as a fraction (0.05: 5 %)
    tolerance: float = 0.05
    #: absolute bound on the candidate median (minimum for higher, maximum for lower); 0: none
    floor: float = 0.0
    #: case ids (globs) the rule covers
    cases: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class LoadRule:
    """One judged figure of a load point (a ``[[load.rules]]`` table)."""

    #: ``ttft_s``, ``itl_ms``, ``tpot_ms`` or ``e2el_s`` with ``.p50``, ``.p90`` or
    #: ``.p99``; or ``goodput_rps`` or ``request_throughput``
    metric: str
    #: the load point it is read at (one of ``load.rates`` or ``load.concurrencies``)
    point: float
    #: the loss that matters, as a fraction (0.10: 10 % slower or fewer)
    tolerance: float = 0.10
    #: a required row decides the gate; otherwise it is reported only
    required: bool = False


@dataclass(frozen=True)
class Load:
    """The ``load`` gate check's sweep: ``servegate bench load`` with these settings."""

    #: open-loop request rates, or (exclusive) closed-loop concurrencies
    rates: tuple[float, ...] = ()
    concurrencies: tuple[int, ...] = ()
    #: seconds a point
    duration: float = setting(30.0, "--duration", "seconds a point")
    burstiness: float = setting(
        1.0, "--burstiness", "gamma shape of the arrival gaps: 1 Poisson, <1 burstier"
    )
    seed: int = setting(0, "--load-seed", "arrivals and prompt draws")
    #: SLOs for goodput, e.g. "ttft:2s,itl:80ms"
    goodput: str = setting("", "--goodput", "SLOs, e.g. ttft:2s,itl:80ms", "SLOS")
    workload: Literal["cold", "shared-prefix"] = setting(
        "cold", "--workload", "cold, or shared-prefix: prompts that share a prefix"
    )
    prefix_share: float = setting(
        0.0, "--prefix-share", "shared-prefix: the share of every prompt that is common (e.g. 0.8)"
    )
    #: the prompts' tiers (empty: bench.tiers) and output length (0: bench.max_tokens)
    tiers: tuple[str, ...] = ()
    max_tokens: int = 0
    rules: tuple[LoadRule, ...] = ()


@dataclass(frozen=True)
class Gate:
    #: gate checks run after provenance, in order: ``smoke``, ``bench``, ``correctness``,
    #: ``prefix_reuse``, ``vision``, ``spec_decode``
    checks: tuple[str, ...] = ("smoke",)
    #: metrics the bench check gates; empty: prefill_tps and generation_tps at 5 %
    rules: tuple[GateRule, ...] = ()
    #: a shipped set of floors added to ``rules`` (``v620-tp4``); empty: none
    floors: str = ""
    #: ``fresh``: the live release measured again during the promote, before the switch
    #: (ABAB where the plan needs several service starts); ``recorded``: the samples the
    #: live release's own gate recorded; or the path of a result file
    baseline: str = "fresh"
    #: probability that an unchanged release is rolled back by a check (all its deciding
    #: rows): half of it for a false FAIL, half for a row left open at the cap
    false_alarm: float = 0.05
    #: probability that a loss of a rule's tolerance PASSes
    miss: float = 0.01
    #: a change of the reference workload between the baseline and the candidate that is
    #: significant and beyond this fraction is a change of the machine: the row is judged
    #: both as measured and credited with it, and only a verdict both agree on stands
    drift: float = 0.01
    #: what a row still open at bench.max_repetitions becomes: ``inconclusive`` (rolled
    #: back: a PASS needs an interval that excludes the tolerated loss), ``fail``, or
    #: ``pass`` (an interval that could not exclude the loss is then a pass; a row with
    #: nothing to compare never is)
    inconclusive: Literal["inconclusive", "fail", "pass"] = "inconclusive"
    #: the restart-to-restart offset (a log SD, 0.02: about 2 %) the gate assumes where
    #: neither ``servegate bench noise`` nor its own service starts measured it; never 0
    restart_offset: float = 0.02
    #: rows without a baseline: ``fail``, or ``first-release``: pass (floors and validity
    #: decide) only while the host has no released record of the stack at all
    no_baseline: Literal["first-release", "fail"] = "fail"

    def __post_init__(self) -> None:
        if self.baseline == "live":
            raise ConfigError(
                "gate.baseline = 'live' is gone: it compared with samples recorded when the "
                "live release was promoted",
                hint="remove it (the default 'fresh' measures the live release again during "
                "the promote), or set 'recorded' for the recorded samples",
            )


@dataclass(frozen=True)
class Ssh:
    """How servegate reaches hosts over SSH (``host.ssh`` or ``[[fleet.hosts]]``)."""

    #: the config file on the host (a host's own ``config`` in [[fleet.hosts]] wins)
    config: str = ""
    #: servegate on the host (a path, or a name on the host's PATH)
    servegate: str = "servegate"
    #: host keys are checked against this file; an unknown or changed key is refused
    known_hosts: str = "~/.ssh/known_hosts"
    #: a private key file; empty: the SSH agent and ~/.ssh's default keys
    identity: str = ""
    connect_timeout: float = 10.0
    #: seconds one remote command (a whole promote) may take
    command_timeout: float = 7200.0


@dataclass(frozen=True)
class FleetHost:
    """One host of a fleet (a ``[[fleet.hosts]]`` table)."""

    address: str
    #: its config file, if not ``ssh.config``
    config: str = ""


@dataclass(frozen=True)
class Fleet:
    """Several hosts: canaries first, gated, then the rest in waves."""

    hosts: tuple[FleetHost, ...] = ()
    #: the first N hosts are promoted (and gated) on their own, one by one, first
    canary: int = 1
    #: hosts per wave after the canaries; a wave stops at its first failure
    wave_size: int = 1
    #: after a failure: roll back the hosts of the failing ``wave``, or ``all`` hosts
    #: this promote touched (canaries and earlier waves too)
    on_failure: Literal["wave", "all"] = "wave"
    #: after its promote each host must verify the release's signed attestation (``release
    #: verify --attestation``) or it fails with its wave, before the next wave is promoted
    require_attestation: bool = False


@dataclass(frozen=True)
class Lint:
    """Lint and log rules (docs/profiles.md): the shipped ones plus a team's files."""

    #: rule files (``[[lint]]`` / ``[[log]]`` tables), relative to this config file
    rules: tuple[str, ...] = ()
    #: rule ids turned off
    disable: tuple[str, ...] = ()
    #: rule id → ``fail`` / ``warn`` / ``fact``
    severity: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Release:
    #: annotated tag name; placeholders {date} {time} {short} {sha} {n}
    tag: str = "release/{date}-{time}-{short}"
    push: bool = True
    identity_name: str = "servegate"
    identity_email: str = "servegate@localhost"


@dataclass(frozen=True)
class GpuHealth:
    """The GPU health check (``servegate gpu health``, the runner's job hooks, a promote
    before and after its bench; docs/gpu-health.md)."""

    #: GPUs the box must show; 0: at least one
    count: int = 0
    #: the driver version the stack was built for (a prefix, e.g. "550."); "": any
    driver: str = ""
    #: the CUDA (nvidia-smi's) or ROCm version the stack was built for (a prefix); "": any
    runtime: str = ""
    #: degrees below a GPU's slowdown temperature that count as too hot
    temperature_margin: float = 5.0
    #: memory a GPU may hold beyond what its processes hold (the driver's own), MiB
    stray_memory_mib: float = 1024.0
    #: free space the disk under the host root must keep, GiB
    min_free_disk_gib: float = 10.0
    #: seconds nvidia-smi or amd-smi may take before the box counts as unhealthy
    timeout: float = 60.0
    #: before and after a promote's bench: "auto" checks where nvidia-smi, amd-smi or
    #: rocm-smi is found (a CPU box is not checked), "require" also counts a box without them as
    #: unhealthy, "off" never checks
    check: Literal["auto", "require", "off"] = "auto"


@dataclass(frozen=True)
class Attest:
    """Signed in-toto attestations of every released and rolled-back SHA
    (docs/attestations.md)."""

    #: the host's SSH private key that signs them (``ssh-keygen -Y sign``; this user's own
    #: file, mode 0600, no passphrase); "": unsigned, and every record says so
    key: str = ""
    #: the name the host signs as: its line in the allowed-signers file; "": the host's id
    #: (``servegate@<host id>``)
    principal: str = ""
    #: the allowed-signers file (ssh-keygen's format) in the stack repository, read at the
    #: tip of the configured branch on origin: whose attestations are trusted
    allowed_signers: str = ".servegate/allowed_signers"
    #: promote only on a live release whose attestation verifies (its signer allowed, its
    #: subjects this checkout, its verdict released)
    require_live: bool = False

    def __post_init__(self) -> None:
        if self.principal and not re.fullmatch(r"[A-Za-z0-9._@+-]{1,200}", self.principal):
            raise ConfigError(
                f"attest.principal = {self.principal!r}: give letters, digits and . _ @ + - "
                "only (it is a name in an allowed-signers file)"
            )
        if self.allowed_signers.startswith("/") or ".." in Path(self.allowed_signers).parts:
            raise ConfigError(
                f"attest.allowed_signers = {self.allowed_signers!r} is not a path inside the "
                "stack repository",
                hint='give it relative to the repository\'s top, e.g. ".servegate/allowed_signers"',
            )


@dataclass(frozen=True)
class FocusRule:
    """Changed files matching ``sources`` (``!glob`` excludes) select ``tests``."""

    sources: tuple[str, ...]
    tests: tuple[str, ...]


@dataclass(frozen=True)
class Focus:
    #: what changes are measured against (the merge base with it)
    base: str = "origin/main"
    rules: tuple[FocusRule, ...] = ()
    #: tests that run whenever anything but ignored files changed
    always: tuple[str, ...] = ()
    #: the wider set for a changed file no rule covers — never nothing
    fallback: tuple[str, ...] = ("tests",)
    #: changes that select nothing (docs)
    ignore: tuple[str, ...] = ("docs/**", "**/*.md", "*.md", "LICENSE*")
    #: everything, for the run-all escape
    all_tests: tuple[str, ...] = ("tests",)
    #: set to 1 to run everything
    run_all_env: str = "SERVEGATE_RUN_ALL_GPU_TESTS"
    #: a pull-request label that runs everything
    run_all_label: str = "run-all-gpu-tests"
    #: pytest marker of GPU tests (``-m``); empty: no marker filter
    marker: str = "gpu"
    #: the Python that runs the selected tests (the stack's test environment, with
    #: pytest); empty: the one servegate runs on
    python: str = ""


@dataclass(frozen=True)
class Trend:
    """The trend across releases (docs/bench.md, "Creeping losses: the trend across
    releases"): the candidate against the best of the last ``window`` released records of
    this host measured with the same bench settings, or against a pinned ``anchor``."""

    #: whether the gate judges the candidate against the trend (``release history`` and
    #: ``servegate report`` show the trend either way)
    enabled: bool = True
    #: how many of the newest released records the candidate is judged against (their best)
    window: int = 5
    #: a released SHA (7 to 40 hex digits) judged against instead of the window's best;
    #: "": the best of the window
    anchor: str = ""

    def __post_init__(self) -> None:
        if not 2 <= self.window <= 100:
            raise ConfigError(
                f"trend.window = {self.window}: give 2..100 (the best of one record is the "
                "live release, which the bench gate already compares with)"
            )
        if self.anchor and not re.fullmatch(r"[0-9a-f]{7,40}", self.anchor):
            raise ConfigError(
                f"trend.anchor = {self.anchor!r} is not a commit SHA (7 to 40 lowercase hex "
                "digits)",
                hint='name a released SHA, or "" for the best of trend.window',
            )


@dataclass(frozen=True)
class Config:
    stack: Stack
    host: Host
    service: Service
    build: Build = field(default_factory=Build)
    provenance: Provenance = field(default_factory=Provenance)
    probes: Probes = field(default_factory=Probes)
    bench: Bench = field(default_factory=Bench)
    gate: Gate = field(default_factory=Gate)
    load: Load = field(default_factory=Load)
    lint: Lint = field(default_factory=Lint)
    ssh: Ssh = field(default_factory=Ssh)
    fleet: Fleet = field(default_factory=Fleet)
    release: Release = field(default_factory=Release)
    focus: Focus = field(default_factory=Focus)
    trend: Trend = field(default_factory=Trend)
    attest: Attest = field(default_factory=Attest)
    gpu: GpuHealth = field(default_factory=GpuHealth)
    path: str = ""

    @property
    def host_root(self) -> Path:
        return Path(self.host.root)

    @property
    def remote_hosts(self) -> tuple[FleetHost, ...]:
        """The hosts reached over SSH: the fleet, or ``host.ssh`` as a fleet of one."""
        if self.fleet.hosts:
            return self.fleet.hosts
        return (FleetHost(self.host.ssh),) if self.host.ssh else ()


def _expand(value: str, environ: Mapping[str, str], where: str) -> str:
    if "$" not in value:
        return value
    try:
        return string.Template(value).substitute(environ)
    except KeyError as exc:
        raise ConfigError(
            f"{where} uses ${exc.args[0]}, which is not set in the environment",
            hint=f"export {exc.args[0]} or write the value out",
        ) from None
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}", hint="write a literal $ as $$") from None


def _convert(tp: Any, value: Any, where: str, environ: Mapping[str, str]) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table, e.g. [{where}]")
        return _build(tp, value, where, environ)
    if origin is Literal:
        if (where, value) in REMOVED:
            message, hint = REMOVED[where, value]
            raise ConfigError(message, hint=hint)
        if value not in typing.get_args(tp):
            allowed = ", ".join(repr(a) for a in typing.get_args(tp))
            raise ConfigError(
                f"{where} = {value!r} is not one of {allowed}"
                + did_you_mean(str(value), [str(a) for a in typing.get_args(tp)])
            )
        return value
    if origin is tuple and dataclasses.is_dataclass(typing.get_args(tp)[0]):
        item = typing.get_args(tp)[0]
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be an array of tables, e.g. [[{where}]]")
        return tuple(_convert(item, v, f"{where}[{i}]", environ) for i, v in enumerate(value))
    if origin is tuple and typing.get_args(tp)[0] is float:
        if not isinstance(value, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(f"{where} must be a list of numbers, e.g. [0.5, 1, 2]")
        return tuple(float(v) for v in value)
    if origin is tuple and typing.get_args(tp)[0] is int:
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(f"{where} must be a list of whole numbers, e.g. [1, 4]")
        return tuple(value)
    if origin is tuple:
        if isinstance(value, str):
            raise ConfigError(f"{where} must be a list of strings, e.g. [{value!r}]")
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} must be a list of strings")
        return tuple(value)
    if origin in (Mapping, dict) or tp is Mapping:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ConfigError(f'{where} must be a table of strings, e.g. KEY = "value"')
        return types.MappingProxyType(dict(value))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (str, int, float, bool) and type(value) is tp:
        return _expand(value, environ, where) if tp is str else value
    raise ConfigError(f"{where} must be of type {getattr(tp, '__name__', tp)}, not {value!r}")


#: settings (value None) and values taken out: (message, what to do instead)
REMOVED: dict[tuple[str, Any], tuple[str, str]] = {
    ("gate.max_resolution", None): (
        "gate.max_resolution is no longer a setting",
        "remove it: a row PASSes only when its interval excludes the tolerated loss "
        "(docs/bench.md#the-gate); `servegate bench noise` says which tolerance this box "
        "resolves",
    ),
    ("gate.inconclusive", "evidence"): (
        "gate.inconclusive = 'evidence' is gone: it PASSed rows whose interval could not "
        "exclude the tolerated loss",
        "remove it (the default 'inconclusive' rolls an open row back), or set 'pass' if no "
        "evidence of a loss is enough for you",
    ),
}


def _build(
    cls: type[Any], data: Mapping[str, Any], section: str, environ: Mapping[str, str]
) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "path"}
    prefix = f"{section}." if section else ""
    for key in data:
        if (f"{prefix}{key}", None) in REMOVED:
            message, hint = REMOVED[f"{prefix}{key}", None]
            raise ConfigError(message, hint=hint)
        if key not in fields:
            place = f"[{section}]" if section else "the top level"
            raise ConfigError(
                f"unknown key {key!r} in {place}" + did_you_mean(key, fields),
                hint="see docs/config.md for every key",
            )
    kwargs: dict[str, Any] = {}
    for name, fld in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], f"{prefix}{name}", environ)
        elif fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING:
            what = (
                f"missing required key {name!r} in section [{section}]"
                if section
                else f"the required [{name}] section is missing"
            )
            raise ConfigError(what, hint="see docs/config.md")
    return cls(**kwargs)


#: a unit name both managers take as it is (systemd's unit name characters, without
#: the escapes its ``\x`` sequences would need; supervisord's program name)
UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}")


def _validate(cfg: Config) -> None:
    svc = cfg.service
    if bool(svc.command) == bool(svc.profile):
        raise ConfigError(
            "[service] needs either command or profile" + (" — not both" if svc.command else ""),
            hint='e.g. profile = "v620-tp4" with [service.params], or command = [argv...]',
        )
    if svc.profile and (svc.memory_max or svc.memory_swap_max):
        raise ConfigError(
            "service.memory_max/memory_swap_max are set while service.profile is used",
            hint="set the unit's limits in the profile's [unit] table",
        )
    if svc.params and not svc.profile:
        raise ConfigError("[service.params] needs service.profile")
    if not 0 < cfg.service.port < 65536:
        raise ConfigError(f"service.port = {cfg.service.port} is not a TCP port")
    if not UNIT_NAME.fullmatch(cfg.service.unit):
        raise ConfigError(
            f"service.unit = {cfg.service.unit[:80]!r} is not a service name systemd and "
            "supervisord both take",
            hint="letters, digits and - _ . : @ (at most 200), starting with a letter or digit; "
            'e.g. unit = "vllm-stack"',
        )
    check_arch_names(cfg.build.archs)
    names = [t.name for t in cfg.build.targets]
    if len(names) != len(set(names)):
        raise ConfigError(f"build.targets has duplicate names: {names}")
    for target in cfg.build.targets:
        if target.kind == "portable" and not cfg.build.archs:
            raise ConfigError(f"build.targets {target.name!r} (portable) needs build.archs")
        if target.kind != "cmake" and not target.output:
            raise ConfigError(f"build.targets {target.name!r} ({target.kind}) needs an output")
        if target.kind == "cmake" and not target.outputs:
            raise ConfigError(f"build.targets {target.name!r} (cmake) needs outputs (globs)")
    _validate_bench(cfg)
    _validate_remote(cfg)
    if cfg.host.keep_releases < 2:
        raise ConfigError("host.keep_releases must be at least 2 (the live and previous release)")
    _validate_tag(cfg.release.tag)


def _validate_tag(pattern: str) -> None:
    """release.tag makes a valid tag name whatever the date, SHA or count: checked here,
    with git's rules for reference names, never after a release is proven."""
    sample = (
        pattern.replace("{date}", "20260101")
        .replace("{time}", "000000")
        .replace("{short}", "0123456789ab")
        .replace("{sha}", "0123456789abcdef0123456789abcdef01234567")
        .replace("{n}", "1")
    )
    why = ref_name_problem(sample)
    if why:
        raise ConfigError(
            f"release.tag = {pattern!r} does not make a valid tag name ({sample!r}: {why})",
            hint='use letters, digits, "-", "_", "." and "/" with the placeholders {date} '
            '{time} {short} {sha} {n}, e.g. "release/{date}-{time}-{short}"',
        )


def ref_name_problem(name: str) -> str:
    """Why ``name`` is not a valid tag name (``git check-ref-format`` rules, and no leading
    "-" that a git command would read as an option); "" when it is."""
    bad = sorted({c for c in name if ord(c) < 0x20 or ord(c) == 0x7F or c in " ~^:?*[\\"})
    if not name:
        return "it is empty"
    if bad:
        return "it holds " + ", ".join(repr(c) for c in bad)
    if name.startswith("-"):
        return 'it starts with "-"'
    if name == "@" or "@{" in name:
        return 'it is "@" or holds "@{"'
    if ".." in name:
        return 'it holds ".."'
    if name.startswith("/") or name.endswith("/") or "//" in name:
        return 'it starts or ends with "/" or holds "//"'
    if name.endswith("."):
        return 'it ends with "."'
    for part in name.split("/"):
        if part.startswith(".") or part.endswith(".lock"):
            return f'the part {part!r} starts with "." or ends with ".lock"'
    return ""


def _validate_remote(cfg: Config) -> None:
    if not cfg.remote_hosts:
        return
    if cfg.host.ssh and cfg.fleet.hosts:
        raise ConfigError("give host.ssh (one host) or [[fleet.hosts]], not both")
    missing = [h.address for h in cfg.remote_hosts if not (h.config or cfg.ssh.config)]
    if missing:
        raise ConfigError(
            f"no config file on the host is named for {missing[0]}",
            hint="set ssh.config (the path of servegate.toml on the hosts) or config in "
            "its [[fleet.hosts]] table",
        )
    addresses = [h.address for h in cfg.remote_hosts]
    if len(set(addresses)) != len(addresses):
        raise ConfigError(f"fleet.hosts names a host twice: {addresses}")
    if cfg.fleet.canary < 0 or cfg.fleet.wave_size < 1:
        raise ConfigError("fleet.canary must be >= 0 and fleet.wave_size >= 1")


def _validate_bench(cfg: Config) -> None:
    b = cfg.bench
    named = [("bench.tiers", t) for t in b.tiers] + [
        ("probes.prefix_tier", cfg.probes.prefix_tier),
        ("probes.vision_followup_tier", cfg.probes.vision_followup_tier),
    ]
    for key, tier in named:
        if tier not in TIERS:
            raise ConfigError(
                f"{key} has {tier!r}, which is no tier",
                hint=f"tiers: {', '.join(TIERS)}" + did_you_mean(tier, list(TIERS)),
            )
    for c in b.concurrency:
        if not 1 <= c <= 64:
            raise ConfigError(f"bench.concurrency has {c}: give numbers 1..64")
    if b.repetitions < 1 or b.max_repetitions < b.repetitions:
        raise ConfigError("bench.repetitions must be >= 1 and <= bench.max_repetitions")
    if b.max_starts < 1:
        raise ConfigError(
            f"bench.max_starts = {b.max_starts}: it must be >= 1 (1: the gate never restarts "
            "the service; it never uses more starts than bench.max_repetitions)"
        )
    if not 0 <= b.max_usage_excess <= 10:
        raise ConfigError(
            f"bench.max_usage_excess = {b.max_usage_excess}: give a fraction >= 0 (0.02: "
            "usage may claim 2 % more output tokens than the streamed text counts)"
        )
    if not 0 < b.max_chunk_share <= 1:
        raise ConfigError(
            f"bench.max_chunk_share = {b.max_chunk_share}: give a fraction in (0, 1] (0.10: "
            "one chunk may carry a tenth of the answer's text, or 256 characters)"
        )
    if not 0 < b.max_first_gap_share <= 100:
        raise ConfigError(
            f"bench.max_first_gap_share = {b.max_first_gap_share}: give a share > 0 (0.5: "
            "the wait after the first text chunk may be half the time to it)"
        )
    if b.chat_template_kwargs:
        try:
            kwargs = json.loads(b.chat_template_kwargs)
        except ValueError as exc:
            raise ConfigError(f"bench.chat_template_kwargs is not JSON: {exc}") from None
        if not isinstance(kwargs, dict):
            raise ConfigError("bench.chat_template_kwargs must be a JSON object")
    for pattern in b.window_log_patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"bench.window_log_patterns: {pattern!r}: {exc}") from None
    if cfg.gate.floors:
        floors = resources.files("servegate.bench").joinpath("floors")
        if not floors.joinpath(f"{cfg.gate.floors}.toml").is_file():
            shipped = sorted(p.name.removesuffix(".toml") for p in floors.iterdir())
            raise ConfigError(
                f"gate.floors = {cfg.gate.floors!r} is not a shipped floor set",
                hint=f"shipped: {', '.join(shipped)}",
            )
    if not cfg.gate.checks:
        raise ConfigError(
            "gate.checks is empty: a gate without checks would pass every release",
            hint='name at least one check, e.g. checks = ["smoke"] (the default)',
        )
    for key in ("false_alarm", "miss", "drift", "restart_offset"):
        if not 0 < getattr(cfg.gate, key) < 1:
            raise ConfigError(f"gate.{key} must be in (0, 1)")
    for rule in cfg.gate.rules:
        if not 0 <= rule.tolerance < 1:
            raise ConfigError(f"gate.rules {rule.metric}: tolerance must be in [0, 1)")


#: what ``servegate build`` and ``servegate focus`` need of a config: [build] and [focus]
#: alone; the deploy sections may be left out for them
UNCONFIGURED_COMMAND = ("(not configured)",)
DEPLOY_PLACEHOLDERS = {
    "stack": {"remote": ""},
    "host": {"root": ""},
    "service": {"command": list(UNCONFIGURED_COMMAND), "port": 1},
}


def parse(
    text: str, *, path: str = "<string>", environ: Mapping[str, str], build_only: bool = False
) -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    remote = bool(data.get("host", {}).get("ssh") or data.get("fleet", {}).get("hosts"))
    if build_only or remote:
        for section, placeholder in DEPLOY_PLACEHOLDERS.items():
            data.setdefault(section, placeholder)
    elif isinstance(data.get("host"), dict) and not data["host"].get("root"):
        raise ConfigError(
            "missing required key 'root' in section [host]", hint="see docs/config.md"
        )
    cfg: Config = _build(Config, data, "", environ)
    cfg = dataclasses.replace(cfg, path=path)
    _validate(cfg)
    return cfg


def load(path: Path, environ: Mapping[str, str], build_only: bool = False) -> Config:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"config file {path} not found",
            hint="pass --config PATH or create servegate.toml (see docs/config.md)",
        ) from None
    return parse(text, path=str(path), environ=environ, build_only=build_only)


def fill(value: str, **places: str) -> str:
    """Replace ``{name}`` placeholders by name only, so JSON arguments keep their braces."""
    for name, replacement in places.items():
        value = value.replace("{" + name + "}", replacement)
    return value


def bare(profile: str = "", params: Mapping[str, str] | None = None, port: int = 8000) -> Config:
    """A config with no file behind it: a launch profile looked at alone (render, lint)."""
    service = Service(port=port, profile=profile, params=dict(params or {}))
    return Config(stack=Stack(""), host=Host(""), service=service)
