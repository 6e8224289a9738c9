#!/bin/sh
# Pod bootstrap for gpucli's bundled trainer. Idempotent: a second run only checks.
#   sh setup_pod.sh [PYTHON]
# Needs a POSIX shell and a Python 3.10+ with pip. Installs only what is missing: the trainer needs
# torch (stock PyTorch pod images have it), numpy and pyyaml; tokenizers and tensorboard are optional.
set -eu
PY="${1:-python3}"
if ! command -v "$PY" >/dev/null 2>&1; then
    echo "setup_pod: $PY not found on the pod; use an image with Python 3 (e.g. a PyTorch image)" >&2
    exit 3
fi
"$PY" - <<'PYEOF'
import sys
if sys.version_info < (3, 10):
    sys.exit(f"setup_pod: Python {sys.version.split()[0]} is too old; the trainer needs 3.10+")
PYEOF
missing=""
for mod in torch numpy yaml; do
    "$PY" -c "import $mod" >/dev/null 2>&1 || missing="$missing $mod"
done
if [ -n "$missing" ]; then
    pkgs=""
    for m in $missing; do
        case "$m" in yaml) pkgs="$pkgs pyyaml" ;; *) pkgs="$pkgs $m" ;; esac
    done
    echo "setup_pod: installing$pkgs"
    # shellcheck disable=SC2086
    "$PY" -m pip install --quiet $pkgs
fi
for opt in tokenizers tensorboard; do
    "$PY" -c "import $opt" >/dev/null 2>&1 || "$PY" -m pip install --quiet "$opt" >/dev/null 2>&1 || \
        echo "setup_pod: optional $opt not installed (the trainer works without it)"
done
command -v setsid >/dev/null 2>&1 || { echo "setup_pod: setsid missing (util-linux)" >&2; exit 3; }
"$PY" -c "import torch; print('setup_pod: ok: torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'gpus', torch.cuda.device_count())"
