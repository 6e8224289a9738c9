"""How the pod-side watchdog says a run's end: the cap that ended it, a time span, the reason it leaves
for the job's runner (``stop_reason``) and the trainer's own finish reason. Standard library only;
``watchdog.py`` loads it by path from beside it.
"""

from __future__ import annotations

import json
from pathlib import Path


def cap_words(max_hours: float | None, budget_usd: float | None, price: float | None) -> str:
    """The cap that ends the run first, as it was given: ``max_hours 0.01 h`` or ``budget $5 at $2/h``
    ("no cap" when there is none: never an error, this runs before the watch loop)."""
    budget_h = budget_usd / price if budget_usd is not None and price else None
    if budget_h is not None and (max_hours is None or budget_h < max_hours):
        return f"budget ${budget_usd:g} at ${price:g}/h"
    return f"max_hours {max_hours:g} h" if max_hours is not None else "no cap"


def elapsed_words(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def say_stop(run_dir: Path, reason: str) -> None:
    """Who stops the job and why, for its runner's end story (``jobrun.py`` reads it on SIGTERM)."""
    try:
        (run_dir / "stop_reason").write_text(reason + "\n")
    except OSError:
        pass


def finished_reason(run_dir: Path) -> str | None:
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return status.get("reason") if status.get("state") == "finished" else None
