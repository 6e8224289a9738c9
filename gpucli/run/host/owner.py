"""Who owns a pod while it is being launched, and what ends a launch.

A launch owns the pod it created until it hands it to the pod-side watchdog (the run's status becomes
``running``) or ends it. While it owns it, its record names the launching process by pid and start
time (:func:`this_launcher`): once that process is gone, whatever ended it (a SIGKILL, a power cut),
nothing will hand the pod over any more, and :func:`orphaned` says so to ``ls`` and ``down --strays``.

Every signal that ends a launch runs the same cleanup as Ctrl-C: :func:`signals_interrupt` turns
SIGTERM and SIGHUP (a closed terminal, ``timeout``) into :class:`Terminated`, a KeyboardInterrupt, so
the ``except BaseException`` paths that end a failed launch's pods run for them too. A repeat of the
signal during that cleanup is ignored (the cleanup has its own deadlines); SIGKILL cannot be caught,
which is what the orphan check and the early watchdog are for.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING

from gpucli.errors import GpucliError
from gpucli.run.host.procs import PROCID

if TYPE_CHECKING:
    from gpucli.runs.records import RunRecord

#: The record states in which the launch (not yet the watchdog) owns the pod.
LAUNCHING = ("provisioning", "starting")


class Terminated(KeyboardInterrupt):
    """The launch was ended by a signal other than Ctrl-C; cleaned up as Ctrl-C is."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _procid() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpucli_procid_local", PROCID)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def this_launcher() -> str:
    """``<pid>:<identity>`` of this process (gpucli/pod/procid.py's identity: boot id and start time)."""
    pid = os.getpid()
    return f"{pid}:{_procid().identity(pid) or '-'}"


def launcher_alive(launcher: str) -> bool:
    """Whether the process ``launcher`` names is still that process."""
    pid_text, _, ident = launcher.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except OverflowError:
        return False
    if ident in ("", "-"):
        return True  # no identity was taken: the pid is all there is
    return _procid().identity(pid) == ident


def orphaned(record: RunRecord) -> bool:
    """A launch that still owns its pod, by a process that no longer exists: nothing will hand the pod
    to a watchdog or end it, so it is a stray."""
    launcher = getattr(record, "launcher", None)
    return record.status in LAUNCHING and bool(launcher) and not launcher_alive(str(launcher))


@contextlib.contextmanager
def signals_interrupt() -> Iterator[list[int]]:
    """While inside: SIGTERM and SIGHUP raise :class:`Terminated` in the main thread, once; later ones
    are ignored while the cleanup runs. Outside the main thread nothing changes. Yields the list the
    signal that ended the command is put in (Typer turns the interrupt into a plain exit code 130)."""
    seen: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        if seen:
            return
        seen.append(signum)
        raise Terminated(signum)

    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, handler)
    except (ValueError, AttributeError):  # not the main thread, or no SIGHUP here
        for sig, old in previous.items():
            signal.signal(sig, old)
        previous = {}
    try:
        yield seen
    finally:
        for sig, old in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, old)


def marker_path(workdir: str) -> str:
    """The file the launch touches at each step on the host: the early watchdog's sign of a live launch."""
    return f"{workdir.rstrip('/')}/.launching"


def handover_path(workdir: str) -> str:
    """Where the launch writes ``PGID IDENT`` of the started trainer for the watchdog to adopt."""
    return f"{workdir.rstrip('/')}/.trainer"


__all__ = ["LAUNCHING", "Terminated", "handover_path", "launcher_alive", "marker_path", "orphaned",
           "signals_interrupt", "this_launcher"]


def ended_elsewhere(record: RunRecord, load: Callable[[str], RunRecord]) -> bool:
    """Whether another command (``gpucli down``) ended the run this launch is starting: its saved
    record (``load``) no longer says the launch's own state."""
    try:
        saved = load(record.name)
    except GpucliError:
        return False
    return saved.status not in LAUNCHING and saved.created_at == record.created_at
