"""The kinds of job a run can be, behind one contract (:class:`base.Job`): the bundled trainer and the
user's own command. This is the one place that tells them apart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.run.jobs.base import Job
from gpucli.run.jobs.bundled import BUNDLED, BundledTrainer
from gpucli.run.jobs.own import OwnCode, from_record, resolve_own

if TYPE_CHECKING:
    from gpucli.run.harvest import FetchResult, MirrorResult
    from gpucli.run.records import RunRecord
    from gpucli.run.targets import Host
    from gpucli.run.task import Task

__all__ = ["BUNDLED", "BundledTrainer", "Job", "OwnCode", "fetch_best", "job_for", "job_of", "mirror_once"]


def job_for(task: Task | None) -> Job:
    """The job a launch asks for: the bundled trainer, or ``task`` (the user's own command) checked
    (a missing folder or a bad grace is said before any offer is searched)."""
    return BUNDLED if task is None else resolve_own(task)


def job_of(record: RunRecord) -> Job:
    """The job a run record was launched with."""
    own = (record.launch or {}).get("own")
    return from_record(own) if own else BUNDLED


def fetch_best(host: Host, record: RunRecord, dest: Path, *, with_optimizer: bool = False, progress: Any = None,
               on_event: Callable[[str], None] = lambda m: None) -> FetchResult:
    """``gpucli fetch-best``: the run's best checkpoint into ``dest``, as its job harvests it."""
    return job_of(record).fetch_best(host, record, dest, with_optimizer=with_optimizer, progress=progress,
                                     on_event=on_event)


def mirror_once(host: Host, record: RunRecord, *, keep: int = 2, progress: Any = None,
                on_event: Callable[[str], None] = lambda m: None) -> MirrorResult:
    """``gpucli mirror``: the run's metrics and newest checkpoint(s) into its mirror on this machine."""
    return job_of(record).mirror(host, record, keep=keep, progress=progress, on_event=on_event)
