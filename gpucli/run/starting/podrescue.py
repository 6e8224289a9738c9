"""Before a resume ends a run's old pod, its newest checkpoint is copied home and verified.

A pod stopped by its cap or a stall keeps its disk (RunPod's volume disk, vast's instance storage) and
on it checkpoints newer than the last mirror. ``gpucli resume`` used to terminate the old pod first and
restore from the mirror alone, destroying them. Now: a pod the provider says is gone has nothing to
copy; a pod that answers over SSH has its newest checkpoint mirrored (every file sha256-checked, the
job's own mirror) before anything ends it; a pod that exists but cannot be reached is never ended here:
the resume stops in one line saying how to copy from it or to end it deliberately.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpucli.errors import GpucliError, ProviderError, UsageError
from gpucli.providers.registry import get_target, open_host

if TYPE_CHECKING:
    from gpucli.run.starting.jobs.base import Job
    from gpucli.runs.records import RunRecord


def take_newest_from_old_pod(record: RunRecord, job: Job, *, on_step: Callable[[str], None]) -> None:
    """Copy the old pod's newest checkpoint into the run's mirror, verified, when the pod still exists;
    raise (and end nothing) when it exists and cannot be read."""
    if not record.instance_id:
        return
    target = get_target(record.provider)
    try:
        state = target.pod_state(record)
    except GpucliError as exc:
        raise ProviderError(f"cannot tell whether the old pod {record.instance_id} of {record.name} still holds "
                            f"checkpoints ({exc}); it is not ended", hint="try the resume again") from None
    if state is None or state.state == "gone":
        return
    try:
        host = open_host(record, connect_timeout_s=15)
    except GpucliError:
        raise UsageError(f"the old pod {record.instance_id} of {record.name} still exists ({state.state}) and may "
                         "hold checkpoints newer than this machine's mirror; gpucli ends it only after copying "
                         "them",
                         hint=f"start it in the {record.provider} console and run `gpucli mirror {record.name}`, "
                              f"then resume; or end it with `gpucli down {record.name}` to resume from the "
                              "mirror") from None
    with host:
        result = job.mirror(host, record, on_event=on_step)
    if result.step is not None:
        on_step(f"the old pod's newest checkpoint (step {result.step}) is in the mirror, verified; ending the "
                "old pod")
