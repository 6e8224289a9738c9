"""Weights & Biases or trackio beside metrics.jsonl, when the config asks (``tracking.backend``).

Off by default, and never a reason for a run to fail: the package missing, a failed ``init`` or
failing ``log`` calls print one line and the tracker is dropped (metrics.jsonl stays the record).
The run's name and its whole config are attached; every train and validation row is logged at its
step, numbers only. Both libraries share wandb's API (``init(project, name, config)``, ``log(dict,
step)``, ``finish()``); trackio keeps its log locally (``TRACKIO_DIR``, default under
``~/.cache/huggingface/trackio``) unless ``tracking.space_id`` names a Space.
"""

from __future__ import annotations

import importlib
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_FAILURES = 3  # consecutive failed log calls before the tracker is dropped


class Tracker:
    """One open run of ``backend``; :meth:`log` and :meth:`finish` never raise."""

    def __init__(self, backend: str, module: Any, run: Any, say: Callable[[str], None]) -> None:
        self.backend, self._mod, self._run, self._say = backend, module, run, say
        self._failures = 0
        self.rows = 0

    @property
    def alive(self) -> bool:
        return self._mod is not None

    def log(self, row: dict[str, Any]) -> None:
        if self._mod is None or not isinstance(row.get("step"), int):
            return
        kind = row.get("kind")
        values = {(k if "/" in k else f"{kind}/{k}"): v for k, v in row.items()
                  if k not in ("step", "time", "kind") and isinstance(v, (int, float)) and not isinstance(v, bool)
                  and math.isfinite(v)}
        if not values:
            return
        try:
            target = self._run if self._run is not None and hasattr(self._run, "log") else self._mod
            target.log(values, step=row["step"])
            self._failures = 0
            self.rows += 1
        except Exception as exc:  # noqa: BLE001 - a tracker never ends a run
            self._failures += 1
            if self._failures >= MAX_FAILURES:
                self._say(f"{self.backend}: {MAX_FAILURES} log calls failed ({type(exc).__name__}: {exc}); "
                          "no more rows go to it (metrics.jsonl has them all)")
                self._mod = None

    def finish(self) -> None:
        mod, self._mod = self._mod, None
        if mod is None:
            return
        try:
            target = self._run if self._run is not None and hasattr(self._run, "finish") else mod
            target.finish()
        except Exception as exc:  # noqa: BLE001
            self._say(f"{self.backend}: finish failed: {type(exc).__name__}: {exc}")


def run_name_for(tracking: Any, out_dir: Path) -> str:
    """``tracking.run_name``, else the gpucli run's (the folder the trainer's out_dir is)."""
    return tracking.run_name or os.environ.get("GPUCLI_RUN") or Path(out_dir).resolve().name


def open_tracker(cfg: Any, master: bool, out_dir: Path, say: Callable[[str], None]) -> Tracker | None:
    """The tracker ``cfg.tracking`` asks for, on the master rank only; None when off or unavailable."""
    tracking = cfg.tracking
    backend = tracking.backend
    if backend == "none" or not master:
        return None

    try:
        module = importlib.import_module(backend)
    except ImportError as exc:
        say(f"tracking.backend={backend} but the {backend} package is not installed on this machine "
            f"({exc}); install gpucli[{backend}] there. Training goes on without it.")
        return None
    name = run_name_for(tracking, out_dir)
    config = cfg.to_dict()
    config.get("notifications", {}).get("telegram", {}).pop("bot_token", None)  # never a secret in a tracker
    try:
        if backend == "wandb":
            run = module.init(project=tracking.project, name=name, config=config, dir=str(out_dir),
                              resume="allow", id=_safe_id(name))
        else:
            kwargs: dict[str, Any] = {"project": tracking.project, "name": name, "config": config}
            if tracking.space_id:
                kwargs["space_id"] = tracking.space_id
            run = module.init(**kwargs)
    except Exception as exc:  # noqa: BLE001 - a login problem or no network: say so, train anyway
        say(f"{backend}: init failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
            "training goes on without it")
        return None
    say(f"{backend}: logging to project {tracking.project!r} as run {name!r}")
    return Tracker(backend, module, run, say)


def _safe_id(name: str) -> str:
    """A wandb run id from the run's name (a resumed run continues the same wandb run)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", name)[:64] or "run"
