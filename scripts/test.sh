#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine, then runs it.
#   scripts/test.sh            # whole suite
#   scripts/test.sh -k planner # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

# A real OpenSSH server (the SSH and provider tests start their own sshd on 127.0.0.1) and rsync
# (the sync benchmark compares against it).
if [ ! -x /usr/sbin/sshd ] || ! command -v rsync >/dev/null 2>&1; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openssh-server openssh-client rsync >/dev/null
fi

PY="${PYTHON:-python3}"
# The trainer's environment is the one pinned in trainer/requirements.txt (what every pod gets too).
# torch's CPU build: on PyPI `torch==X` for Linux x86-64 is the CUDA build (it pulls the CUDA toolkit,
# cuDNN and NCCL: gigabytes the tests never use); PyTorch's own CPU index has the CPU build (X+cpu) and
# the packages it needs. Where only a package index is reachable (a mirror, an offline wheel cache), the
# plain requirement from that index is what there is.
PINS=trainer/requirements.txt
TORCH_PIN=$(grep -E '^torch==' "$PINS")
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
if ! "$PY" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '${TORCH_PIN#torch==}')" >/dev/null 2>&1; then
    "$PY" -m pip install -q --timeout 30 --retries 2 --index-url "$TORCH_CPU_INDEX" "$TORCH_PIN" \
        || "$PY" -m pip install -q "$TORCH_PIN"
fi
"$PY" -m pip install -q -r "$PINS"
"$PY" -m pip install -q -e ".[train,data,test]"

# Most tests wait on real processes (sshd, torchrun, the emulators' pods), so more workers than cores
# pays: 4 workers on a 2-core machine (775 tests: 6:44 against 7:49 with 3; the CPU was 70 % busy
# with 3). PYTEST_WORKERS=0 runs them in this process.
exec "$PY" -m pytest -q -n "${PYTEST_WORKERS:-4}" "$@"
