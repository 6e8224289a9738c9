"""Renting the machines of a multi-node run on vast.ai: N instances of one physical cluster on an
overlay network (gpucli.providers.vast.cluster has the routes and the sources).

Money first: the overlay's id goes into the run record the moment vast lists it, and each instance's
id the moment its create answers (rank 0's in ``instance_id``, the others' in their node), before any
join or wait; anything that fails ends every instance and then the overlay. The run's record names the
overlay (``launch.overlay_id``), so ``down``, ``watch`` and a failed launch end all of it and
``down --strays`` finds gpucli-named overlays no run owns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gpucli.errors import NoCapacityError, ProviderError, UsageError
from gpucli.plan.catalog import load_catalog
from gpucli.providers.api import LABEL_PREFIX, LaunchSpec, Offer
from gpucli.providers.clients import get_provider
from gpucli.providers.cloudtarget import ssh_keypair
from gpucli.providers.credentials import MissingKeyError
from gpucli.providers.query import parse_query
from gpucli.providers.registry import Stray, get_target
from gpucli.providers.vast.cluster import (
    OVERLAY_IFNAME,
    VastOverlays,
    address_command,
    choose_cluster,
    cluster_offers,
    end_overlay,
    overlay_name,
    overlay_strays,
    parse_address,
    rent_overlay,
)
from gpucli.providers.vast.target import launch_filters, rental_hours
from gpucli.runs.defaults import DEFAULTS
from gpucli.runs.nodespec import NodeSpec, NodesPrepared, NodesRequest, NodesResolved
from gpucli.runs.records import RunRecord
from gpucli.settings import pod_ssh_user, provider_poll_s
from gpucli.ssh import SshTarget

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.providers.vast.api import VastProvider

OVERLAY_STRAY = "vast-overlay"  # the provider name a stray overlay is listed under


def overlay_of(record: RunRecord) -> str | None:
    """The id of the vast.ai overlay a run's nodes were rented on (None: not one, or not known yet)."""
    return record.inputs.overlay_id or None


def _client() -> VastProvider:
    return get_provider("vast")  # type: ignore[return-value]


def _planned_hours(resolved: NodesResolved) -> float | None:
    known = [h for h in (resolved.planned.hours, resolved.limits.max_hours) if h]  # as lifecycle.offer_ask
    return min(known) if known else None


def _offers_by_cluster(resolved: NodesResolved, req: NodesRequest, client: VastProvider | None) -> dict[str, list[Offer]]:
    """Offers of the profile's GPUs on machines of a physical cluster, by cluster id. A ``cluster_id=ID``
    in ``--query`` holds the search to that cluster (how one option of a ranking across providers is
    rented: gpucli/run/life/failnodes.py)."""
    if resolved.gpu_id is None:
        raise UsageError("--nodes on vast.ai rents GPU machines, and this launch names no GPU")
    gpu = load_catalog().gpus[resolved.gpu_id]
    target = get_target("vast")
    disk = req.disk_gb or resolved.pod_disk_gb
    client = client or _client()
    by_cluster: dict[str, list[Offer]] = {}
    for vname in gpu.vast_names or (gpu.name,):
        q = parse_query(f"gpu_name={vname.replace(' ', '_')} num_gpus={resolved.n_gpus} "
                        + launch_filters(disk, target.min_cuda, req.query,
                                         hours=rental_hours(_planned_hours(resolved))))
        for cid, offers in cluster_offers(client, q, disk_gb=disk).items():
            by_cluster.setdefault(cid, []).extend(o for o in offers if o.gpu_count == resolved.n_gpus)
    return by_cluster


def _what(resolved: NodesResolved) -> str:
    return f"{resolved.n_gpus}x {load_catalog().gpus[str(resolved.gpu_id)].name}"


def find_cluster(resolved: NodesResolved, req: NodesRequest, nodes: int, client: VastProvider | None = None) -> tuple[str, list[Offer]]:
    """The cluster and its ``nodes`` offers (one per machine) with the profile's GPUs each; one line
    when no cluster has that many."""
    return choose_cluster(_offers_by_cluster(resolved, req, client), nodes, _what(resolved))


def cluster_choices(resolved: NodesResolved, req: NodesRequest, nodes: int,
                    client: VastProvider | None = None) -> list[tuple[str, list[Offer]]]:
    """Every cluster with ``nodes`` machines of the profile's GPUs, each with its cheapest ``nodes``
    offers, cheapest per hour first; the one line of :func:`choose_cluster` when none has that many."""
    by_cluster = _offers_by_cluster(resolved, req, client)
    found = []
    for cid, offers in by_cluster.items():
        try:
            found.append(choose_cluster({cid: offers}, nodes, ""))
        except NoCapacityError:
            continue
    if not found:
        choose_cluster(by_cluster, nodes, _what(resolved))  # raises the one line: the most in one cluster
    return sorted(found, key=lambda c: sum(o.price_per_hour_usd for o in c[1]))


def rent_vast(prepared: NodesPrepared, record: RunRecord, specs: list[NodeSpec], chosen: tuple[str, list[Offer]], *,
              on_step: Callable[[str], None], save: Callable[[RunRecord], Any]) -> tuple[RunRecord, list[NodeSpec]]:
    """Rent the nodes on one overlay over the ``chosen`` cluster's offers (find_cluster); the record has
    the overlay's and every instance's id before anything waits on them. The nodes' addresses are read
    once they are connected (overlay_addresses)."""
    resolved, req = prepared.resolved, prepared.request
    key, pub = ssh_keypair()
    client = _client()
    cluster_id, offers = chosen
    name = overlay_name(resolved.label)
    record = record.with_(launch=record.inputs.with_(vast_cluster_id=str(cluster_id), overlay_name=name))
    save(record)
    image = req.image or get_target("vast").default_image

    def spec(rank: int, offer: Offer) -> LaunchSpec:
        return LaunchSpec(name=resolved.name if rank == 0 else f"{resolved.name}-node{rank}",
                          gpu_name=offer.gpu_name, gpu_count=resolved.n_gpus, image=image,
                          disk_gb=req.disk_gb or resolved.pod_disk_gb, ssh_public_key=pub, offer_id=offer.offer_id)

    def on_overlay(overlay_id: str) -> None:
        nonlocal record
        record = record.with_(launch=record.inputs.with_(overlay_id=str(overlay_id)))
        save(record)

    def on_instance(rank: int, instance_id: str) -> None:
        nonlocal record
        record = record.with_(instance_id=instance_id) if rank == 0 else \
            record.with_(nodes=tuple(n.with_(instance_id=instance_id) if n.rank == rank else n
                                     for n in record.nodes))
        save(record)

    _, rented = rent_overlay(client, VastOverlays(client), name=name, cluster_id=cluster_id, offers=offers,
                             spec=spec, ready_timeout_s=req.ready_timeout_s or DEFAULTS.ready_timeout_s,
                             poll_s=provider_poll_s(), on_overlay=on_overlay, on_instance=on_instance,
                             on_event=on_step)
    specs = [NodeSpec(n.rank, specs[n.rank].workdir, SshTarget(host=n.ssh_host, port=n.ssh_port,
                                                                user=pod_ssh_user() or "root", identity_file=str(key)),
                      "") for n in rented]
    record = record.with_(ssh=specs[0].ssh, nodes=tuple(n.with_(ssh=specs[n.rank].ssh) for n in record.nodes))
    save(record)
    return record, specs


def overlay_addresses(hosts: Sequence[Host], specs: list[NodeSpec], ifname: str | None) -> list[NodeSpec]:
    """Each node's address on the overlay interface, read over SSH (vast has no rank or address
    variables); a node without one is refused in one line before anything starts."""
    iface = ifname or OVERLAY_IFNAME
    out = []
    for spec, host in zip(specs, hosts, strict=True):
        res = host.run(address_command(iface), timeout_s=60, check=False)
        addr = parse_address(res.stdout)
        if addr is None:
            raise ProviderError(f"node {spec.rank}: no IPv4 address on the overlay interface {iface}",
                                hint="the instance is not on the overlay network; nothing was started")
        out.append(dataclasses.replace(spec, address=addr))
    return out


def end_vast(record: RunRecord) -> bool:
    """Destroy every instance of the run and delete its overlay; whether it had one."""
    overlay_id, name = overlay_of(record), record.inputs.overlay_name
    if overlay_id is None and not name:
        return False
    ids = [i for i in [record.instance_id, *(n.instance_id for n in record.nodes)] if i]
    client = _client()
    overlays = VastOverlays(client)
    if overlay_id is None:  # a create whose answer was lost and not found then: look for it by its name
        found = overlays.find(str(name))
        overlay_id = found.overlay_id if found is not None else None
    end_overlay(client, overlays, ids, overlay_id)
    return True


def stray_overlays(owned_runs: list[RunRecord]) -> list[Stray]:
    owned = {o for r in owned_runs if r.active and (o := overlay_of(r))}
    client = _client()
    try:
        found = overlay_strays(VastOverlays(client), LABEL_PREFIX, owned)
    except MissingKeyError:  # no vast key: no overlay of ours can be there
        return []
    return [Stray(OVERLAY_STRAY, o.overlay_id, o.name, f"overlay on cluster {o.cluster_id}, "
                  f"{len(o.instances)} instances", None) for o in found]


def end_stray_overlay(overlay_id: str) -> None:
    """Destroy the overlay's gpucli-labelled members (an orphan's), then the overlay."""
    client = _client()
    overlays = VastOverlays(client)
    members = next((o.instances for o in overlays.list() if o.overlay_id == overlay_id), ())
    mine = {i.instance_id for i in client.list_instances()}  # gpucli-labelled ones only
    end_overlay(client, overlays, [i for i in members if i in mine], overlay_id)
