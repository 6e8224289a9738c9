"""What the core tells the commands while it works: a step's line, or a notice with its level. The
commands render both; nothing in the core prints. A module of its own, below everything in gpucli/run,
so that a module reporting a notice never has to load the launch machinery to name its type."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Notice:
    level: Literal["info", "warn", "error"]
    text: str


StepFn = Callable[[str], None]
EventFn = StepFn
NoticeFn = Callable[[Notice], None]
