"""The run's processes on its host, by identity and not by pid alone (see gpucli/pod/procid.py).

Each check runs on the host in one command with the signal it guards, so nothing can take the pid
between the check and the kill's decision. Records written before identities were kept have none;
for those the pid is all there is, and the old behaviour stays.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from gpucli.runs import podfiles

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.runs.records import RunRecord

PROCID = podfiles.ON_STDIN.file("procid.py").path
GONE = "gone"  # the identity of a process that had already exited when it was asked for: matches nothing


def _procid(host: Host, python: str, *args: str):  # noqa: ANN202 - a CommandResult
    cmd = " ".join([shlex.quote(python), "-", *(shlex.quote(a) for a in args)])
    return host.run(cmd, timeout_s=30, check=False, input=PROCID.read_bytes())


def identify(host: Host, python: str, pid: int) -> str:
    """The identity of ``pid`` on the host, taken right after it was started."""
    res = _procid(host, python, "ident", str(int(pid)))
    return res.stdout.strip() or GONE if res.exit_code == 0 else GONE


def alive(host: Host, record: RunRecord, pid: int | None, ident: str | None) -> bool:
    """Whether the recorded process group is alive, and is still the one the record started."""
    if not pid:
        return False
    if ident is None:
        return host.is_running(pid)
    return _procid(host, record.python, "alive", str(int(pid)), ident).exit_code == 0


def signal(host: Host, record: RunRecord, pid: int | None, ident: str | None, sig: str) -> str:
    """Send ``sig`` to the recorded process group if it is still the one the record started:
    ``sent``, ``gone`` (nothing of it left) or ``stale`` (the pid is another process's now: nothing sent)."""
    if not pid:
        return "gone"
    if ident is None:
        return "sent" if host.signal(pid, sig) else "gone"
    code = _procid(host, record.python, "signal", str(int(pid)), ident, sig).exit_code
    return {0: "sent", 3: "stale"}.get(code, "gone")
