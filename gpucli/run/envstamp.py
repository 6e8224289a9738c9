"""The pod's environment, set up once per machine: ``setup_pod.sh`` runs when the machine has no stamp of
this very script and Python (a sha256 of both, in ``<the machine's run folders>/.gpucli-env/``), and the stamp
is written once it succeeds. A next run on the same machine (``launch --on``) skips it; a changed script or
another Python runs it again. The script stays idempotent: a stamp lost only costs a rerun."""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpucli.errors import GpucliError
from gpucli.run.start import POD_SETUP

if TYPE_CHECKING:
    from gpucli.run.targets import Host

STAMPS = ".gpucli-env"


def stamp_path(workdir: str, python: str) -> str:
    key = hashlib.sha256(POD_SETUP.read_bytes() + b"\0" + python.encode()).hexdigest()[:24]
    return f"{posixpath.dirname(workdir.rstrip('/')) or '.'}/{STAMPS}/setup-{key}"


def ensure_environment(host: Host, workdir: str, python: str, on_event: Callable[[str], None], *,
                       stamped: bool = True) -> bool:
    """Bootstrap the machine unless it already is, for this script and Python; True when it ran.
    ``stamped=False``: a run folder on a network volume, which outlives the machine whose packages a stamp
    there would vouch for: set up every time."""
    stamp = stamp_path(workdir, python)
    if stamped and host.exists(stamp):
        on_event("environment: ready on this machine (setup_pod.sh unchanged), not set up again")
        return False
    on_event("bootstrapping the pod (setup_pod.sh)")
    host.write_file(f"{workdir}/setup_pod.sh", POD_SETUP.read_bytes(), mode=0o755)
    res = host.run(f"cd {shlex.quote(workdir)} && sh ./setup_pod.sh {shlex.quote(python)}", timeout_s=900, check=False)
    if res.exit_code != 0:
        raise GpucliError(f"pod bootstrap failed: {(res.stderr or res.stdout).strip()[-300:]}")
    if stamped:
        host.run(f"mkdir -p -- {shlex.quote(posixpath.dirname(stamp))}", timeout_s=60)
        host.write_file(stamp, b"ok\n", mode=0o644)
    return True
