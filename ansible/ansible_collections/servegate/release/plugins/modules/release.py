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
options:
  action:
    description: What to run.
    type: str
    required: true
    choices: [promote, rollback, status, verify]
  sha:
    description:
      - promote, the full commit SHA to release.
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
    description: Seconds the command may take (a promote builds, restarts and gates).
    type: int
    default: 7200
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

import json  # noqa: E402
import os  # noqa: E402
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


def _run(module, action, extra=()):
    """servegate release ACTION on this host: (exit code, result, error, stderr)."""
    p = module.params
    argv = [p["servegate"], "release", action, *extra, "--config", p["config"], "--json"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=p["timeout"], check=False
        )
    except FileNotFoundError:
        module.fail_json(
            msg=f"{p['servegate']} not found on the host",
            exit_code=127,
            verdict="failed",
            servegate={},
            cmd=argv,
        )
    except subprocess.TimeoutExpired:
        module.fail_json(
            msg=f"servegate release {action} ran past {p['timeout']} s",
            exit_code=124,
            verdict="failed",
            servegate={},
            cmd=argv,
        )
    code, out, err = done.returncode, done.stdout, done.stderr
    try:
        doc = json.loads(out)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        module.fail_json(
            msg=f"servegate answered no JSON object (exit {code}): {err.strip()[-800:]}",
            exit_code=code,
            verdict="failed",
            servegate={},
            cmd=argv,
        )
    result = doc.get("result") if isinstance(doc.get("result"), dict) else {}
    error = doc.get("error") if isinstance(doc.get("error"), dict) else {}
    return code, result, error, err


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
        },
        required_if=[("action", "promote", ("sha",))],
        supports_check_mode=True,
    )
    p = module.params
    p["config"] = os.path.expanduser(p["config"])
    action = p["action"]
    if module.check_mode and action in ("promote", "rollback"):
        module.exit_json(changed=True, verdict="check mode", exit_code=0, servegate={})
    extra = []
    if action == "promote":
        extra.append(p["sha"])
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
