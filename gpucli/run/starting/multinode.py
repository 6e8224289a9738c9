"""Starting a run on its machines, one or several (``gpucli launch --nodes N``; one is the case N = 1):
get them, connect to every node and check them, then start the trainer (or the user's command) and its
watchdog on each, rank 0 first; a launch that fails ends every node it started. The layout, commands
and variables are :mod:`gpucli.run.host.nodes`'s."""

from __future__ import annotations

import dataclasses
import secrets
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpucli.errors import GpucliError, UsageError
from gpucli.plan.catalog import load_catalog
from gpucli.providers.cloudtarget import created_volume_note, ssh_keypair
from gpucli.providers.clusterend import cluster_of, start_watcher, watcher_log
from gpucli.providers.credentials import MissingKeyError
from gpucli.providers.registry import Stray, get_target, open_host
from gpucli.providers.rentend import end_rented  # noqa: F401 - where the launch and down paths name it
from gpucli.providers.runpod.clusterrent import (
    billed_usd_per_hour,
    cluster_addresses,
    cluster_strays,
    clusters_client,
    end_cluster,
    gpu_type_id,
    rent_cluster,
)
from gpucli.providers.vast.overlayrent import (
    end_stray_overlay,
    find_cluster,
    overlay_addresses,
    overlay_of,
    rent_vast,
)
from gpucli.run.host import procs
from gpucli.run.host.linkprobe import measure_for_launch
from gpucli.run.host.nodes import (
    NodeSpec,
    WarnFn,
    as_run,
    check_nodes,
    layout,
    members,
    node_env,
    node_workdir,
    ports_for,
)
from gpucli.run.host.owner import ended_elsewhere, this_launcher
from gpucli.run.starting.jobs import start_on
from gpucli.run.starting.start import record_for
from gpucli.run.watch.monitor import status_of, stop_trainer, trainer_alive
from gpucli.runs import records as runs
from gpucli.runs.defaults import DEFAULTS
from gpucli.runs.launchinputs import KeptVolume
from gpucli.runs.records import NodeRecord, RunRecord
from gpucli.settings import cluster_ssh_port, pod_ssh_user, provider_poll_s, volume_mount
from gpucli.ssh import SshTarget

if TYPE_CHECKING:
    from pathlib import Path

    from gpucli.providers.registry import Host, Provisioner
    from gpucli.run.inputs.launch import LaunchRequest, ResolvedLaunch
    from gpucli.run.starting.jobs.base import Job
    from gpucli.runs.launchinputs import LaunchInputs


def _quiet(_: str) -> None:
    return None


class PreparedNodes(Protocol):
    """A launch ready to go, as starting it on several machines reads it
    (:class:`gpucli.run.life.lifecycle.PreparedLaunch`, which sits above this module and calls it)."""

    @property
    def request(self) -> LaunchRequest: ...
    @property
    def resolved(self) -> ResolvedLaunch: ...
    @property
    def job(self) -> Job: ...
    @property
    def inputs(self) -> LaunchInputs: ...
    @property
    def provision(self) -> Provisioner | None: ...  # one pod to rent (None: several, or none to rent)
    @property
    def ssh(self) -> SshTarget | None: ...  # the one machine's endpoint named up front (--host)


def start_nodes(prepared: PreparedNodes, *, on_step: Callable[[str], None], on_warn: Callable[[str], None] = _quiet,
                on_info: Callable[[str], None] = _quiet, save: Callable[[RunRecord], Any] = runs.save,
                resume: RunRecord | None = None, restore: Path | None = None, metrics: Path | None = None) -> RunRecord:
    """Start a ``PreparedLaunch`` on its machines, one or several, rank 0 first:

    1. get them: one pod provisioned (``prepared.provision``), several rented as one on a cloud (a RunPod
       Instant Cluster, vast.ai instances on one overlay), else the machines named (this machine, your SSH
       hosts, a pod already there): every id is in the record before anything waits on it;
    2. open each and, where there are several, check them against each other;
    3. start the job on each, with the peers' variables and watch only where there are peers;
    4. on any failure stop the run on every node it started, delete what was rented as one, and save the
       record failed. (A pod rented on its own is ended by the caller's ``cleanup_failed``, which ends any
       pod carrying the run's label: the caller may not own it, as ``launch --on`` a box does not.)

    ``resume``: the run's record, continued (its name, start, cost so far, nodes' folders and pinned keys;
    the trainer's ``--resume auto`` takes the newest checkpoint there); ``restore``/``metrics``: a mirrored
    checkpoint and the metrics uploaded to rank 0 before the job starts."""
    resolved, req, job = prepared.resolved, prepared.request, prepared.job
    latest: list[RunRecord] = []  # the newest record saved: a failure keeps every id the rental recorded
    save = _tracking(save, latest)
    own = job if job.kind == "own" else None
    target = get_target(resolved.provider)
    # Kept, a rule and not a second path: a cloud rents several machines as one (a cluster, an overlay: their
    # pods on one network), never as N pods (lifecycle._prepare makes a provisioner for one machine only).
    several = req.nodes > 1
    group = several and target.cloud
    specs = layout(req, resolved.workdir) if several and not target.cloud else \
        [NodeSpec(r, node_workdir(resolved.workdir, r), None if group else prepared.ssh, "") for r in range(req.nodes)]
    # vast: the cluster with N machines is chosen before anything is recorded (none: one line, nothing made),
    # and the run's price is what those machines bill together (a higher --price is kept)
    chosen = find_cluster(resolved, req, len(specs)) if group and target.caps.overlays else None
    if chosen is not None:
        resolved = _priced(resolved, sum(o.price_per_hour_usd for o in chosen[1]), req.limits.price_per_hour_usd)
    record = job.labelled(record_for(resolved)).with_(launch=prepared.inputs, ssh=specs[0].ssh, nodes=tuple(
        NodeRecord(rank=s.rank, workdir=s.workdir, ssh=s.ssh) for s in specs[1:]))
    renting = group or prepared.provision is not None
    if resume is not None:  # the same run: its name, start, cost so far, nodes' folders and pinned keys
        before = {n.rank: n for n in resume.nodes}
        kept = tuple(before[n.rank].with_(pid=None, pid_ident=None, watchdog_pid=None, watchdog_ident=None)
                     if n.rank in before and before[n.rank].workdir == n.workdir else n for n in record.nodes)
        record = resume.with_(status="provisioning", pid=None, pid_ident=None, watchdog_pid=None,
                              watchdog_ident=None, ended_at=None, end_reason=None, message=None,
                              launcher=this_launcher(), limits=resolved.limits, nodes=kept,
                              ssh=None if renting else resume.ssh or specs[0].ssh)
    save(record)  # written before anything waits
    hosts: list[Host] = []
    try:
        if chosen is not None:  # vast.ai instances on one overlay network
            record, specs = rent_vast(prepared, record, specs, chosen, on_step=on_step, save=save)
        elif group:  # a RunPod Instant Cluster
            record, specs, members = _rent(prepared, record, specs, on_step=on_step, save=save)
            if members is not None:  # the budget and caps on what the members bill, not a catalogue price
                resolved = _priced(resolved, members, req.limits.price_per_hour_usd)
                record = record.with_(limits=resolved.limits)
                save(record)
        elif prepared.provision is not None:  # one pod
            # --price over the billed price is kept on a launch; a resume is priced at what its new pod bills
            stated = req.limits.price_per_hour_usd if resume is None else None
            record, resolved = _provision(prepared.provision, record, resolved, stated, on_step=on_step, save=save)
        record = record.with_(status="starting")
        save(record)
        for spec in specs:
            if spec.rank and spec.ssh is not None and spec.ssh.via is not None and record.ssh is not None:
                spec = dataclasses.replace(spec, ssh=dataclasses.replace(spec.ssh, via=record.ssh))  # primary pinned
                record = set_node(record, spec.rank, ssh=spec.ssh)
            node = record if spec.rank == 0 else as_run(record, record.nodes[spec.rank - 1])
            if several:
                on_step(f"node {spec.rank}: connecting to {spec.ssh or 'this machine'}")
            host = target.open(node)
            hosts.append(host)
            if node.ssh is not None and host.host_key:
                pinned = dataclasses.replace(node.ssh, host_key=host.host_key)
                record = record.with_(ssh=pinned) if spec.rank == 0 else set_node(record, spec.rank, ssh=pinned)
                save(record)
        if chosen is not None:  # no address variables there: each node's, read on its overlay interface
            specs = overlay_addresses(hosts, specs, req.nccl_ifname)
        elif group:  # the rendezvous is the PRIMARY_ADDR the nodes' own environment gives
            specs = cluster_addresses(hosts, specs)
        if several:  # one machine has no other to be compared with (its GPUs: the launch's own checks)
            record = _check(record, hosts, specs, prepared, on_step=on_step, on_warn=on_warn, on_info=on_info,
                            save=save)
        port, peers = _peers(hosts, specs, resolved, req) if several else (0, {})
        for spec, host in zip(specs, hosts, strict=True):
            env, watch = peers.get(spec.rank, (None, ()))
            if several:
                on_step(f"node {spec.rank}: starting")
            if cluster_of(record):
                # A RunPod cluster's member pod cannot be stopped on its own (it is managed through its
                # cluster), so its watchdog stops the run and gpucli deletes the cluster (down, watch). A
                # vast.ai instance on an overlay is an instance like any other: its own watchdog ends it
                # (--on-end) when the run is over or a peer is lost, with its CONTAINER_API_KEY.
                resolved = dataclasses.replace(resolved, provider="ssh")
            if spec.rank == 0:
                record = start_on(host, job, resolved, record, on_event=on_step, save=save, restore=restore,
                                  metrics=metrics, node_env=env, watch_args=watch)
                continue
            mine = dataclasses.replace(resolved, workdir=spec.workdir,
                                       data=resolved.data if own is not None else None, data_plan=None)

            def save_node(rr: RunRecord, rank: int = spec.rank) -> None:
                nonlocal record
                record = set_node(record, rank, pid=rr.pid, pid_ident=rr.pid_ident, watchdog_pid=rr.watchdog_pid,
                                   watchdog_ident=rr.watchdog_ident)
                save(record)

            start_on(host, job, mine, as_run(record, record.nodes[spec.rank - 1]), on_event=on_step,
                     save=save_node, node_env=env, watch_args=watch)
        if several:
            on_step(f"{len(specs)} nodes started; rendezvous on {specs[0].address}:{port}")
        _say_rented(record, on_info)
        return record
    except BaseException as exc:
        message = str(exc) if isinstance(exc, GpucliError) else f"{type(exc).__name__}: {exc}"
        record = latest[-1] if latest else record  # with the cluster's or overlay's and the machines' ids
        # Kept, a rule: the other nodes would wait for a rank that never comes. One machine's job is left
        # as its start left it (its watchdog told the start failed; `down` finds its recorded pids).
        ended = end_nodes(record, on_warn=on_warn) if record.nodes else []
        if end_rented(record, on_warn=on_warn):
            on_info(f"deleted the {rented_of(record)} of the failed launch")
        checked = getattr(exc, "preflight", None) or record.preflight  # a failed preflight's figures (run/starting/preflight.py)
        save(record.with_(status="failed", ended_at=runs.now_iso(), message=message[:500], preflight=checked))
        if ended:
            on_info(f"stopped the run on node {', '.join(map(str, ended))} of the failed launch")
        raise
    finally:
        for host in hosts:
            host.close()


def _provision(provision: Provisioner, record: RunRecord, resolved: ResolvedLaunch, stated: float | None, *,
               on_step: Callable[[str], None], save: Callable[[RunRecord], Any]) -> tuple[RunRecord, ResolvedLaunch]:
    """One pod rented: its id recorded the moment it exists (before any wait), its endpoint in the record,
    and the run priced at what the pod bills (budget, watchdog cap and cost records use it; ``stated``,
    a higher ``--price``, is kept)."""
    def on_created(instance_id: str) -> None:
        nonlocal record
        record = record.with_(instance_id=instance_id)
        save(record)

    provision = provision.with_workdir(resolved.workdir)  # vast: the instance's onstart runs its resume.sh
    started = record  # the record as this launch wrote it (saved before)
    ssh = provision(on_created=on_created, on_event=on_step, cancelled=lambda: ended_elsewhere(started, runs.load))
    billed = provision.billed_usd_per_hour
    if billed:
        resolved = _priced(resolved, billed, stated)
        record = record.with_(limits=resolved.limits)
    return record.with_(ssh=ssh), resolved


def _priced(resolved: ResolvedLaunch, billed: float, stated: float | None) -> ResolvedLaunch:
    """The run priced at what its machines bill per hour (budget, watchdog cap and cost records use it);
    a higher ``--price`` (``stated``) is kept."""
    return dataclasses.replace(resolved, limits=resolved.limits.with_(
        price_per_hour_usd=max(float(billed), float(stated or 0.0))))


def _check(record: RunRecord, hosts: list[Host], specs: list[NodeSpec], prepared: PreparedNodes, *,
           on_step: Callable[[str], None], on_warn: Callable[[str], None], on_info: Callable[[str], None],
           save: Callable[[RunRecord], Any]) -> RunRecord:
    """The nodes against each other before anything starts: distinct machines; on your own machines also
    equal GPUs, the NCCL interface, and the link between them measured (without ``--link-gbps``)."""
    resolved, req = prepared.resolved, prepared.request
    if get_target(resolved.provider).cloud:  # one cluster: its pods are identical and on its network by the provider's contract
        check_nodes(hosts, specs, 0, None)
        return record
    check_nodes(hosts, specs, resolved.n_gpus if resolved.gpu_id else 0, req.nccl_ifname)
    if req.link_gbps is None and all(s.ssh is not None for s in specs):  # your own machines
        record = measure_for_launch(record, hosts, specs, prepared, on_step=on_step, on_warn=on_warn, on_info=on_info)
        save(record)
    return record


def _peers(hosts: list[Host], specs: list[NodeSpec], resolved: ResolvedLaunch,
           req: LaunchRequest) -> tuple[int, dict[int, tuple[dict[str, str], tuple[str, ...]]]]:
    """The rendezvous port, and each rank's variables (rank 0's address and port, every node's) and its
    watchdog's watch of the others, with their shared secret written to every node's folder (a 0600 file,
    never a command line)."""
    port, peer_port = ports_for(resolved.name, resolved.provider)
    gpus = resolved.n_gpus if resolved.gpu_id else 0
    token = secrets.token_hex(16)
    out: dict[int, tuple[dict[str, str], tuple[str, ...]]] = {}
    for spec, host in zip(specs, hosts, strict=True):
        host.run(f"mkdir -p -- {shlex.quote(spec.workdir)}", timeout_s=60)
        host.write_file(f"{spec.workdir}/peer.token", token.encode(), mode=0o600)
        # resolved.provider: a cluster's nodes start as "ssh" hosts; their variables are its provider's
        env = node_env(specs, spec.rank, gpus, port, resolved.provider, req.nccl_ifname)
        out[spec.rank] = (env, ("--nodes", str(len(specs)), "--node-rank", str(spec.rank),
                                "--peer-addr", f"{specs[0].address}:{peer_port}",
                                # a node silent for the stall window is lost (a crash is told at once)
                                "--peer-timeout-s", f"{(resolved.limits.stall_minutes or 30) * 60:g}",
                                "--peer-token-file", "../peer.token"))
    return port, out


def _say_rented(record: RunRecord, on_info: Callable[[str], None]) -> None:
    """What was rented as one bills until this machine deletes it: how, in one line."""
    rented = rented_of(record)
    if not rented:
        return
    pid = start_watcher(record.name)
    watcher = f"a watcher here (pid {pid}, log {watcher_log(record.name)}) deletes it when the run is " \
              "over, as does" if pid else "no watcher could start here; it is deleted by"
    also = "any `gpucli ls` or `gpucli status` that sees the run over, or " if cluster_of(record) else ""
    why = ("RunPod lets no pod end its cluster" if cluster_of(record) else
           "each instance's watchdog ends its own instance when the run is over; the overlay is "
           "deleted from here")
    what = rented if cluster_of(record) else f"vast.ai overlay {overlay_of(record) or record.inputs.overlay_name}"
    on_info(f"{what} bills until this machine deletes it ({why}): {watcher} {also}"
            f"`gpucli down {record.name}`; with this machine off it bills until one of them runs")


def _tracking(save: Callable[[RunRecord], Any], latest: list[RunRecord]) -> Callable[[RunRecord], Any]:
    def keep(record: RunRecord) -> Any:
        latest[:] = [record]
        return save(record)
    return keep


def set_node(record: RunRecord, rank: int, **changes: Any) -> RunRecord:
    nodes = list(record.nodes)
    nodes[rank - 1] = nodes[rank - 1].with_(**changes)
    return record.with_(nodes=tuple(nodes))


def rented_of(record: RunRecord) -> str | None:
    """What a run's nodes were rented as, in words (None: nothing rented as one)."""
    if cluster_of(record):
        return f"cluster {cluster_of(record)}"
    overlay = overlay_of(record) or record.inputs.overlay_name
    if overlay:
        return f"vast.ai overlay {overlay} with every instance on it"
    return None


def _rent(prepared: PreparedNodes, record: RunRecord, specs: list[NodeSpec], *, on_step: Callable[[str], None],
          save: Callable[[RunRecord], Any]) -> tuple[RunRecord, list[NodeSpec], float | None]:
    """Rent the nodes as one RunPod Instant Cluster; the cluster's and every pod's id are in the record
    before anything waits on them. Also returns what the members bill per hour together (None: unknown)."""
    resolved, req = prepared.resolved, prepared.request
    target = get_target(resolved.provider)
    key, pub = ssh_keypair()
    client = clusters_client()

    def on_cluster(cluster_id: str) -> None:
        nonlocal record
        record = record.with_(launch=record.inputs.with_(cluster_id=cluster_id))
        save(record)

    def on_pods(pods: list[Any]) -> None:
        nonlocal record
        by_rank = {p.rank: p.pod_id for p in pods if p.rank is not None}
        new = record.with_(instance_id=by_rank.get(0, record.instance_id), nodes=tuple(
            n.with_(instance_id=by_rank.get(n.rank, n.instance_id)) for n in record.nodes))
        if new != record:
            record = new
            save(record)

    if resolved.gpu_id is None:
        raise UsageError("a RunPod Instant Cluster rents GPU machines, and this launch names no GPU")
    gpu_type = gpu_type_id(load_catalog(), resolved.gpu_id)
    disk_gb = req.disk_gb or resolved.pod_disk_gb
    try:
        # The nodes' run folders on a network volume attached at create, not on the container disk that a
        # restart wipes (network-volumes.mdx L112; openapi BaseContainerConfig.disk): --volume's, else one
        # named after the run. It stays after the run, holding the checkpoints, until the user deletes it.
        volume = target.cluster_volume(req.volume or resolved.label,
                                       size_gb=req.volume_size_gb or (None if req.volume else disk_gb),
                                       gpu_type=gpu_type, gpus_per_pod=resolved.n_gpus,
                                       volume_id=record.inputs.volume.id if record.inputs.volume is not None else None)
        record = record.with_(launch=record.inputs.with_(volume=KeptVolume.from_dict(volume.to_json())))
        save(record)  # its id recorded before the cluster is asked for
        monthly = f"${volume.usd_per_month:.2f}/month" if volume.usd_per_month is not None else "its monthly price"
        on_step(f"network volume {volume.name} ({volume.volume_id}, {volume.size_gb} GB in {volume.data_center_id}"
                f"{', created' if volume.created else ''}): the nodes' run folders at {volume_mount()}; it bills "
                f"{monthly} and is kept after the run")
        try:
            _, rented = rent_cluster(
                client, name=resolved.label, gpu_type=gpu_type,
                gpus_per_pod=resolved.n_gpus, nodes=len(specs), image=req.image or target.default_image,
                disk_gb=disk_gb, public_key=pub,
                ready_timeout_s=req.ready_timeout_s or DEFAULTS.ready_timeout_s, poll_s=provider_poll_s(),
                on_cluster=on_cluster, on_pods=on_pods, on_event=on_step, volume=volume, mount_path=volume_mount())
        except GpucliError as exc:
            if volume.created:  # kept (it may hold data already): what it bills and how to delete it, in the error
                exc.message = f"{exc.message}; {created_volume_note(volume)}"
            raise
    finally:
        client.close()
    user = pod_ssh_user() or "root"
    primary = SshTarget(host=rented[0].ssh_host or "", port=rented[0].ssh_port or 22, user=user, identity_file=str(key))
    specs = [NodeSpec(n.rank, specs[n.rank].workdir, SshTarget(host=n.ssh_host, port=n.ssh_port or 22, user=user,
                                                                identity_file=str(key))
                      if n.ssh_host else  # a worker with no endpoint of its own: its sshd, through the primary
                      SshTarget(host=n.ip, port=cluster_ssh_port(), user=user, identity_file=str(key), via=primary),
                      n.ip) for n in rented]
    record = record.with_(ssh=specs[0].ssh, nodes=tuple(
        n.with_(ssh=specs[n.rank].ssh) for n in record.nodes))
    save(record)
    return record, specs, billed_usd_per_hour(rented)


CLUSTER_STRAY = "runpod-cluster"  # the provider name a stray cluster is listed under


def stray_clusters(owned_runs: list[RunRecord]) -> list[Any]:
    """gpucli-named RunPod clusters that no active run holds, as ``Stray`` rows (none without a key)."""
    owned = {c for r in owned_runs if r.active and (c := cluster_of(r))}
    try:
        client = clusters_client()
    except MissingKeyError:
        return []
    try:
        return [Stray(CLUSTER_STRAY, cid, name, f"cluster of {pods} pods", None)
                for cid, name, pods in cluster_strays(client, owned)]
    finally:
        client.close()


def end_stray_cluster(cluster_id: str, provider: str = CLUSTER_STRAY) -> None:
    if provider != CLUSTER_STRAY:  # a vast.ai overlay (run/overlayrent.py)
        end_stray_overlay(cluster_id)
        return
    client = clusters_client()
    try:
        end_cluster(client, cluster_id, lambda m: None)
    finally:
        client.close()


def end_nodes(record: RunRecord, *, on_warn: WarnFn, ranks: Sequence[int] | None = None) -> list[int]:
    """Stop the watchdog and the trainer on every node that has them (or those in ``ranks``), each
    only while its pid is still the process recorded; returns the ranks where something was stopped."""
    ended = []
    for rank, node in members(record):
        if (ranks is not None and rank not in ranks) or not (node.pid or node.watchdog_pid):
            continue
        try:
            with open_host(node, connect_timeout_s=15) as host:
                if node.watchdog_pid:
                    procs.signal(host, node, node.watchdog_pid, node.watchdog_ident, "TERM")
                if stop_trainer(host, node, timeout_s=60):
                    ended.append(rank)
        except GpucliError as exc:
            on_warn(f"node {rank}: could not stop the run there: {exc}")
    return ended


@dataclass(frozen=True)
class NodeStatus:
    rank: int
    where: str
    state: str  # running | ended | unreachable | not started
    gpus: int
    step: int | None
    heartbeat_age_s: float | None  # since the node's watchdog last wrote (it writes each poll)
    detail: str | None = None


def node_statuses(record: RunRecord) -> list[NodeStatus]:
    """Each node's state, GPUs, its ranks' step (rank 0's metrics: every rank steps together) and the
    age of its watchdog's last heartbeat (watchdog.log)."""
    out = []
    step = None
    for rank, node in members(record):
        where = str(node.ssh) if node.ssh else f"this machine ({node.workdir})"
        if not node.pid:
            out.append(NodeStatus(rank, where, "not started", record.n_gpus, None, None))
            continue
        try:
            with open_host(node, connect_timeout_s=10) as host:
                alive = trainer_alive(host, node)
                if rank == 0:
                    step = status_of(host, node).step
                files = host.list_files(node.workdir)
                beats = [f.mtime for name, f in files.items() if name in ("watchdog.json", "watchdog.log")]
                age = max(0.0, time.time() - max(beats)) if beats else None  # watchdog.json: each poll
        except GpucliError as exc:
            out.append(NodeStatus(rank, where, "unreachable", record.n_gpus, None, None, str(exc)[:120]))
            continue
        out.append(NodeStatus(rank, where, "running" if alive else "ended", record.n_gpus, step, age))
    return out
