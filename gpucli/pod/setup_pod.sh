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
# One interpreter start for every check (importing torch alone takes seconds).
missing=$("$PY" - <<'PYEOF'
import importlib.util
need = {"torch": "torch", "numpy": "numpy", "yaml": "pyyaml"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PYEOF
)
if [ -n "$missing" ]; then
    echo "setup_pod: installing $missing"
    # shellcheck disable=SC2086
    "$PY" -m pip install --quiet $missing
fi
optional=$("$PY" -c "import importlib.util as u; print(' '.join(m for m in ('tokenizers', 'tensorboard') if u.find_spec(m) is None))")
for opt in $optional; do
    "$PY" -m pip install --quiet "$opt" >/dev/null 2>&1 || \
        echo "setup_pod: optional $opt not installed (the trainer works without it)"
done
command -v setsid >/dev/null 2>&1 || { echo "setup_pod: setsid missing (util-linux)" >&2; exit 3; }
"$PY" -c "import torch; print('setup_pod: ok: torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'gpus', torch.cuda.device_count())"
