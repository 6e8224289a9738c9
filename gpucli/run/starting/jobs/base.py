"""The one contract every kind of job implements: the bundled trainer (:mod:`.bundled`) and the user's
own command (:mod:`.own`). The lifecycle, the launch sequence, the monitor and the harvest never ask
which kind a run is; they ask its job (``jobs.job_of(record)``, ``jobs.job_for(task)``).

A job answers four questions:

- **resolve**: what the launch request becomes for this kind (:meth:`Job.request` before the
  trainer's resolution, :meth:`Job.resolved` after it), and what the run record keeps to do it again;
- **start**: put the job on a connected host and start it detached, with its watchdog;
- **harvest**: bring the best checkpoint home (``fetch-best``) and mirror the newest (``watch``);
- **resume**: which mirrored checkpoint a new pod continues from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog
    from gpucli.providers.registry import Host
    from gpucli.run.files.harvest import FetchResult, MirrorResult
    from gpucli.run.inputs.launch import LaunchRequest, ResolvedLaunch
    from gpucli.runs.records import RunRecord

EventFn = Callable[[str], None]


class Job(Protocol):
    """A kind of job, resolved for one launch (or read back from a run record)."""

    kind: str  # "trainer" | "own": the record's model and phase say "own-code" for the latter
    checks_disk: bool  # the bundled trainer's checkpoint sizes are known before renting; own code's are not
    resumes_from_volume: bool  # its checkpoints on a network volume are read back on a resume

    # -- resolve --------------------------------------------------------------------------------

    def request(self, req: LaunchRequest) -> LaunchRequest:
        """The request the trainer's resolution is run on (machine, price, limits)."""
        ...

    def resolved(self, resolved: ResolvedLaunch, catalog: Catalog, asked: LaunchRequest) -> ResolvedLaunch:
        """The launch as this kind runs it (its command, its step count, its estimate); ``asked``: the
        request as the user gave it, before :meth:`request`."""
        ...

    def default_name(self, profile: str, model: str, phase: str) -> str:
        """A run name when ``--name`` is not given."""
        ...

    def labelled(self, record: RunRecord) -> RunRecord:
        """A new run's record as this kind names what runs (model and phase)."""
        ...

    def inputs(self) -> dict[str, Any]:
        """What the run record keeps (besides the request) to make this job again on a resume."""
        ...

    def again(self) -> Job:
        """The job checked again for a new launch of the same run (a resume)."""
        ...

    def describe(self) -> list[str]:
        """Lines for ``launch --dry-run`` beyond the resolved launch."""
        ...

    def secret_names(self) -> tuple[str, ...]:
        """Secrets the job asks for by name (task.yaml ``env_from_local``), checked before renting."""
        ...

    # -- start ----------------------------------------------------------------------------------

    def start(self, host: Host, resolved: ResolvedLaunch, record: RunRecord, *, on_event: EventFn,
              save: Callable[[RunRecord], Any], restore: Path | None = None,
              metrics: Path | None = None, node_env: Mapping[str, str] | None = None) -> RunRecord:
        """Put the job on ``host`` and start it detached with its watchdog; ``restore`` (a mirrored
        checkpoint on this machine) and ``metrics`` are uploaded first on a resume."""
        ...

    # -- harvest --------------------------------------------------------------------------------

    def fetch_best(self, host: Host, record: RunRecord, dest: Path, *, with_optimizer: bool = False,
                   progress: Any = None, on_event: EventFn) -> FetchResult: ...

    def mirror(self, host: Host, record: RunRecord, *, keep: int = 2, progress: Any = None,
               on_event: EventFn) -> MirrorResult: ...

    # -- resume ---------------------------------------------------------------------------------

    def restore_point(self, run: str) -> Path | None:
        """The mirrored checkpoint on this machine a resume on a new pod uploads, or None."""
        ...
