"""Which runs share a machine (``launch --on``, a dev box's jobs), read from the records alone, and how their
money is counted once: the machine bills from its rental to its end whatever runs on it, so the bill is the
record of the run that rented it (a box's, or the first run's); the runs on a box are that bill's shares,
each with its own cost for its own caps, and are not added to a total again."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpucli.runs.records import RunRecord


def machine_root(record: RunRecord) -> str:
    """The run that rented (or first used) the machine this run is on: itself when it is not on another's."""
    on = record.inputs.on
    return on.machine if on is not None else record.name


def is_box(record: RunRecord) -> bool:
    return record.inputs.box is not None


@dataclass(frozen=True)
class Machine:
    """A machine that more than one run has used."""

    root: str  # the run (or box) that rented it: its cost is the machine's
    runs: tuple[str, ...]  # every run on it, the root first
    box: bool


def shared(records: Iterable[RunRecord]) -> list[Machine]:
    """The machines more than one of ``records`` used, in the order of their roots."""
    by_root: dict[str, list[RunRecord]] = {}
    for r in records:
        by_root.setdefault(machine_root(r), []).append(r)
    out = []
    for root, group in by_root.items():
        if len(group) < 2:
            continue
        group.sort(key=lambda r: (r.name != root, r.created_at))
        out.append(Machine(root, tuple(r.name for r in group), any(is_box(r) for r in group if r.name == root)))
    return out


def counted_in_machine(record: RunRecord, boxes: set[str]) -> bool:
    """Whether this run's cost is already in its machine's bill (a run on a box, ``boxes`` the box names)."""
    root = machine_root(record)
    return root != record.name and root in boxes
