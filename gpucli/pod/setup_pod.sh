#!/bin/sh
# Pod bootstrap for gpucli's bundled trainer. Idempotent: a second run only checks.
#   sh setup_pod.sh [PYTHON]
# Needs a POSIX shell and a Python 3.10+ with pip. Installs only what is missing: the trainer needs
# torch (stock PyTorch pod images have it), numpy and pyyaml; tokenizers, tensorboard and safetensors are optional.
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
# TLS: the pod's watchdog ends the pod over HTTPS, and pip and Telegram need it too. Bare images can
# lack CA certificates (runpod/runpodctl#149); say so now, not when the money runs out. On a rented pod
# (the provider's variables in PID 1's environment) it is an error; on a machine of the user's, a warning.
"$PY" - <<'PYEOF'
import os, ssl, sys
paths = ssl.get_default_verify_paths()
loaded = ssl.create_default_context().cert_store_stats().get("x509_ca", 0)
capath = paths.capath or paths.openssl_capath
in_dir = bool(capath) and os.path.isdir(capath) and any(
    n.endswith((".pem", ".crt")) or n[-2:-1] == "." for n in os.listdir(capath))
if loaded == 0 and not in_dir:
    try:
        with open(os.environ.get("GPUCLI_POD_ENVIRON") or "/proc/1/environ", "rb") as fh:
            pid1 = fh.read().split(b"\0")
    except OSError:
        pid1 = []
    pod = any(v.startswith((b"RUNPOD_POD_ID=", b"CONTAINER_ID=")) for v in pid1)
    where = paths.cafile or paths.openssl_cafile
    msg = (f"setup_pod: no CA certificates ({where} missing or empty): this pod cannot verify TLS, so its "
           "watchdog could not stop it; use an image with ca-certificates (runpod/runpodctl#149)")
    if pod:
        sys.exit(msg)
    print(msg.replace("setup_pod: ", "setup_pod: warning: "), file=sys.stderr)
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
optional=$("$PY" -c "import importlib.util as u; print(' '.join(m for m in ('tokenizers', 'tensorboard', 'safetensors') if u.find_spec(m) is None))")
for opt in $optional; do
    "$PY" -m pip install --quiet "$opt" >/dev/null 2>&1 || \
        echo "setup_pod: optional $opt not installed (the trainer works without it)"
done
command -v setsid >/dev/null 2>&1 || { echo "setup_pod: setsid missing (util-linux)" >&2; exit 3; }
"$PY" -c "import torch; print('setup_pod: ok: torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'gpus', torch.cuda.device_count())"
