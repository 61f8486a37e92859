"""Every failure class servegate reports, each with its documented exit code.

The table in docs/exit-codes.md is checked against this module by the test suite.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(key: str, choices: Iterable[str]) -> str:
    """`` — did you mean 'x'?`` for the closest of ``choices``, or nothing."""
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.6)
    return f" — did you mean {close[0]!r}?" if close else ""


class ServegateError(Exception):
    """Base class: ``str(err)`` is the message, ``hint`` says what to do about it."""

    exit_code = 1
    title = "error"

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint

    def render(self) -> str:
        text = f"{self.title}: {self}"
        if self.hint:
            text += f"\n  what to do: {self.hint}"
        return text


class ConfigError(ServegateError):
    """The config file or a command-line argument is wrong."""

    exit_code = 2
    title = "config error"


class GitRefusal(ServegateError):
    """The requested SHA can't be deployed: unknown, not on the branch, not a fast-forward,
    or the checkout is not clean."""

    exit_code = 3
    title = "refused"


class LockHeld(ServegateError):
    """Another promote or rollback holds the host lock."""

    exit_code = 4
    title = "host busy"


class BuildFailed(ServegateError):
    """The stack's build command failed or produced no artifacts; nothing live was touched."""

    exit_code = 5
    title = "build failed"


class PreflightFailed(ServegateError):
    """The host is not ready for a restart (for example the service port is taken by
    another process); nothing live was touched."""

    exit_code = 6
    title = "preflight failed"


class ServiceFailed(ServegateError):
    """The service did not start, did not become healthy in time, or crash-looped."""

    exit_code = 7
    title = "service failed"


class ProvenanceMismatch(ServegateError):
    """A live process does not run the release's checkout."""

    exit_code = 8
    title = "provenance mismatch"


class GateFailed(ServegateError):
    """A probe or the release gate failed."""

    exit_code = 9
    title = "gate failed"


class RollbackFailed(ServegateError):
    """The automatic or requested rollback did not leave a verified service running."""

    exit_code = 10
    title = "ROLLBACK FAILED"


class CommandFailed(ServegateError):
    """A subprocess failed; its text shows the command, the exit code and the output."""

    exit_code = 11
    title = "command failed"


class NothingToDo(ServegateError):
    """The request needs state that does not exist yet (no release recorded, no previous
    release to roll back to)."""

    exit_code = 12
    title = "nothing to do"


class BenchFailed(ServegateError):
    """The bench could not measure: the server is down or answers errors, a tier does not
    fit the server's max model length, or requests failed; the partial result is kept."""

    exit_code = 13
    title = "bench failed"


class ResultFileError(ServegateError):
    """A bench result file is missing, malformed, of an unknown schema, or was measured
    with a different fingerprint than the run it is compared with."""

    exit_code = 14
    title = "result file"


class LintFailed(ServegateError):
    """A lint rule of severity ``fail`` matched the launch (profile, arguments,
    environment or unit); promote stops before the live service is touched."""

    exit_code = 15
    title = "lint failed"


class LogRuleFailed(ServegateError):
    """A log rule of severity ``fail`` matched the server's output during start-up (or a
    ``require`` line never appeared)."""

    exit_code = 16
    title = "log rule failed"


class HostUnreachable(ServegateError):
    """A host could not be reached over SSH, or the connection was lost during a command;
    the message says whether the host may have been changed and what the next run does."""

    exit_code = 17
    title = "host unreachable"


class HostKeyRejected(ServegateError):
    """A host's SSH key is not in known_hosts, or differs from it: no connection made."""

    exit_code = 18
    title = "host key rejected"


class GpuTestsSkipped(ServegateError):
    """A GPU test run on a machine with a GPU skipped every selected test: nothing was
    tested, so the run is not green."""

    exit_code = 19
    title = "every GPU test skipped"


class StateInvalid(ServegateError):
    """The host's state file is damaged or holds what no run of servegate wrote (a SHA
    that is no SHA, a release directory outside the host root): nothing in it is used."""

    exit_code = 20
    title = "host state invalid"


class NoGpuVisible(ServegateError):
    """``servegate focus --run --require-gpu`` found no GPU on the machine (no
    ``nvidia-smi`` or ``rocminfo`` lists one): the selected GPU tests would all skip."""

    exit_code = 21
    title = "no GPU visible"


class AttestationFailed(ServegateError):
    """``release verify --attestation`` (or a promote with ``attest.require_live``) found no
    attestation of the SHA signed by an allowed signer, or one whose subjects, host or
    verdict do not hold."""

    exit_code = 22
    title = "attestation not verified"


class GpuUnhealthy(ServegateError):
    """``servegate gpu health`` (or a runner's job hook, or a promote before its bench)
    found a GPU unfit to run a job or to measure a release: the message lists each
    finding and what to do."""

    exit_code = 23
    title = "GPU unhealthy"


INTERNAL_ERROR = 70
INTERRUPTED = 130


class Interrupted(ServegateError):
    """Ctrl-C (SIGINT) after the switch: the previous release is put back, the attempt is
    recorded with reason "interrupted"; the command exits 130 like any interruption."""

    exit_code = INTERRUPTED
    title = "interrupted"


ALL_ERRORS: tuple[type[ServegateError], ...] = (
    ConfigError,
    GitRefusal,
    LockHeld,
    BuildFailed,
    PreflightFailed,
    ServiceFailed,
    ProvenanceMismatch,
    GateFailed,
    RollbackFailed,
    CommandFailed,
    NothingToDo,
    BenchFailed,
    ResultFileError,
    LintFailed,
    LogRuleFailed,
    HostUnreachable,
    HostKeyRejected,
    GpuTestsSkipped,
    StateInvalid,
    NoGpuVisible,
    AttestationFailed,
    GpuUnhealthy,
)
