"""What identifies a process beyond its pid, and signals that check it first. Standard library only:
run on the run's host (``python - ident PID`` / ``python - signal PGID IDENT SIG`` with this file on
stdin) and imported by the pod-side watchdog.

A pid alone is not an identity: after a reboot, or once the run has ended, the same number can name
an unrelated process, and a stale run record would signal it. The identity is the boot id and the
process's start time (``/proc/PID/stat`` field 22, clock ticks since boot); where there is no /proc,
the start time ``ps -o lstart=`` prints. The command line is not part of it: the detached shell
``exec``s the trainer, so the command changes while the process stays the same.

This file is also the one answer to "is this process group alive?" (:func:`group_alive`): any of its
processes that is not a zombie (in a container without an init, exited processes may never be
reaped). The watchdog and ``LocalHost`` call it; ``Remote.is_running`` (gpucli/ssh) runs the same test
as a shell line on hosts where no Python is known yet.

Exit status of ``signal``: 0 sent, 1 nothing of that process group is left, 3 the pid is someone
else's now (nothing sent).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return "-"


def identity(pid: int) -> str | None:
    """``proc:<boot id>:<start ticks>`` or ``ps:<start time>``; None when there is no such process."""
    if os.path.isdir("/proc/self"):
        fields = _stat_fields(pid)
        return None if fields is None else f"proc:{_boot_id()}:{fields[19]}"
    try:
        out = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True,
                             timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"ps:{out}" if out else None


def _live_members(pgid: int) -> list[list[str]]:
    """The ``/proc/PID/stat`` fields (after the command) of every process of group ``pgid`` that is not
    a zombie."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields and fields[0] != "Z" and int(fields[2]) == pgid:
                out.append(fields)
    return out


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is alive (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's group, but alive
    if not os.path.isdir("/proc/self"):
        return True  # no /proc: the signal's answer is all there is
    return bool(_live_members(pgid))


def _members_since(pgid: int, ident: str) -> bool:
    """Whether a live process of group ``pgid`` started no earlier than the recorded leader, in the
    same boot (the leader, a shell, may be gone while its children finish their checkpoint)."""
    parts = ident.split(":")
    if len(parts) != 3 or parts[0] != "proc" or parts[1] != _boot_id() or not os.path.isdir("/proc/self"):
        return False
    since = int(parts[2])
    return any(int(fields[19]) >= since for fields in _live_members(pgid))


def owned(pgid: int, ident: str) -> bool | None:
    """True: the group is the recorded one and alive; False: nothing of it is left; None: the pid
    now belongs to someone else."""
    now = identity(pgid)
    if now is not None:
        if now != ident:
            return None
        fields = _stat_fields(pgid)
        return fields is None or fields[0] != "Z" or _members_since(pgid, ident)
    return True if _members_since(pgid, ident) else False


def send(pgid: int, ident: str, sig: str) -> int:
    state = owned(pgid, ident)
    if state is None:
        return 3
    if not state:
        return 1
    try:
        os.killpg(pgid, getattr(signal, f"SIG{sig}"))
    except ProcessLookupError:
        return 1
    return 0


def leader_gone(pgid: int) -> bool:
    """The process group's first process (the shell running torchrun) has exited while others of the
    group live on: on one node of several, the trainer's agent is gone and its workers are orphans."""
    try:
        with open(f"/proc/{pgid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                return False
    except (OSError, IndexError):
        pass
    return group_alive(pgid)


def kill_orphans(pgid: int, grace_s: float, say: Callable[[str], None]) -> None:
    """TERM, then KILL, what is left of the group (a live member keeps the group id from being reused)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not group_alive(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        say(f"sent {sig.name} to what is left of process group {pgid}")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.5)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "ident":
        print(identity(int(argv[1])) or "")
        return 0
    if len(argv) == 3 and argv[0] == "alive":
        state = owned(int(argv[1]), argv[2])
        return 0 if state else (3 if state is None else 1)
    if len(argv) == 4 and argv[0] == "signal":
        return send(int(argv[1]), argv[2], argv[3])
    print("usage: procid.py ident PID | alive PGID IDENT | signal PGID IDENT SIG", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
