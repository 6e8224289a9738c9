"""A run's limits, one name each from the CLI flag to the run record, run.yaml and the pod's watchdog.

    CLI flag          record / Limits        run.yaml              watchdog flag
    --steps           max_steps              training.max_steps    -
    --hours           max_hours              limits.max_hours      --max-hours
    --budget          budget_usd             limits.budget_usd     --budget-usd
    --price           price_per_hour_usd     limits.price_per_hour_usd  --price-per-hour-usd
    --stall-minutes   stall_minutes          -                     --stall-minutes
    --idle-stop       idle_stop_minutes      -                     --idle-stop-minutes (0: off)
    --slow-below      slow_below             -                     --slow-below (0: off)
    --replace-slow    replace_slow           -                     --replace-slow

The price is that of the whole machine (all its GPUs), in dollars per hour.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from gpucli.errors import UsageError

# What a remaining limit never drops below: run.yaml refuses zero and negative limits, and a limit
# that is used up still has to reach the trainer so that it stops at once.
_SPENT = 1e-6
#: The limits whose 0 means off (the rest are positive or absent).
ZERO_OFF = ("idle_stop_minutes", "slow_below")


@dataclass(frozen=True)
class Limits:
    max_steps: int | None = None
    max_hours: float | None = None
    budget_usd: float | None = None
    price_per_hour_usd: float | None = None  # the whole machine
    stall_minutes: float | None = None  # the watchdog ends a run with no new metrics row for this long
    idle_stop_minutes: float | None = None  # ... or whose GPUs all idle this long (gpucli/pod/gpuidle.py; 0: off)
    slow_below: float | None = None  # slow: measured tokens/s under this share of the plan's (0: off)
    replace_slow: bool = False  # a slow run is checkpointed and its machine ended, for a watcher to replace

    def checked(self) -> Limits:
        """These limits, or a UsageError naming the flag of the first one that is not a positive
        finite number (NaN and infinity included)."""
        for flag, value in (("--steps", self.max_steps), ("--hours", self.max_hours),
                            ("--budget", self.budget_usd), ("--price", self.price_per_hour_usd),
                            ("--stall-minutes", self.stall_minutes)):
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise UsageError(f"{flag} must be a positive number, got {value}")
        idle, slow = self.idle_stop_minutes, self.slow_below
        if idle is not None and not (isinstance(idle, (int, float)) and math.isfinite(idle) and idle >= 0):
            raise UsageError(f"--idle-stop must be a time such as 30m or 0 (off), got {idle}")
        if slow is not None and not (isinstance(slow, (int, float)) and 0 <= slow < 1):
            raise UsageError(f"--slow-below must be a share of the plan's speed from 0 (off) to under 1, got {slow}")
        return self

    def with_(self, **changes: Any) -> Limits:
        return dataclasses.replace(self, **changes)

    def remaining(self, spent_hours: float) -> Limits:
        """The limits left after ``spent_hours`` of billed time (provisioning and setup, or the run
        before a resume): the hour cap less the time, the budget less what that time cost."""
        spent_hours = max(0.0, spent_hours)
        hours = None if self.max_hours is None else max(_SPENT, self.max_hours - spent_hours)
        budget = self.budget_usd
        if budget is not None and self.price_per_hour_usd:
            budget = max(_SPENT, budget - spent_hours * self.price_per_hour_usd)
        return self.with_(max_hours=hours, budget_usd=budget)

    def run_yaml(self) -> dict[str, float | None]:
        """The trainer's ``limits:`` section (max_steps lives under ``training:``)."""
        return {"max_hours": self.max_hours, "budget_usd": self.budget_usd,
                "price_per_hour_usd": self.price_per_hour_usd}

    def watchdog_args(self) -> list[str]:
        """The pod-side watchdog's flags for these limits (gpucli/pod/watchdog.py)."""
        args = []
        if self.stall_minutes is not None:
            args += ["--stall-minutes", f"{self.stall_minutes:g}"]
        if self.max_hours is not None:
            args += ["--max-hours", f"{self.max_hours:g}"]
        if self.budget_usd is not None and self.price_per_hour_usd:
            args += ["--budget-usd", f"{self.budget_usd:g}", "--price-per-hour-usd", f"{self.price_per_hour_usd:g}"]
        if self.idle_stop_minutes:
            args += ["--idle-stop-minutes", f"{self.idle_stop_minutes:g}"]
        if self.slow_below:
            args += ["--slow-below", f"{self.slow_below:g}"] + (["--replace-slow"] if self.replace_slow else [])
        return args

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Limits:
        """From a run record's ``limits`` (records before price and stall moved here lack them)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (data or {}).items() if k in known})


def parse_idle_stop(text: str | None) -> float | None:
    """``--idle-stop``: ``30m``, ``1h``, ``900s``, a bare number of minutes, or ``0``/``off`` (0: no idle
    stop); None when not given (the default then applies)."""
    if text is None:
        return None
    s = str(text).strip().lower()
    if s in ("off", "no", "none", "0"):
        return 0.0
    factor = {"s": 1 / 60, "m": 1.0, "h": 60.0}.get(s[-1:], None)
    try:
        value = float(s[:-1] if factor else s) * (factor or 1.0)
    except ValueError:
        raise UsageError(f"--idle-stop must be a time such as 30m, 1h or off, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"--idle-stop must be a time such as 30m, 1h or off, got {text!r}")
    return value
