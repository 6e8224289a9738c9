"""Idle GPUs while the job runs: the pod-side watchdog's idle stop (``--idle-stop-minutes``). Standard
library only; loaded by path by ``watchdog.py`` from beside it.

Each watchdog poll asks ``nvidia-smi`` for every GPU's utilisation (the same query tool the GPU sampler,
``gpustats.py``, calls; the first one on ``PATH``). When every GPU has stayed at or under
:data:`BUSY_PCT` % for the whole window while the trainer (or your own command) is alive, the watchdog
ends the run as it ends a stalled one: SIGTERM (the trainer writes its checkpoint), a deadline, SIGKILL,
then the pod's end action. It is dstack's utilisation policy, held on the pod, so it works with the
laptop shut.

- The threshold is 5 %: ``utilization.gpu`` is the share of the last sample period in which a kernel
  ran; a training step keeps it far above that, while a process that only holds memory (a hung
  collective waiting on nothing, a loader stuck on a lock) reads 0-2 %. A data step that is making
  progress (rows in ``prepare.jsonl``) resets the window: downloading and tokenising is not idleness.
- Before the job's first metrics row the window waits ``--startup-minutes`` as the stall check does
  (installing, compiling, loading a model leave the GPUs idle for a while).
- A sample that fails, or where a GPU reports no utilisation (``[N/A]`` under MIG), resets the window:
  nothing is ended on a reading gpucli cannot make.
- A host with no ``nvidia-smi`` (a CPU-only local or ssh machine) has nothing to watch: the watch says
  so once in ``watchdog.log`` and does nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

#: At or under this utilisation (%) a GPU counts as idle; see the module's docstring for why 5.
BUSY_PCT = 5.0
QUERY = ("--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits")


def utilisations(exe: str, timeout_s: float = 20.0) -> list[float | None] | None:
    """Every GPU's utilisation (%; None for a GPU that reports none), or None when the query failed."""
    try:
        res = subprocess.run([exe, *QUERY], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    found: list[float | None] = []
    for line in res.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        try:
            found.append(float(parts[1].split()[0]))
        except (ValueError, IndexError):
            found.append(None)
    return found or None


def minutes_words(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class IdleWatch:
    """The idle window of one run: :meth:`check` once a poll; a verdict once every GPU has been idle for
    ``window_s``."""

    def __init__(self, run_dir: Path, window_s: float, log: Callable[[str], None], *,
                 exe: str = "nvidia-smi", busy_pct: float = BUSY_PCT, startup_s: float = 0.0) -> None:
        self.run_dir, self.window_s, self.log, self.busy_pct = run_dir, window_s, log, busy_pct
        self.startup_until = time.time() + startup_s  # before the first metrics row: compile, setup
        self.exe = shutil.which(exe)
        self.since: float | None = None  # when every GPU went idle (None: not idle now)
        self.peak = 0.0  # the highest utilisation seen in the idle stretch, for the verdict's words
        self.prepared = self._prepare_mtime()
        if self.exe is None:
            log(f"idle stop: no {exe} on this host, so no GPU to watch (the run is not stopped for idleness)")
        else:
            log(f"idle stop: every GPU at or under {busy_pct:g} % for {minutes_words(window_s)} ends the run")

    def _prepare_mtime(self) -> float:
        try:
            return (self.run_dir / "prepare.jsonl").stat().st_mtime
        except OSError:
            return 0.0

    def check(self, now: float | None = None) -> str | None:
        """None while the GPUs work (or cannot be read); the end's words once idle for the window."""
        if self.exe is None:
            return None
        now = time.time() if now is None else now
        utils = utilisations(self.exe)
        prepared = self._prepare_mtime()
        starting = now < self.startup_until and not (self.run_dir / "metrics.jsonl").exists()
        if starting or utils is None or any(u is None or u > self.busy_pct for u in utils) or prepared > self.prepared:
            self.prepared = prepared
            if self.since is not None:
                self.log("idle stop: the GPUs are at work again")
            self.since, self.peak = None, 0.0
            return None
        self.peak = max([self.peak, *(u for u in utils if u is not None)])
        if self.since is None:
            self.since = now
            self.log(f"idle stop: every GPU at or under {self.busy_pct:g} % ({len(utils)} GPUs); "
                     f"the run ends if they stay so for {minutes_words(self.window_s)}")
        if now - self.since < self.window_s:
            return None
        return f"idle: GPUs at {self.peak:.0f} % for {minutes_words(now - self.since)}"

    def next_check(self) -> float | None:
        """When the window would close (for the watchdog's sleep), or None."""
        return None if self.since is None else self.since + self.window_s
