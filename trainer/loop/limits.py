"""The run's clock against its hour and dollar caps (``limits.max_hours``, ``limits.budget_usd`` at
``limits.price_per_hour_usd``), with a reserve so the run ends *at* a cap, not one checkpoint past it.

The reserve is what the run may still spend after it decides to go on: the next step, which may end on
a validation, checkpoint and sampling interval, or the run's end (a last validation and the final
checkpoint), then shutdown. Each part is measured as it happens; validation and sampling run every few
hundred steps and their first run includes compilation, so they count at the most they have taken.
"""

from __future__ import annotations

import time
from collections import deque

from trainer.spec.config import LimitsConfig

SHUTDOWN_S = 5.0
SLOW_DISK_BYTES_PER_S = 100e6
"""For the first checkpoint's guess: a slow network disk with hashing (the H100 pod wrote 15.7 GB in 21 s)."""
"""Closing files, the process group and the alert queue after the final checkpoint."""


RECENT_STEPS = 16
"""Steps whose slowest counts: on a shared or throttled machine one step can take many times the last
(a busy 2-core host measured 0.05 s and 3 s back to back), and a cap missed by one slow step is a cap
the watchdog enforces with a signal instead of the run ending cleanly at it."""


class Timings:
    """Seconds of the slowest of the recent steps, and the most any checkpoint, validation or sampling
    took."""

    def __init__(self, *, checkpoint_guess_s: float = 0.0, val_batches: int = 0) -> None:
        self.recent_steps: deque[float] = deque(maxlen=RECENT_STEPS)
        # Until the first checkpoint and validation are measured, the reserve uses a guess (the first
        # decision to go on comes before either has happened): a checkpoint at the model's bytes over a
        # slow disk, a validation at its batches times a step. Measured values replace the guesses.
        self.checkpoint_guess_s = checkpoint_guess_s
        self.val_batches = val_batches
        self.checkpoint_s = 0.0
        self.measured_validation_s: float | None = None
        self.sampling_s = 0.0

    @property
    def validation_s(self) -> float:
        if self.measured_validation_s is not None:
            return self.measured_validation_s
        return self.val_batches * self.step_s

    @property
    def step_s(self) -> float:
        return max(self.recent_steps, default=0.0)

    def step(self, seconds: float) -> None:
        self.recent_steps.append(seconds)

    def checkpoint(self, seconds: float) -> None:
        self.checkpoint_s = max(self.checkpoint_s, seconds)

    def validation(self, seconds: float) -> None:
        self.measured_validation_s = max(self.measured_validation_s or 0.0, seconds)

    def sampling(self, seconds: float) -> None:
        self.sampling_s = max(self.sampling_s, seconds)

    def reserve_s(self) -> float:
        # The checkpoint counts twice: the one the next step may write on its interval and the final
        # one, whose time varies with the disk and page cache more than a step's does.
        checkpoint_s = self.checkpoint_s or self.checkpoint_guess_s
        return self.step_s + self.validation_s + self.sampling_s + 2.0 * checkpoint_s + SHUTDOWN_S


class RunClock:
    """Elapsed seconds and dollars across resumes (``elapsed_before`` comes from the checkpoint)."""

    def __init__(self, limits: LimitsConfig, started_at: float | None = None, *, checkpoint_bytes: int = 0,
                 val_batches: int = 0) -> None:
        self.limits = limits
        self.started_at = started_at  # epoch s this process's work began; None: at start()
        self.t0 = started_at if started_at is not None else time.time()
        self.elapsed_before = 0.0
        self.timings = Timings(checkpoint_guess_s=1.0 + checkpoint_bytes / SLOW_DISK_BYTES_PER_S,
                               val_batches=val_batches)

    def start(self) -> None:
        """This process's share of elapsed() (so of the caps and cost_usd) includes its own startup."""
        self.t0 = self.started_at or time.time()

    def elapsed(self) -> float:
        return self.elapsed_before + (time.time() - self.t0)

    def cost(self) -> float | None:
        price = self.limits.price_per_hour_usd
        return None if price is None else self.elapsed() / 3600 * price

    def caps_ahead(self) -> tuple[bool, bool]:
        """(hours cap, dollar cap) reached once the reserve is counted in."""
        lim = self.limits
        ahead = self.elapsed() + self.timings.reserve_s()
        price = lim.price_per_hour_usd
        over_hours = lim.max_hours is not None and ahead >= lim.max_hours * 3600
        over_budget = lim.budget_usd is not None and price is not None and ahead / 3600 * price >= lim.budget_usd
        return over_hours, over_budget
