#!/bin/sh
# Pod bootstrap for gpucli's bundled trainer. Idempotent: a second run reuses what the first built.
#   sh setup_pod.sh PYTHON ENV_ROOT
# Run in the folder that holds the trainer's pin file (requirements.txt) and envbuild.py. Needs a POSIX
# shell and a Python 3.10+ (the image's). Checks TLS, then gives the trainer exactly the environment it is
# tested with (envbuild.py: the image's Python when it has it, else a venv under ENV_ROOT built from
# PyTorch's index for this host's driver, or reused). Its last line, GPUCLI-ENV {...}, names the Python.
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
command -v setsid >/dev/null 2>&1 || { echo "setup_pod: setsid missing (util-linux)" >&2; exit 3; }
ROOT="${2:-.gpucli-envs}"
"$PY" envbuild.py --pins requirements.txt --root "$ROOT" --python "$(command -v "$PY")"
