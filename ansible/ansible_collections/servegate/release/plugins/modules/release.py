#!/usr/bin/python
# Copyright: servegate maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Run servegate's release command on the target host and return its JSON."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: release
short_description: Promote, roll back, or check the LLM serving release on a host
version_added: "0.1.0"
description:
  - Runs C(servegate release promote|rollback|status|verify --json) on the target
    host with that host's own servegate and config, and returns servegate's answer.
  - The host fetches the commit from the stack's Git remote itself; nothing is copied.
  - C(changed) is true only when a release happened (a promote that released, a
    rollback that ran); any other outcome fails with servegate's exit code and reason,
    after servegate has rolled the host back on its own where the gate failed.
  - A command past O(timeout) fails with exit code 124 as C(changed), since the host may
    be half switched, and the role's rescue recovers a changed host.
options:
  action:
    description: What to run.
    type: str
    required: true
    choices: [promote, rollback, status, verify]
  sha:
    description:
      - promote, the full commit SHA to release.
      - verify, check the signed attestations of this SHA (C(release verify --attestation))
        instead of the live processes - the signer allowed by the stack's allowed-signers
        file, the subjects this host's checkout, the verdict released.
      - rollback, undo this release where it serves - an interrupted release is
        recovered first, and a host that does not serve it is left alone (not changed).
    type: str
  to:
    description: The release to roll back to (rollback only; default the previous one).
    type: str
  config:
    description: The host's servegate.toml.
    type: path
    default: ~/servegate.toml
  servegate:
    description: The servegate executable on the host (a path or a name on PATH).
    type: str
    default: servegate
  timeout:
    description:
      - Seconds the command may take (a promote builds, restarts and gates).
      - Past it servegate is interrupted as Ctrl-C would (after its switch it puts the
        previous release back, verified), then killed after O(interrupt_grace). The task
        fails as C(changed) with exit code 124, since a killed promote can leave the host
        half switched, and the role's rescue recovers a changed host.
    type: int
    default: 7200
  interrupt_grace:
    description:
      - Seconds servegate is given, once interrupted at O(timeout), to put the previous
        release back by itself before it is killed (a restart, its health check and
        gate; a large model's start-up takes minutes).
    type: int
    default: 900
author:
  - servegate maintainers
"""

EXAMPLES = r"""
- name: Promote a commit on this host
  servegate.release.release:
    action: promote
    sha: "{{ release_sha }}"
    config: /srv/servegate/servegate.toml
  register: promoted

- name: Roll back
  servegate.release.release:
    action: rollback
"""

RETURN = r"""
servegate:
  description: servegate's JSON answer (its C(result) object).
  returned: always
  type: dict
verdict:
  description: The promote's verdict (released, rolled_back, failed), or ok / failed.
  returned: always
  type: str
exit_code:
  description: servegate's exit code (docs/exit-codes.md).
  returned: always
  type: int
sha:
  description: The commit the host serves afterwards, when servegate says.
  returned: when known
  type: str
gate:
  description: The gate's verdict (PASS, FAIL, INCONCLUSIVE) of a promote that got to it.
  returned: when a gate ran
  type: str
"""

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def _live(result):
    """The commit the host serves after the command, where servegate's answer says."""
    current = result.get("current")
    if isinstance(current, dict) and current.get("sha"):
        return current["sha"]
    back = result.get("rollback")
    if result.get("verdict") == "rolled_back" and isinstance(back, dict):
        return back.get("sha")
    if result.get("verdict") in (None, "released") and isinstance(result.get("sha"), str):
        return result["sha"]
    return None


def _gate(result):
    record = result.get("record")
    gate = record.get("gate") if isinstance(record, dict) else None
    return gate.get("verdict") if isinstance(gate, dict) else None


def _stop(proc, grace):
    """Interrupt servegate as Ctrl-C would, then kill it if it is still there after
    ``grace`` seconds: interrupted after its switch, servegate puts the previous release
    back, verified, and records the attempt; killed, it leaves ``pending`` in the host's
    state for ``release recover``. Returns its output and how it was stopped."""
    for sig, wait, how in (
        (signal.SIGINT, grace, "interrupted"),
        (signal.SIGKILL, 30, f"killed after {grace} s more"),
    ):
        with contextlib.suppress(ProcessLookupError):  # it ended on its own meanwhile
            os.killpg(proc.pid, sig)
        try:
            out, err = proc.communicate(timeout=wait)
            return out, err, how
        except subprocess.TimeoutExpired:
            continue
    return "", "", "killed, and did not end"


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run(module, action, extra=()):
    """servegate release ACTION on this host: (exit code, result, error, stderr)."""
    p = module.params
    argv = [p["servegate"], "release", action, *extra, "--config", p["config"], "--json"]
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own group: stopped whole, and alone
            # its interrupt must work even where Ansible itself runs with SIGINT ignored
            # (started in the background, by nohup or cron): a child inherits that
            preexec_fn=_default_sigint,
        )
    except FileNotFoundError:
        module.fail_json(
            msg=f"{p['servegate']} not found on the host",
            exit_code=127,
            verdict="failed",
            servegate={},
            cmd=argv,
        )
    try:
        out, err = proc.communicate(timeout=p["timeout"])
    except subprocess.TimeoutExpired:
        out, err, how = _stop(proc, p["interrupt_grace"])
        _, result, error = _answer(out)
        said = error.get("message") or result.get("reason") or ""
        if error.get("hint"):
            said += f"; {error['hint']}"
        if how != "interrupted":
            said = "the host may be half switched: `release recover` finishes it"
        module.fail_json(
            msg=f"servegate release {action} ran past {p['timeout']} s and was {how}"
            + (f" ({said})" if said else ""),
            # its state is unknown: a changed host is what the role's rescue recovers
            changed=action in ("promote", "rollback", "recover"),
            exit_code=124,
            verdict="timed out",
            servegate=result,
            cmd=argv,
        )
    code = proc.returncode
    doc, result, error = _answer(out)
    if doc is None:
        module.fail_json(
            msg=f"servegate answered no JSON object (exit {code}): {err.strip()[-800:]}",
            exit_code=code,
            verdict="failed",
            servegate={},
            cmd=argv,
        )
    return code, result, error, err


def _answer(out):
    """servegate's JSON document on stdout, with its result and error objects."""
    try:
        doc = json.loads(out)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return None, {}, {}
    result = doc.get("result") if isinstance(doc.get("result"), dict) else {}
    error = doc.get("error") if isinstance(doc.get("error"), dict) else {}
    return doc, result, error


def _undo(module, sha):
    """Roll back ``sha`` where it serves: an interrupted release is recovered first (the
    last proven release back); a host that does not serve ``sha`` is left alone."""
    code, result, _, _ = _run(module, "status")
    recovered = False
    if code != 0 or result.get("pending"):
        _run(module, "recover")
        recovered = True
        code, result, _, _ = _run(module, "status")
    live = _live(result)
    if live != sha:
        module.exit_json(
            changed=recovered,
            verdict="recovered" if recovered else "not serving it",
            exit_code=0,
            servegate=result,
            sha=live,
            gate=None,
        )


def main():
    module = AnsibleModule(
        argument_spec={
            "action": {
                "type": "str",
                "required": True,
                "choices": ["promote", "rollback", "status", "verify"],
            },
            "sha": {"type": "str"},
            "to": {"type": "str"},
            "config": {"type": "path", "default": "~/servegate.toml"},
            "servegate": {"type": "str", "default": "servegate"},
            "timeout": {"type": "int", "default": 7200},
            "interrupt_grace": {"type": "int", "default": 900},
        },
        required_if=[("action", "promote", ("sha",))],
        supports_check_mode=True,
    )
    p = module.params
    action = p["action"]
    if module.check_mode and action in ("promote", "rollback"):
        module.exit_json(changed=True, verdict="check mode", exit_code=0, servegate={})
    extra = []
    if action == "promote":
        extra.append(p["sha"])
    if action == "verify" and p["sha"]:
        extra += ["--attestation", p["sha"]]
    if action == "rollback" and p["sha"]:
        _undo(module, p["sha"])  # returns only where the host serves that SHA
    if action == "rollback" and p["to"]:
        extra += ["--to", p["to"]]
    # (rollback with sha: _undo returned, so the host serves it: roll it back)
    code, result, error, err = _run(module, action, extra)
    verdict = result.get("verdict") or ("ok" if code == 0 else "failed")
    answer = {
        "servegate": result,
        "exit_code": code,
        "verdict": verdict,
        "sha": _live(result),
        "gate": _gate(result),
    }
    if code != 0:
        reason = error.get("message") or result.get("reason") or err.strip()[-400:]
        hint = error.get("hint") or ""
        module.fail_json(
            msg=f"servegate release {action} exited {code}: {reason}"
            + (f" ({hint})" if hint else ""),
            **answer,
        )
    changed = (action == "promote" and verdict == "released") or action == "rollback"
    module.exit_json(changed=changed, **answer)


if __name__ == "__main__":
    main()
