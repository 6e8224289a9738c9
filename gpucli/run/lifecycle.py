"""A run's life after the command line: launch, resume, watch (mirror and recover), and the clean-up
of a failed launch.

Nothing here prints or knows the CLI: progress lines go to ``on_step`` (the launch's steps) and
everything else to ``on_notice`` as a :class:`Notice`; the commands render both.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gpucli.errors import GpucliError, UsageError
from gpucli.run import records as runs
from gpucli.run.defaults import DEFAULTS
from gpucli.run.launch import LaunchRequest, ResolvedLaunch, check_disk, resolve
from gpucli.run.records import RunRecord

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog
    from gpucli.run.ownrun import OwnCode
    from gpucli.run.targets import Provisioner
    from gpucli.run.task import Task
    from gpucli.ssh import SshTarget


@dataclass(frozen=True)
class Notice:
    level: Literal["info", "warn", "error"]
    text: str


StepFn = Callable[[str], None]
NoticeFn = Callable[[Notice], None]


def _quiet(_: object) -> None:
    return None


@dataclass(frozen=True)
class PreparedLaunch:
    """A launch ready to go: offers and bid fixed (cloud), nothing created yet."""

    request: LaunchRequest  # as asked for: kept in the record, so a resume chooses its price afresh
    resolved: ResolvedLaunch
    provision: Provisioner | None
    ssh: SshTarget | None
    own: OwnCode | None = None  # the user's own command instead of the bundled trainer

    @property
    def inputs(self) -> dict:
        """What the record keeps to resolve the same launch again (``gpucli resume``)."""
        from gpucli.run.ownrun import task_to_json

        data = self.request.to_json()
        if self.own is not None:
            data["own"] = task_to_json(self.own.task)
        return data


def run_name_for(catalog: Catalog, req: LaunchRequest, task: Task | None = None) -> str:
    """``--name`` checked and free, or a fresh ``model-profile-phase`` name."""
    if req.name:
        runs.check_name(req.name)
        if (runs.runs_dir() / f"{req.name}.json").exists():
            raise UsageError(f"a run named '{req.name}' exists", hint="pick another --name")
        return req.name
    return runs.unique_name(_default_name(catalog, req, task))


def _default_name(catalog: Catalog, req: LaunchRequest, task: Task | None = None) -> str:
    prof = catalog.profile(req.profile)
    if task is not None:
        from gpucli.run.ownrun import default_name

        return default_name(task, prof.name)
    model = req.model or DEFAULTS.model_for(prof.gpu is not None)
    return f"{model}-{prof.name}-{req.phase}"


def plan(catalog: Catalog, req: LaunchRequest) -> ResolvedLaunch:
    """What the launch would do (``--dry-run``): checked and resolved, nothing searched or created."""
    req = req.checked()
    resolved = resolve(catalog, req, run_name=run_name_for(catalog, req))
    check_disk(resolved)
    return resolved


def plan_own(catalog: Catalog, req: LaunchRequest, task: Task) -> tuple[ResolvedLaunch, OwnCode]:
    """``--dry-run`` of an own-code launch: the resolved launch (its command is the job runner's) and task."""
    from gpucli.run.ownrun import resolve_own

    req = _own_request(req.checked())
    own = resolve_own(task)
    return _own_resolved(resolve(catalog, req, run_name=run_name_for(catalog, req, task)), own), own


def _own_resolved(resolved: ResolvedLaunch, own: OwnCode) -> ResolvedLaunch:
    """The trainer's resolution with the job runner as its command and no step count (the job's
    own code decides how many steps it takes)."""
    from gpucli.run.ownrun import job_command
    from gpucli.run.records import PlannedSpeed

    resolved = dataclasses.replace(resolved, limits=resolved.limits.with_(max_steps=None), disk=None,
                                   planned=PlannedSpeed(source="no prediction for your own code"))
    return dataclasses.replace(resolved, command=job_command(resolved, own))


def prepare(catalog: Catalog, req: LaunchRequest, *, run_name: str | None = None,
            task: Task | None = None) -> PreparedLaunch:
    """Check and resolve the request; on a cloud target also choose the offers and the bid, before
    anything is created, so the record and the trainer's dollar limit carry the most this pod can
    cost per hour rather than the catalogue's typical price. ``task``: the user's own command."""

    req = req.checked()
    if run_name is not None:
        return _prepare(catalog, req, run_name, task)
    # The name is claimed before anything else, so two launches at once never share one.
    name = runs.reserve_name(req.name, exact=True) if req.name else \
        runs.reserve_name(_default_name(catalog, req, task))
    try:
        return _prepare(catalog, req, name, task)
    except BaseException:
        runs.release_name(name)
        raise


def _own_request(req: LaunchRequest) -> LaunchRequest:
    """The trainer's resolution is reused for the machine, price and limits; its smallest preset keeps
    a memory check for a model that will never be trained from refusing a small GPU."""
    return req if req.model else dataclasses.replace(req, model="tiny")


def _prepare(catalog: Catalog, req: LaunchRequest, name: str, task: Task | None = None) -> PreparedLaunch:
    if task is None:
        return _prepare_trainer(catalog, req, name)
    from gpucli.run.ownrun import resolve_own

    own = resolve_own(task)  # a missing folder or a bad grace is said before any offer is searched
    prepared = _prepare_trainer(catalog, _own_request(req), name, own=True)
    return dataclasses.replace(prepared, resolved=_own_resolved(prepared.resolved, own), own=own)


def _prepare_trainer(catalog: Catalog, req: LaunchRequest, name: str, own: bool = False) -> PreparedLaunch:
    from gpucli.run.targets import get_target
    from gpucli.run.targets.money import balance_guard

    target = get_target(req.provider)
    resolved = resolve(catalog, req, run_name=name)
    if not own:  # the bundled trainer's checkpoints, before any offer is searched; own code has no such model
        check_disk(resolved)
    provision = None
    if target.needs_gpu and resolved.gpu_id is None:
        raise UsageError(f"profile {req.profile} has no GPU; {target.name} pods need a GPU profile")
    if resolved.gpu_id is not None:
        provision = target.provisioner(catalog, name, resolved.gpu_id, resolved.n_gpus, spot=req.spot,
                                       bid_per_gpu_usd=req.bid_per_gpu_usd, image=req.image,
                                       disk_gb=req.disk_gb or DEFAULTS.disk_gb,
                                       ready_timeout_s=req.ready_timeout_s or DEFAULTS.ready_timeout_s)
        if req.volume and provision is not None:  # checked() let --volume through only where there are volumes
            provision = target.with_volume(provision, req.volume)  # type: ignore[attr-defined]
            volume = getattr(provision, "volume", None)
            if not own and volume is not None:  # the volume's size is known now
                check_disk(resolved, volume_gb=volume.size_gb)
    if provision is not None and req.limits.price_per_hour_usd is None:
        priced = dataclasses.replace(req, limits=req.limits.with_(price_per_hour_usd=provision.max_price_per_hour_usd))
        resolved = resolve(catalog, priced, run_name=name)
    balance_guard(target, resolved, force=req.force)  # before anything is rented
    return PreparedLaunch(req, resolved, provision, target.endpoint(req.host, req.identity))


def launch(prepared: PreparedLaunch, *, on_step: StepFn = _quiet, on_notice: NoticeFn = _quiet) -> RunRecord:
    """Start a new run; a failed launch ends every pod it created before the error goes on."""
    from gpucli.run.start import launch as start

    try:
        return start(prepared.resolved, on_event=on_step, save=runs.save, ssh=prepared.ssh,
                     provision=prepared.provision, inputs=prepared.inputs, own=prepared.own)
    except BaseException:
        cleanup_failed(prepared.resolved.name, on_notice)
        raise
    finally:
        runs.release_name(prepared.resolved.name)  # the record holds the name from its first save on


def host_alive(record: RunRecord) -> bool:
    """Whether the run's trainer is alive on a host that answers now."""
    from gpucli.run.targets import open_host

    try:
        host = open_host(record, connect_timeout_s=10)
    except GpucliError:
        return False
    from gpucli.run.monitor import trainer_alive

    with host:
        return bool(trainer_alive(host, record))


def resume(run: str | None, catalog: Catalog, *, from_scratch: bool = False, on_step: StepFn = _quiet,
           on_notice: NoticeFn = _quiet) -> RunRecord:
    """Continue a stopped or preempted run: a new pod of the same profile, the newest mirrored
    checkpoint (cloud) or the one on the host (local, ssh), same run."""
    from gpucli.run.mirror import mirror_root, newest_good
    from gpucli.run.targets import get_target

    record = runs.resolve(run)
    if not record.launch:
        raise UsageError(f"run {record.name} was started by an older gpucli and cannot be resumed")
    if record.status == "running" and host_alive(record):
        raise UsageError(f"run {record.name} is still running", hint="`gpucli down` it first, or leave it be")
    req = LaunchRequest.from_json(record.launch)
    task = None
    if record.launch.get("own"):
        from gpucli.run.ownrun import task_from_json

        task = task_from_json(record.launch["own"])
    target = get_target(record.provider)
    restore = metrics = None
    if target.cloud:
        if task is not None:
            from gpucli.run.mirror import own_mirror

            restore = own_mirror(record.name)
        else:
            restore = newest_good(record.name)
        metrics = mirror_root(record.name) / "metrics.jsonl"
        if restore is None and not from_scratch:
            raise UsageError(f"no mirrored checkpoint of {record.name} on this machine",
                             hint="pass --from-scratch to start over (launch with --mirror-checkpoints or "
                                  "--recover, or run `gpucli mirror`, to keep one)")
        try:  # the old pod, if anything of it is left, stops billing now
            target.terminate(record)
        except GpucliError as exc:
            on_notice(Notice("warn", f"could not terminate the old pod {record.instance_id}: {exc}"))
        old = (record.instance_id,) if record.instance_id else ()
        record = record.with_(previous_instances=record.previous_instances + old, instance_id=None)
    prepared = prepare(catalog, req, run_name=record.name, task=task)
    from gpucli.run.start import launch as start

    if restore is not None:
        on_step(f"resuming {record.name} from mirrored {restore.name}")
    try:
        return start(prepared.resolved, on_event=on_step, save=runs.save, ssh=record.ssh or prepared.ssh,
                     provision=prepared.provision, record=record, restore=restore, metrics=metrics,
                     own=prepared.own)
    except BaseException:
        cleanup_failed(record.name, on_notice)
        raise


def cleanup_failed(run_name: str, on_notice: NoticeFn = _quiet) -> None:
    """A failed launch terminates every pod it created: the one its record names and any other pod
    carrying its label. Pods the provisioning loop already ended are not reported again."""
    from gpucli.run.targets import get_target

    try:
        record = runs.load(run_name)
    except GpucliError:
        return
    target = get_target(record.provider)
    try:
        ended = target.terminate_alive(record)
    except GpucliError as exc:
        what = f"pod {record.instance_id}" if record.instance_id else f"pods labelled {record.label}"
        on_notice(Notice("error", f"could not terminate {what} of the failed launch: {exc}; end it in the "
                                  "provider console or with `gpucli down --strays`"))
        return
    if ended:
        runs.save(record.with_(message=(record.message or "") + f" (pod {', '.join(ended)} terminated)"))
        on_notice(Notice("info", f"terminated pod {', '.join(ended)} of the failed launch"))


def watch(run: str | None, catalog: Catalog, *, mirror: bool, recover: bool, poll_s: float = DEFAULTS.watch_poll_s,
          max_resumes: int = DEFAULTS.max_resumes, on_notice: NoticeFn = _quiet,
          sleep: Callable[[float], None] = time.sleep) -> str:
    """Stay with a run until it ends: mirror each new checkpoint, notice a pod taken away, and (with
    ``recover``) resume on a new pod, at most ``max_resumes`` times. Returns how the watch ended:
    ``ended`` (the run is over), ``preempted`` (not recovering) or ``gave-up``."""
    from gpucli.run.mirror import mirror_once
    from gpucli.run.monitor import status_of
    from gpucli.run.targets import get_target, open_host
    from gpucli.run.targets.runend import own_end
    from gpucli.settings import watch_poll_s

    poll_s = watch_poll_s(poll_s)
    name = runs.resolve(run).name
    resumes = 0
    info: StepFn = lambda text: on_notice(Notice("info", text))  # noqa: E731
    info(f"watching {name}" + (" (mirroring checkpoints)" if mirror else "")
         + (" (recovering from preemption)" if recover else "") + "; Ctrl-C detaches, the run goes on")
    while True:
        record = runs.load(name)
        if record.status in ("stopped", "failed") and not record.active:
            info(f"{name}: {record.status}; stopped watching")
            return "ended"
        target = get_target(record.provider)
        try:
            with open_host(record, connect_timeout_s=15) as host:
                if mirror:
                    mirror_once(host, record, on_event=info)
                st = status_of(host, record)
            if st.state in ("finished", "failed") and st.finished_reason:
                # "failed": the user's own command exited non-zero; a new pod would fail the same way
                runs.save(record.with_(status=st.state, ended_at=runs.now_iso(), end_reason=st.finished_reason,
                                       cost_usd=st.cost_usd, step=st.step,
                                       loss=st.loss if isinstance(st.loss, (int, float)) else None))
                info(f"{name}: {st.state} ({st.finished_reason}); stopped watching")
                return "ended"
            gone = False
        except GpucliError as exc:
            gone = True
            on_notice(Notice("warn", f"{name}: cannot reach the pod ({exc})"))
        if gone or (target.cloud and record.instance_id):
            if (ended := own_end(record)) is not None:  # the run's own end decides before the pod's state
                info(f"{name}: finished ({ended.finished_reason}); stopped watching")
                return "ended"
            ps = target.pod_state(record)
            if ps is not None and ps.over:
                on_notice(Notice("warn", f"{name}: {ps.describe}"))
                if not recover:
                    info("not resuming (no --recover): `gpucli resume` continues it on a new pod")
                    return "preempted"
                if resumes >= max_resumes:
                    on_notice(Notice("error", f"{name}: preempted {resumes} times; giving up "
                                              "(`gpucli resume` to try again)"))
                    return "gave-up"
                resumes += 1
                resume(name, catalog, on_notice=on_notice)
                info(f"{name}: resumed on a new pod ({resumes}/{max_resumes})")
                continue
        sleep(poll_s)
