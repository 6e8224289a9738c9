"""The kinds of job a run can be, behind one contract (:class:`base.Job`): the bundled trainer and the
user's own command. This is the one place that tells them apart."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from gpucli.run.starting import start
from gpucli.run.starting.jobs.base import Job
from gpucli.run.starting.jobs.bundled import BUNDLED, BundledTrainer
from gpucli.run.starting.jobs.own import OwnCode, from_record, resolve_own

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.run.files.harvest import FetchResult, MirrorResult
    from gpucli.run.inputs.launch import ResolvedLaunch
    from gpucli.runs.records import RunRecord
    from gpucli.runs.task import Task

__all__ = ["BUNDLED", "BundledTrainer", "Job", "OwnCode", "fetch_best", "job_for", "job_of", "mirror_once", "start_on"]


def job_for(task: Task | None) -> Job:
    """The job a launch asks for: the bundled trainer, or ``task`` (the user's own command) checked
    (a missing folder or a bad grace is said before any offer is searched)."""
    return BUNDLED if task is None else resolve_own(task)


def job_of(record: RunRecord) -> Job:
    """The job a run record was launched with."""
    own = record.inputs.own
    return from_record(own) if own is not None else BUNDLED


def fetch_best(host: Host, record: RunRecord, dest: Path, *, with_optimizer: bool = False, progress: Any = None,
               on_event: Callable[[str], None] = lambda m: None) -> FetchResult:
    """``gpucli fetch-best``: the run's best checkpoint into ``dest``, as its job harvests it."""
    return job_of(record).fetch_best(host, record, dest, with_optimizer=with_optimizer, progress=progress,
                                     on_event=on_event)


def mirror_once(host: Host, record: RunRecord, *, keep: int = 2, progress: Any = None,
                on_event: Callable[[str], None] = lambda m: None) -> MirrorResult:
    """``gpucli mirror``: the run's metrics and newest checkpoint(s) into its mirror on this machine."""
    return job_of(record).mirror(host, record, keep=keep, progress=progress, on_event=on_event)


def start_on(host: Host, job: Job, resolved: ResolvedLaunch, record: RunRecord, *,
             on_event: Callable[[str], None], save: Callable[[RunRecord], Any], restore: Path | None = None,
             metrics: Path | None = None, node_env: Mapping[str, str] | None = None,
             watch_args: tuple[str, ...] = ()) -> RunRecord:
    """Start ``job`` on ``host``: the watchdog first, from the first moment the host runs commands (a
    launch killed at any later stage, even by SIGKILL, leaves nothing billing past its cap or its
    silence), then the job, handed to it; a start that fails tells the watchdog so. ``node_env`` and
    ``watch_args``: one node's variables and peer watch in a run over several machines."""
    record = start.watch_from_now(host, resolved, record, save=save, on_event=on_event, watch_args=watch_args)
    try:
        beat = start.heartbeat(host, resolved.workdir)
        return job.start(cast("Host", start.Beating(host, beat)), resolved, record,
                         on_event=start.touching(host, resolved.workdir, on_event, beat),
                         save=save, restore=restore, metrics=metrics, node_env=node_env)
    except BaseException:
        start.abandon(host, resolved.workdir)
        raise
