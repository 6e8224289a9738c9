"""A run's own end, read on this side: whether the trainer finished by itself, before any provider
state is asked what happened to the pod.

A pod that is gone or stopped says little: RunPod reports EXITED for a spot pod taken back *and* for
a pod its own watchdog stopped after the run finished, and a vast.ai instance stopped by the pod's
key looks like an outbid one. Reading that as preemption made ``--recover`` rent a new pod for a run
that was over. So the run's own end record decides first: the record itself, then the mirrored
``status.json`` and ``metrics.jsonl`` (the trainer's ``finished`` event, unless a later ``resumed``
or ``started`` row says a new pod took over). A finish by ``signal`` is not counted: a provider
stopping the container sends SIGTERM too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gpucli.run.files.harvest import mirror_root
from gpucli.run.watch.monitor import SMALL_FILE_BYTES, RunStatus, end_state
from gpucli.runs import records as runs
from gpucli.runs.endedby import ended_by_in
from gpucli.runs.records import RunRecord
from trainer.spec.metricsrow import parse_line

#: Finish reasons that are not the trainer's own decision.
NOT_OWN = ("signal",)


def _mirrored_end(root: Path) -> dict[str, Any] | None:
    """The last ``finished`` event of the mirrored metrics (None when a later row restarted the run),
    else a mirrored status.json that says finished."""
    rows = []
    try:
        for line in (root / "metrics.jsonl").read_text(errors="replace").splitlines():
            row = parse_line(line)
            if row is not None and row.event in ("finished", "resumed", "started"):
                rows.append(row)
    except OSError:
        pass
    if rows:
        return rows[-1].to_json() if rows[-1].event == "finished" else None
    try:
        status = json.loads((root / "status.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return status if isinstance(status, dict) and status.get("state") == "finished" else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def own_end_record(record: RunRecord) -> RunRecord | None:
    """The record as the run's own end says it now is (finished, or stopped when its cap ended it, with
    its reason, step, loss and cost), or None when nothing on this side says it ended by itself. Reads
    only; never asks a provider."""
    by_cap = record.status == "stopped" and end_state(record.end_reason or "") == "stopped"
    if (record.status == "finished" or by_cap) and record.end_reason not in NOT_OWN:
        return record
    root = mirror_root(record.name)
    end = _mirrored_end(root)
    if end is None or end.get("reason") in NOT_OWN or not isinstance(end.get("reason"), str):
        return None
    step = end.get("step") if isinstance(end.get("step"), int) else record.step
    loss = _number(end.get("train_loss"))
    cost = _number(end.get("cost_usd"))
    return record.with_(status=end_state(end["reason"]), ended_at=record.ended_at or runs.now_iso(),
                        end_reason=end["reason"], step=step, loss=loss if loss is not None else record.loss,
                        cost_usd=cost if cost is not None else record.cost_usd,
                        ended_by=mirrored_ended_by(root) or record.ended_by)


def mirrored_ended_by(root: Path) -> str | None:
    """The path that ended the pod, from the mirrored ``watchdog.json`` (gpucli/runs/endedby.py)."""
    try:
        return ended_by_in((root / "watchdog.json").read_bytes()[:SMALL_FILE_BYTES])
    except OSError:
        return None


def status_of_own_end(record: RunRecord) -> RunStatus:
    """``finished (<reason>)`` (or stopped, by a cap) from a record :func:`own_end_record` gave."""
    return RunStatus(state=record.status, finished_reason=record.end_reason, step=record.step, loss=record.loss,
                     cost_usd=record.cost_usd, usd_per_hour=record.price_per_hour_usd,
                     max_steps=record.limits.max_steps, ended_by=record.ended_by)


def own_end(record: RunRecord) -> RunStatus | None:
    """``finished (<reason>)`` when the run's own end record says it ended by itself (the record is
    then saved as finished, or stopped when its cap ended it); None when nothing on this side says so.
    Never asks a provider."""
    saved = own_end_record(record)
    if saved is None:
        return None
    if saved is not record:
        runs.save(saved)
    return status_of_own_end(saved)
