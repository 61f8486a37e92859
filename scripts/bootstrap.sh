# Sourced by scripts/demo and scripts/test: everything a fresh machine with Python 3.11+
# and git needs, installed from package registries only.
set -euo pipefail

python=${PYTHON:-python3}
as_root_apt() {  # as_root_apt WHAT PACKAGES...: install with apt-get when root, else say how
  local what=$1; shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing $what (Debian: $*)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null
  else
    echo "bootstrap: $what is missing; install it: sudo apt-get install -y $*" >&2
    return 1
  fi
}
# Debian splits venv support out of python3 (python3-venv); the tests build .so files with cc
if [ ! -x .venv/bin/python ] && ! "$python" -c "import ensurepip" 2>/dev/null; then
  ver=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  as_root_apt "venv support for $python" "python$ver-venv" || exit 1
fi
if ! command -v cc >/dev/null 2>&1; then
  as_root_apt "a C compiler" gcc libc6-dev || true
fi
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv"
  "$python" -m venv .venv
fi
if ! .venv/bin/python -c "import servegate, pytest, mypy, ruff, pre_commit" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.servegate-installed ] \
   || [ constraints.txt -nt .venv/.servegate-installed ]; then
  echo "bootstrap: installing servegate and its dev tools into .venv (versions: constraints.txt)"
  .venv/bin/python -m pip install --disable-pip-version-check -q -c constraints.txt -e '.[dev]'
  touch .venv/.servegate-installed
fi

# hipcc for gfx1030 (the demo stack's kernels): Debian's ROCm packages
if ! command -v hipcc >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing hipcc (Debian: hipcc libamdhip64-dev rocm-device-libs)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q hipcc libamdhip64-dev rocm-device-libs >/dev/null
  else
    echo "bootstrap: hipcc is missing; install it: sudo apt-get install -y hipcc libamdhip64-dev rocm-device-libs" >&2
  fi
fi

# sshd (Debian's openssh-server) for the SSH/fleet tests: they start it themselves, one
# per network namespace; nothing listens on this machine's own addresses
if [ ! -x /usr/sbin/sshd ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing openssh-server (sshd for the SSH tests; not started)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      openssh-server openssh-client iproute2 >/dev/null
  else
    echo "bootstrap: sshd is missing; the SSH tests will be skipped (sudo apt-get install -y openssh-server)" >&2
  fi
fi

# ssh-keygen signs the release attestations, and jq is the auditor's tool the
# attestation tests run docs/attestations.md's verification block with
if ! command -v ssh-keygen >/dev/null 2>&1 || ! command -v jq >/dev/null 2>&1; then
  as_root_apt "ssh-keygen and jq (the attestation tests)" openssh-client jq || true
fi
