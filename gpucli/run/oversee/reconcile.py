"""What reading runs found due, done in one explicit step that `status` and `ls` call after they read:
a run seen finished or failed is recorded so (and its rented cluster ended: no pod of it can), a cost
learnt is kept, a terminate the provider had not confirmed is tried again, and the clusters of runs
that are over are deleted. What the user sees is what the read saw; this step only keeps the records
and the bills in line with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpucli.errors import GpucliError
from gpucli.providers.api import TERMINATE_PENDING
from gpucli.providers.registry import get_target
from gpucli.run.oversee.observe import Due, Observed, observe, recorded_status
from gpucli.run.watch.monitor import RunStatus
from gpucli.runs import records as runs
from gpucli.runs.records import RunRecord


def _quiet(*_: object) -> None:
    return None


def apply(due: Due | None) -> None:
    """Do what one read found due."""
    if due is None:
        return
    if due.save is not None:
        runs.save(due.save)
    if due.end_rented:
        # lazy: a provider's cluster and overlay code (and its client) only once a rented cluster is due to end
        from gpucli.providers.rentend import end_rented

        end_rented(due.record, on_warn=_quiet)


def retry_pending_terminate(record: RunRecord) -> RunRecord:
    """A run whose pod's terminate was not confirmed: try it again; saved as stopped once the provider
    says the pod is gone, else returned unchanged (its status keeps saying "terminate pending")."""
    if record.status != TERMINATE_PENDING:
        return record
    try:
        get_target(record.provider).terminate(record)
    except GpucliError as exc:
        saved = record.with_(message=str(exc)[:500])
    else:
        saved = record.with_(status="stopped", message=None)
    runs.save(saved)
    return saved


def pending_terminates(records: Iterable[RunRecord]) -> list[RunRecord]:
    """Every run whose terminate is unconfirmed tried again (before it is read, so what is shown is what
    the provider now says); the others as they are."""
    return [retry_pending_terminate(r) for r in records]


def status(record: RunRecord) -> RunStatus:
    """`gpucli status`: the pending terminate retried, the run read, what the read found due done."""
    seen: Observed = observe(pending_terminates([record])[0])
    apply(seen.due)
    return seen.status


def statuses(*, check_all: bool, on_bad: Callable[[str], None] | None = None
             ) -> list[tuple[RunRecord, RunStatus]]:
    """`gpucli ls`: every run with its status, live for active runs (every run with ``check_all``); a
    record that cannot be read is skipped and named to ``on_bad``. Then what the reads found due, and
    the rented clusters of runs that are over (no pod can end them)."""
    rows = []
    for record in pending_terminates(runs.list_runs(on_bad)):
        if record.active or check_all:
            seen = observe(record)
            apply(seen.due)
            rows.append((record, seen.status))
        else:
            rows.append((record, recorded_status(record)))
    ended = runs.list_runs()
    if any(r.inputs.cluster_id for r in ended):  # clusterend.cluster_of, without its client
        # lazy: RunPod's cluster client only where some run here had a cluster
        from gpucli.providers.clusterend import end_clusters_of_ended

        end_clusters_of_ended(ended)
    return rows
