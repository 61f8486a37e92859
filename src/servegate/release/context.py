"""What one promote or rollback works with, made once from the config."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from servegate import envfile, hostpaths
from servegate.config import Config
from servegate.engine import lint, openai
from servegate.engine.launch import (
    COMPILE_CACHES,
    ENV_REF,
    LaunchSpec,
    engine_of,
    launch_spec,
    load_profile,
)
from servegate.engine.managers import ServiceManager, make_manager
from servegate.engine.rules import RuleSet
from servegate.errors import ServegateError
from servegate.pipeline import redact
from servegate.pipeline.stages import Reporter, StageResult, StageRunner
from servegate.provenance import check as provenance
from servegate.release.deploy import Deployer, make_deployer
from servegate.release.state import HostState


@dataclass
class Context:
    cfg: Config
    reporter: Reporter
    manager: ServiceManager
    deployer: Deployer
    state: HostState
    endpoint: openai.Endpoint
    runner: StageRunner
    environ: Mapping[str, str] = field(default_factory=dict)
    #: secret values of servegate's own environment, known before any launch is resolved
    environ_secrets: frozenset[str] = field(default=frozenset(), repr=False)
    #: launches already resolved (profile loaded, caches keyed) per (release dir, sha)
    _specs: dict[tuple[str, str], LaunchSpec] = field(default_factory=dict, repr=False)
    _scrubber: tuple[int, redact.Scrubber] | None = field(default=None, repr=False)
    #: what went wrong on the way without stopping the run: kept in its record
    warnings: list[str] = field(default_factory=list)
    #: this run's name: its pending marker and its records carry it
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def create(cls, cfg: Config, reporter: Reporter, environ: Mapping[str, str]) -> Context:
        environ = envfile.environ_with(cfg.service.env_file, environ)
        api_key = environ.get(cfg.service.api_key_env, "") if cfg.service.api_key_env else ""
        known = environ_secrets(cfg, environ)
        ctx = cls(
            cfg=cfg,
            reporter=reporter,
            manager=make_manager(cfg),
            deployer=make_deployer(cfg),
            state=HostState.load(hostpaths.of(cfg).state),
            endpoint=openai.Endpoint(
                f"http://{cfg.service.host}:{cfg.service.port}", api_key, engine_of(cfg)
            ),
            runner=StageRunner(reporter),
            environ=dict(environ),
            environ_secrets=frozenset(known),
        )
        # every line the reporter prints (a progress line quoting the service's log, a
        # rollback's note) is scrubbed of the secrets known when it is printed
        scrubbing = ScrubbingReporter(reporter, ctx.scrub)
        ctx.reporter = ctx.runner.reporter = scrubbing
        return ctx

    def scrub(self, text: str) -> str:
        """``text`` with every known secret value replaced (a salted hash; a constant when
        the host's salt cannot be read, so printing that very error never fails)."""
        try:
            return self.scrubber.text(text)
        except ServegateError:
            values = set(self.environ_secrets)
            for spec in self._specs.values():
                values |= spec.secrets()
            for value in sorted(values, key=len, reverse=True):
                text = text.replace(value, "<redacted>")
            return text

    @property
    def lock_path(self) -> Path:
        return hostpaths.of(self.cfg).lock

    @property
    def lease_path(self) -> Path:
        return hostpaths.of(self.cfg).lease(os.environ)

    @functools.cached_property
    def rules(self) -> RuleSet:
        """The lint and log rules: shipped, plus the config's ``[lint]`` files."""
        return lint.ruleset(self.cfg)

    @functools.cached_property
    def salt(self) -> str:
        """The host's salt for redacted values (records show a hash, never the value)."""
        return redact.host_salt(self.cfg.host_root)

    @property
    def scrubber(self) -> redact.Scrubber:
        """Every secret value of servegate's environment and of the launches resolved so
        far, for texts servegate did not write itself (a build's or a service's log tail
        in an error, a matched log line)."""
        if self._scrubber is None or self._scrubber[0] != len(self._specs):
            values = set(self.environ_secrets)
            for spec in self._specs.values():
                values |= spec.secrets()
            self._scrubber = (len(self._specs), redact.Scrubber(values, self.salt))
        return self._scrubber[1]

    @property
    def cache_dir(self) -> Path:
        """servegate's own caches on the host (the installed vLLM's variable list, …)."""
        return hostpaths.of(self.cfg).cache

    @property
    def build_cache(self) -> Path:
        return hostpaths.of(self.cfg).build_cache

    def log_path(self, sha: str, what: str) -> Path:
        return hostpaths.of(self.cfg).run_log(sha, what)

    def spec(self, release_dir: Path, sha: str) -> LaunchSpec:
        """The launch of ``sha`` in ``release_dir``: resolved once per promote/rollback
        (lint, switch, start-up scan, provenance and gate all ask for it)."""
        key = (str(release_dir), sha)
        if key not in self._specs:
            self._specs[key] = launch_spec(self.cfg, release_dir, sha).expanded(self.environ)
        return self._specs[key]

    def use_launch(self, release_dir: Path, spec: LaunchSpec) -> None:
        """``spec`` is the launch of its release in ``release_dir`` from now on (a rollback
        installs the launch the release was kept with, not today's render)."""
        self._specs[(str(release_dir), spec.sha)] = spec

    def expectation(self, spec: LaunchSpec, artifacts: Mapping[str, str]) -> provenance.Expectation:
        names = self.cfg.provenance.env or tuple(spec.env)
        return provenance.Expectation(
            release_dir=Path(os.path.realpath(spec.cwd)),
            launch_cwd=Path(spec.cwd),
            sha=spec.sha,
            interpreter=self.cfg.provenance.interpreter.replace("{release}", str(spec.cwd))
            or spec.argv[0],
            env={k: spec.env.get(k, "") for k in names},
            extensions=self.cfg.provenance.extensions,
            artifact_hashes=artifacts,
            modules=self.cfg.provenance.modules,
            releases_root=self.deployer.releases_root,
            port=self.cfg.service.port,
            salt=self.salt,
            runtime_roots=tuple(
                [Path(os.path.expanduser(r)) for r in self.cfg.provenance.runtime_roots]
                + [Path(spec.env[n]) for n in COMPILE_CACHES if spec.env.get(n)]
            ),
            declared_env=dict(spec.env),
            py_spy=os.path.expanduser(self.cfg.provenance.py_spy),
            require_observed=self.cfg.provenance.require_observed,
            read_only_runtime=self.cfg.provenance.read_only_runtime,
            samples=self.cfg.provenance.samples,
            allowed_hooks=self.cfg.provenance.allowed_hooks,
            anonymous_code=self.cfg.provenance.anonymous_code,
            unit_cgroup=(
                f"{self.cfg.service.unit}.service"
                if self.cfg.service.manager == "systemd-user"
                else ""
            ),
        )


def environ_secrets(cfg: Config, environ: Mapping[str, str]) -> set[str]:
    """Values of servegate's environment that must never be printed or recorded: those of
    secret-looking names, those ``${NAME}`` in the service's environment refers to (a
    build log may echo them), service.env_file's and service.api_key_env's."""
    names = {k for k in environ if redact.is_secret(k)}
    templates = list(cfg.service.env.values())
    if cfg.service.profile:
        with contextlib.suppress(ServegateError):  # the launch's resolution reports it
            templates += list(load_profile(cfg).env.values())
    for raw in templates:
        names |= set(ENV_REF.findall(raw))
    if cfg.service.env_file:
        names |= set(envfile.load(os.path.expanduser(cfg.service.env_file)))
    if cfg.service.api_key_env:
        names.add(cfg.service.api_key_env)
    return redact.plain_dropped(environ[n] for n in names if n in environ)


class ScrubbingReporter:
    """A reporter whose notes and progress lines are scrubbed of secret values first."""

    def __init__(self, inner: Reporter, scrub: Callable[[str], str]) -> None:
        self.inner = inner
        self.scrub = scrub

    def stage_started(self, name: str) -> None:
        self.inner.stage_started(name)

    def stage_ended(self, result: StageResult) -> None:
        self.inner.stage_ended(dataclasses.replace(result, detail=self.scrub(result.detail)))

    def progress(self, text: str) -> None:
        # scrubbed whole, then shortened: a secret cut in two would not be recognised
        self.inner.progress(self.scrub(text)[:160])

    def note(self, text: str) -> None:
        self.inner.note(self.scrub(text))
