"""The trainer's command line, logging and start time: what ``trainer.train.main`` does before it
builds the run."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from trainer.spec.config import JOB_STARTED_ENV, ConfigError


def parse_argv(argv: list[str], usage: str) -> tuple[str | None, list[str]]:
    """(``--config`` path, ``--section.key=value`` overrides); ``--resume X`` is ``--training.resume=X``."""
    config_path: str | None = None
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(usage)
            raise SystemExit(0)
        if a == "--config" or a == "--resume":
            if i + 1 >= len(argv):
                raise ConfigError(f"{a} needs a value")
            val = argv[i + 1]
            i += 2
        elif a.startswith("--config=") or a.startswith("--resume="):
            a, _, val = a.partition("=")
            i += 1
        elif a.startswith("--"):
            overrides.append(a)
            i += 1
            continue
        else:
            raise ConfigError(f"unexpected argument '{a}' (use --config FILE and --section.key=value)")
        if a == "--config":
            config_path = val
        else:
            overrides.append(f"--training.resume={val}")
    return config_path, overrides


def process_started_at() -> float | None:
    """When this process started (epoch s), from /proc; None where there is no /proc."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def work_started_at() -> float | None:
    """When this run's work on the machine began: the pod command's start when the launch recorded
    it (``GPUCLI_JOB_STARTED_AT``, set before the data is fetched and prepared, so preparation counts
    against the hour and dollar caps), else this process's start. A value in the future or days old
    is not this job's and is ignored."""
    proc = process_started_at()
    try:
        job = float(os.environ.get(JOB_STARTED_ENV, ""))
    except ValueError:
        return proc
    now = time.time()
    if not (now - 7 * 86400 < job <= now + 1):
        return proc
    return job if proc is None else min(job, proc)


def setup_logging(out_dir: Path, master: bool) -> None:
    """Rank 0 logs at INFO to stderr and train.log; the other ranks log warnings and errors."""
    fmt = logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S")
    root = logging.getLogger("trainer")
    root.handlers.clear()
    root.propagate = False
    root.setLevel(logging.INFO if master else logging.WARNING)
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(fmt)
    root.addHandler(h)
    if master:
        fh = logging.FileHandler(out_dir / "train.log")
        fh.setFormatter(fmt)
        root.addHandler(fh)
