"""A run's life after the command line: launch, resume, watch (mirror and recover), and the clean-up
of a failed launch.

Nothing here prints or knows the CLI: progress lines go to ``on_step`` (the launch's steps) and
everything else to ``on_notice`` as a :class:`Notice`; the commands render both.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucli.errors import GpucliError, UsageError
from gpucli.providers.clusterend import cluster_gone, cluster_of
from gpucli.providers.local.target import local_gpus
from gpucli.providers.registry import get_target, open_host
from gpucli.providers.target import OfferAsk
from gpucli.run.files import store
from gpucli.run.files.checkpoints import checkpoint_step, list_checkpoints
from gpucli.run.files.harvest import mirror_root
from gpucli.run.files.transfer import plan_transfer, reserve
from gpucli.run.host.nodes import gather_shards
from gpucli.run.inputs.launch import LaunchRequest, ResolvedLaunch, check_disk, resolve
from gpucli.run.inputs.money import balance_guard
from gpucli.run.inputs.precedence import resume_choices
from gpucli.run.oversee.runend import own_end
from gpucli.run.starting import start
from gpucli.run.starting.jobs import BUNDLED, Job, job_for, job_of
from gpucli.run.starting.multinode import end_rented, rented_of, start_nodes
from gpucli.run.starting.podrescue import take_newest_from_old_pod
from gpucli.run.watch.monitor import best_val, replaces_slow, status_of, trainer_alive
from gpucli.runs import records as runs
from gpucli.runs.defaults import DEFAULTS
from gpucli.runs.launchinputs import LaunchInputs
from gpucli.runs.notice import Notice, NoticeFn, StepFn
from gpucli.runs.records import RunRecord
from gpucli.runs.secretenv import resolve as secrets_present
from gpucli.settings import watch_poll_s

if TYPE_CHECKING:
    from pathlib import Path

    from gpucli.plan.catalog import Catalog
    from gpucli.providers.registry import Host, Provisioner
    from gpucli.runs.task import Task
    from gpucli.ssh import SshTarget


def _quiet(_: object) -> None:
    return None


@dataclass(frozen=True)
class PreparedLaunch:
    """A launch ready to go: offers and bid fixed (cloud), nothing created yet."""

    request: LaunchRequest  # as asked for: kept in the record, so a resume chooses its price afresh
    resolved: ResolvedLaunch
    provision: Provisioner | None
    ssh: SshTarget | None
    job: Job = BUNDLED  # the bundled trainer or the user's own command

    @property
    def inputs(self) -> LaunchInputs:
        """What the record keeps to resolve the same launch again (``gpucli resume``)."""
        data = self.request.to_json()
        volume = self.provision.volume if self.provision is not None else None
        if volume is not None:  # the volume's id: a resume mounts this very volume (names need not be unique)
            data["volume"] = volume.to_json()
        data.update(self.job.inputs())
        return LaunchInputs.from_dict(data)  # type: ignore[return-value]  # a dict in, never None


def run_name_for(catalog: Catalog, req: LaunchRequest, job: Job = BUNDLED) -> str:
    """``--name`` checked and free, or a fresh ``model-profile-phase`` name."""
    if req.name:
        runs.check_name(req.name)
        if (runs.runs_dir() / f"{req.name}.json").exists():
            raise UsageError(f"a run named '{req.name}' exists", hint="pick another --name")
        return req.name
    return runs.unique_name(_default_name(catalog, req, job))


def _default_name(catalog: Catalog, req: LaunchRequest, job: Job) -> str:
    prof = catalog.profile(req.profile)
    model = req.model or DEFAULTS.model_for(prof.gpu is not None)
    return job.default_name(prof.name, model, req.phase)


def plan(catalog: Catalog, req: LaunchRequest, task: Task | None = None) -> tuple[ResolvedLaunch, Job]:
    """What the launch would do (``--dry-run``): checked and resolved, nothing searched or created.
    ``task``: the user's own command instead of the bundled trainer."""
    job = job_for(task)
    checked = req.checked()
    resolved = resolve(catalog, job.request(checked), run_name=run_name_for(catalog, checked, job))
    if job.checks_disk:
        check_disk(resolved)
    return job.resolved(resolved, catalog, checked), job


def prepare(catalog: Catalog, req: LaunchRequest, *, run_name: str | None = None,
            task: Task | None = None, volume_id: str | None = None, job: Job | None = None,
            offer_id: str | None = None) -> PreparedLaunch:
    """Check and resolve the request; on a cloud target also choose the offers and the bid, before
    anything is created, so the record and the trainer's dollar limit carry the most this pod can
    cost per hour rather than the catalogue's typical price. ``task``: the user's own command (or
    ``job``, one already made); ``volume_id``: the network volume an earlier launch of the run used
    (a resume mounts it again); ``offer_id``: that offer only (gpucli/run/life/failover.py)."""
    req = req.checked()
    job = job if job is not None else job_for(task)  # a missing folder or a bad grace is said before any offer is searched
    secrets_present(req.env_names + job.secret_names())  # a missing secret is said before anything is rented
    if run_name is not None:
        return _prepare(catalog, req, run_name, job, volume_id, offer_id)
    # The name is claimed before anything else, so two launches at once never share one.
    name = runs.reserve_name(req.name, exact=True) if req.name else \
        runs.reserve_name(_default_name(catalog, req, job))
    try:
        return _prepare(catalog, req, name, job)
    except BaseException:
        runs.release_name(name)
        raise


def _prepare(catalog: Catalog, req: LaunchRequest, name: str, job: Job,
             volume_id: str | None = None, offer_id: str | None = None) -> PreparedLaunch:
    asked, req = req, job.request(req)
    target = get_target(req.provider)
    resolved = resolve(catalog, req, run_name=name)
    if job.checks_disk:  # the bundled trainer's checkpoints, before any offer is searched
        check_disk(resolved)
    provision = None
    if target.needs_gpu and resolved.gpu_id is None:
        raise UsageError(f"profile {req.profile} has no GPU; {target.name} pods need a GPU profile")
    if target.caps.this_machine and resolved.gpu_id is not None and not req.force:
        if local_gpus() == 0:  # refused before anything starts: nothing is recorded, nothing costs
            raise UsageError(f"profile {req.profile} needs a GPU ({resolved.gpu_name}) and this machine has none",
                             hint="--profile cpu runs here on the CPU; --force launches anyway")
    # a rule: a provisioner rents one pod; several nodes are rented as one cluster or overlay (run/starting/multinode.py)
    if resolved.gpu_id is not None and req.nodes == 1:
        provision = target.provisioner(catalog, name, resolved.gpu_id, resolved.n_gpus, spot=req.spot,
                                       bid_per_gpu_usd=req.bid_per_gpu_usd, image=req.image,
                                       disk_gb=req.disk_gb or resolved.pod_disk_gb,
                                       ready_timeout_s=req.ready_timeout_s or DEFAULTS.ready_timeout_s,
                                       ask=dataclasses.replace(offer_ask(req, resolved), offer_id=offer_id))
    priced, quote = reserve(req, resolved, target, provision)  # the planned bandwidth inside --budget
    if provision is not None and req.limits.price_per_hour_usd is None:
        priced = dataclasses.replace(priced, limits=priced.limits.with_(price_per_hour_usd=provision.max_price_per_hour_usd))
    if priced is not req:
        resolved = resolve(catalog, priced, run_name=name)
    balance_guard(target, resolved, force=req.force)  # before anything is rented
    provision = dataclasses.replace(provision, notes=tuple(quote)) if quote and provision else provision  # type: ignore[type-var]
    if req.volume and provision is not None:  # checked() let --volume through only where there are volumes
        # Looked up (or, with --volume-size, created) after the balance check: a refused launch creates nothing.
        if job.checks_disk and req.volume_size_gb:  # what would be created must hold the run, before it is
            check_disk(resolved, volume_gb=req.volume_size_gb)
        provision = target.with_volume(provision, req.volume, size_gb=req.volume_size_gb, volume_id=volume_id)
        volume = provision.volume
        if job.checks_disk and volume is not None:  # an existing volume's size is known now
            check_disk(resolved, volume_gb=volume.size_gb)
    return PreparedLaunch(req, job.resolved(resolved, catalog, asked), provision, target.endpoint(req.host, req.identity), job)


def offer_ask(req: LaunchRequest, resolved: ResolvedLaunch) -> OfferAsk:
    """What the offers are filtered and ranked on: ``--query``, ``--force``, the run's planned hours
    (at most ``--hours``) and its planned bytes in and out (gpucli.run.files.transfer)."""
    known = [h for h in (resolved.planned.hours, resolved.limits.max_hours) if h]  # --hours caps the plan
    return OfferAsk(query=req.query, hours=min(known) if known else None,
                    transfer_gb=plan_transfer(resolved).gb(), force=req.force)


def launch(prepared: PreparedLaunch, *, on_step: StepFn = _quiet, on_notice: NoticeFn = _quiet) -> RunRecord:
    """Start a new run; a failed launch ends every pod it created before the error goes on."""
    volume = prepared.provision.volume if prepared.provision is not None else None
    if volume is not None and volume.created:
        price = f", ${volume.usd_per_month:.2f}/month" if volume.usd_per_month is not None else ""
        on_step(f"created network volume {volume.name} ({volume.volume_id}, {volume.size_gb} GB in "
                f"{volume.data_center_id}): kept after the run{price} until you delete it")
    try:  # one machine or several, one path (gpucli/run/starting/multinode.py)
        return start_nodes(prepared, on_step=on_step, on_warn=lambda t: on_notice(Notice("warn", t)),
                           on_info=lambda t: on_notice(Notice("info", t)))
    except BaseException:
        cleanup_failed(prepared.resolved.name, on_notice)
        raise
    finally:
        runs.release_name(prepared.resolved.name)  # the record holds the name from its first save on


def host_alive(record: RunRecord) -> bool:
    """Whether the run's trainer is alive on a host that answers now."""
    try:
        host = open_host(record, connect_timeout_s=10)
    except GpucliError:
        return False
    with host:
        return bool(trainer_alive(host, record))


def resume(run: str | None, catalog: Catalog, *, from_scratch: bool = False, on_step: StepFn = _quiet,
           on_notice: NoticeFn = _quiet, nodes: int | None = None, provider: str | None = None) -> RunRecord:
    """Continue a stopped or preempted run: a new pod of the same profile, the newest mirrored
    checkpoint (cloud) or the one on the host (local, ssh), same run. A run on a network volume
    mounts the same volume again, and the newer of the volume's checkpoint and the mirror's wins
    (:func:`choose_restore`)."""
    record = runs.resolve(run)
    if not record.launch:
        raise UsageError(f"run {record.name} was started by an older gpucli and cannot be resumed")
    if record.status == "running" and host_alive(record):
        raise UsageError(f"run {record.name} is still running", hint="`gpucli down` it first, or leave it be")
    try:
        req = LaunchRequest.from_json(record.launch)
        job = job_of(record)
    except (TypeError, ValueError, KeyError, AttributeError, UsageError) as exc:
        # A record edited by hand or by another program: its launch cannot be read back as one.
        raise runs.BadRecord(f"run {record.name}: its record's launch settings cannot be read "
                             f"({type(exc).__name__}: {str(exc)[:120]})",
                             hint="start it again with `gpucli launch`") from None
    old_target = get_target(record.provider)  # below: resume's command line over the run's launch (gpucli/run/inputs/precedence.py)
    provider, nodes = resume_choices({"provider": record.provider, "nodes": req.nodes}, provider=provider, nodes=nodes).pick("provider", "nodes")
    req, moving = store.moved_request(req, record, provider, nodes)  # --provider: the same run elsewhere
    target = get_target(req.provider)
    # The run folder is on the volume: the checkpoints written there outlive the pod.
    on_volume = target.cloud and bool(req.volume) and job.resumes_from_volume
    restore = metrics = said = None
    if req.nodes > 1:
        # Kept, a rule and not a second path: a run over several machines continues from the sharded
        # checkpoints in its nodes' folders (on fewer nodes: the others' shards brought to node 0 first);
        # one machine's from its newest whole checkpoint, brought home from a pod (below).
        record, req = _nodes_kept(record, req, nodes, on_step=on_step)
        said = f"resuming {record.name} on its {req.nodes} nodes"
    elif nodes is not None and nodes != 1:
        raise UsageError("resume --nodes goes with a run over several machines")
    elif target.cloud or moving:
        if not from_scratch and old_target.cloud and not on_volume:
            # the old pod's newest checkpoint first, verified (gpucli/run/starting/podrescue.py)
            take_newest_from_old_pod(record, job, on_step=on_step)
        if not from_scratch:  # the store's newest whole checkpoint, when newer than the mirror's
            store.pull_newest(record, on_step)
        restore = job.restore_point(record.name)
        metrics = mirror_root(record.name) / "metrics.jsonl"
        if restore is None and not from_scratch and not on_volume:
            raise UsageError(f"no mirrored checkpoint of {record.name} on this machine",
                             hint="pass --from-scratch to start over (launch with --mirror-checkpoints or "
                                  "--recover, or run `gpucli mirror`, to keep one)")
        try:  # the old pod, if anything of it is left, stops billing now
            old_target.terminate(record)
        except GpucliError as exc:
            on_notice(Notice("warn", f"could not terminate the old pod {record.instance_id}: {exc}"))
        old = (record.instance_id,) if record.instance_id else ()
        record = record.with_(previous_instances=record.previous_instances + old, instance_id=None)
        said = f"resuming {record.name} from mirrored {restore.name}" if restore is not None else None
    volume_id = record.launch.volume.id if record.launch and record.launch.volume else None
    prepared = prepare(catalog, req, run_name=record.name, job=job.again(), volume_id=volume_id)
    if moving:
        record = store.moved_record(record, req, prepared.resolved.workdir)
    if (inputs := prepared.inputs).volume is not None:  # the volume this pod mounts (another, when the recorded one was deleted)
        record = record.with_(launch=(record.launch or LaunchInputs()).with_(volume=inputs.volume))
    try:
        if on_volume:
            return _resume_on_volume(prepared, record, restore, metrics, from_scratch=from_scratch,
                                     on_step=on_step, on_notice=on_notice)
        if said:
            on_step(said)
        return start_nodes(prepared, on_step=on_step, on_warn=lambda t: on_notice(Notice("warn", t)),
                           on_info=lambda t: on_notice(Notice("info", t)), resume=record, restore=restore,
                           metrics=metrics)
    except BaseException:
        cleanup_failed(record.name, on_notice)
        raise


def choose_restore(host: Host, workdir: str, mirror: Path | None, *, on_step: StepFn = _quiet) -> tuple[Path | None, bool]:
    """Which checkpoint a resume on a network volume continues from: the volume's newest when it is at
    the mirror's step or past it (the mirror is only a copy of what the volume had, taken at intervals:
    uploading an older one would be wasted, and the trainer resumes from the newest anyway), else the
    mirror, uploaded as on a pod without a volume. Returns (the mirror to upload or None, whether any
    checkpoint is there to resume from). The run's metrics are cut back to the step it continues from,
    so the curve joins up instead of repeating the steps trained again."""
    held = list_checkpoints(host, workdir)
    newest = held[-1] if held else None
    mirror_step = checkpoint_step(mirror) if mirror is not None else None
    step: int | None
    if newest is not None and (mirror_step is None or newest.step >= mirror_step):
        behind = f"; the mirror on this machine is at step {mirror_step}, not uploaded" if mirror_step is not None else ""
        on_step(f"resuming from {newest.name} (step {newest.step}) on the network volume{behind}")
        upload, step = None, newest.step
    elif mirror is not None:
        on_step(f"resuming from mirrored {mirror.name} (step {mirror_step}): the network volume has "
                + (f"only {newest.name}" if newest is not None else "no checkpoint of the run"))
        upload, step = mirror, mirror_step
    else:
        return None, False
    path = f"{workdir}/metrics.jsonl"
    if step is not None and host.exists(path):
        data = host.read_file(path)
        kept = start.metrics_until(data, step)
        if kept != data:
            host.run(f"mkdir -p -- {shlex.quote(workdir)}", timeout_s=60)
            host.write_file(path, kept, mode=0o644)
    return upload, True


def _resume_on_volume(prepared: PreparedLaunch, record: RunRecord, mirror: Path | None, metrics: Path | None, *,
                      from_scratch: bool, on_step: StepFn, on_notice: NoticeFn) -> RunRecord:
    """A resume whose run folder is on a network volume: the pod is created first (its id recorded
    before any wait, as a launch does), then the volume's checkpoints are compared with the mirror's
    (:func:`choose_restore`) and the launch goes on on that pod."""
    assert prepared.provision is not None
    record = record.with_(status="provisioning", pid=None, watchdog_pid=None, ended_at=None, end_reason=None,
                          message=None, ssh=None, limits=prepared.resolved.limits)
    runs.save(record)  # written before anything waits

    def on_created(instance_id: str) -> None:
        nonlocal record
        record = record.with_(instance_id=instance_id)
        runs.save(record)

    try:
        ssh = prepared.provision(on_created=on_created, on_event=on_step)
        record = record.with_(ssh=ssh)
        runs.save(record)
        with get_target(record.provider).open(record) as host:
            if host.host_key:
                record = record.with_(ssh=dataclasses.replace(ssh, host_key=host.host_key))
                runs.save(record)
            upload, found = choose_restore(host, prepared.resolved.workdir, mirror, on_step=on_step)
        if not found and not from_scratch:
            raise UsageError(f"no checkpoint of {record.name} on its network volume nor on this machine",
                             hint="pass --from-scratch to start over")
    except BaseException as exc:
        message = str(exc) if isinstance(exc, GpucliError) else f"{type(exc).__name__}: {exc}"
        runs.save(record.with_(status="failed", ended_at=runs.now_iso(), message=message[:500]))
        raise
    # the launch goes on on this pod, as on one named up front (nothing more to rent)
    return start_nodes(dataclasses.replace(prepared, provision=None), on_step=on_step,
                       on_warn=lambda t: on_notice(Notice("warn", t)), on_info=lambda t: on_notice(Notice("info", t)),
                       resume=record, restore=upload, metrics=metrics if upload is not None else None)


def cleanup_failed(run_name: str, on_notice: NoticeFn = _quiet) -> None:
    """A failed launch terminates every pod it created: the one its record names and any other pod
    carrying its label. Pods the provisioning loop already ended are not reported again."""
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
    poll_s = watch_poll_s(poll_s)
    name = runs.resolve(run).name
    resumes = 0
    info: StepFn = lambda text: on_notice(Notice("info", text))  # noqa: E731
    info(f"watching {name}" + (" (mirroring checkpoints)" if mirror else "")
         + (" (recovering from preemption)" if recover else "") + "; Ctrl-C detaches, the run goes on")
    while True:
        record = runs.load(name)
        if record.status in ("stopped", "failed") and not record.active:
            _end_cluster(record, on_notice)
            info(f"{name}: {record.status}; stopped watching")
            return "ended"
        target = get_target(record.provider)
        try:
            with open_host(record, connect_timeout_s=15) as host:
                if mirror:
                    job_of(record).mirror(host, record, on_event=info)
                st = status_of(host, record)
            if replaces_slow(record, st) and (resumes := resumes + 1) <= max_resumes:  # its pod waits for this
                on_notice(Notice("warn", f"{name}: {st.finished_reason}; on a new machine ({resumes}/{max_resumes})"))
                resume(name, catalog, on_notice=on_notice)  # its checkpoint home, the slow pod ended, the next
                continue
            if (st.state in ("finished", "failed") or (st.state == "stopped" and st.finished_reason)) \
                    and (st.finished_reason or cluster_of(record)):
                # "failed": the user's own command exited non-zero; a new pod would fail the same way
                runs.save(record.with_(status=st.state, ended_at=runs.now_iso(), end_reason=st.finished_reason,
                                       cost_usd=st.cost_usd, step=st.step, **best_val(st),
                                       loss=st.loss if isinstance(st.loss, (int, float)) else None))
                _end_cluster(record, on_notice)
                info(f"{name}: {st.state} ({st.finished_reason}); stopped watching")
                return "ended"
            gone = False
        except GpucliError as exc:
            gone = True
            on_notice(Notice("warn", f"{name}: cannot reach the pod ({exc})"))
        if cluster_of(record):  # member pods are not the pod API's (gpucli/providers/clusterend.py)
            if gone and cluster_gone(record):
                runs.save(record.with_(status="failed", ended_at=runs.now_iso(), end_reason="cluster gone"))
                info(f"{name}: its cluster is gone; stopped watching")
                return "ended"
        elif gone or (target.cloud and record.instance_id):
            if (ended := own_end(record)) is not None:  # the run's own end decides before the pod's state
                _end_cluster(record, on_notice)
                info(f"{name}: finished ({ended.finished_reason}); stopped watching")
                return "ended"
            ps = target.pod_state(record)
            if ps is not None and ps.over:
                on_notice(Notice("warn", f"{name}: {ps.describe}"))
                if record.nodes and target.cloud:  # rank 0's machine is lost: the other nodes end with it
                    _end_cluster(record, on_notice)
                    info(f"{name}: node 0 is gone; every node of the run ended; stopped watching")
                    return "ended"
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


def _end_cluster(record: RunRecord, on_notice: NoticeFn) -> None:
    """A run over a rented cluster is over: the cluster goes (a pod's own key cannot delete it). A run
    rented as one pod, or on machines not rented, has none (nothing is asked of any provider)."""
    if end_rented(record, on_warn=lambda t: on_notice(Notice("warn", t))):
        on_notice(Notice("info", f"{record.name}: deleted its {rented_of(record)}"))


def _nodes_kept(record: RunRecord, req: LaunchRequest, nodes: int | None, *,
                on_step: StepFn) -> tuple[RunRecord, LaunchRequest]:
    """A run over several machines continues from the sharded checkpoints in its nodes' folders: on the
    same nodes, or (``nodes``) on the first ``nodes`` of them, the others' shards brought to node 0
    first (the trainer reshards). A rented cluster is gone with its disks, and its checkpoints with it."""
    if get_target(record.provider).cloud:
        raise UsageError(f"run {record.name} ran on a rented cluster: its sharded checkpoints went with it",
                         hint="launch it again (fetch-best keeps the consolidated weights)")
    if nodes is not None and nodes != req.nodes:
        if not 1 <= nodes < req.nodes:
            raise UsageError(f"resume --nodes {nodes}: the run has {req.nodes} nodes; it resumes on fewer of them",
                             hint="a run on more machines is a new launch")
        gather_shards(record, nodes, on_step=on_step)
        req = dataclasses.replace(req, nodes=nodes, hosts=req.hosts[:nodes] if len(req.hosts) > 1 else req.hosts)
        if len(req.hosts) == 1:
            req = dataclasses.replace(req, host=req.hosts[0], hosts=())
        record = record.with_(nodes=record.nodes[:nodes - 1], launch=(record.launch or LaunchInputs()).with_(request=req.to_json()["request"]))
    return record, req
