import os
import signal
from pathlib import Path

import pytest

from gpucli import catalog, render, runs


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    catalog.clear_cache()
    render.reset_consoles()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the trainer subprocesses share two cores with the suite
    monkeypatch.setenv("GPUCLI_PROVIDER_POLL_S", "0.05")  # the emulators' pods start in a few polls
    yield
    render.reset_consoles()
    _kill_orphaned_trainers()


def _kill_orphaned_trainers() -> None:
    """An emulator pod is an sshd on this machine: terminating or preempting it stops the sshd but not
    a trainer it started detached (a real pod takes its processes with it). End those trainers, by
    the pid their run records name, and only when that pid really is a trainer."""
    for record in runs.list_runs():
        if not record.pid:
            continue
        try:
            cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        members = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(p) == record.pid]
        if b"trainer.train" in cmdline or any(b"trainer.train" in _cmdline(p) for p in members):
            try:
                os.killpg(record.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _pgid(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""
