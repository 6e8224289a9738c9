"""The options of a launch of several machines across providers (``--provider any --nodes N``): what each
named provider can rent as one unit of N machines, quoted on the whole run, and the check that a failed
attempt left nothing of it.

- RunPod: one Instant Cluster of N pods of the profile's GPU (gpucli/providers/runpod/clusterrent.py).
  No route quotes a cluster before it is created (openapi tag Clusters has create, list, pods and
  delete only), so it is quoted on the cheapest Secure Cloud listing of that GPU type (an Instant
  Cluster runs in one of RunPod's own data centres: instant-clusters.mdx, ``dataCenterIds``), N times;
  once rented, the members' billed ``cost`` replaces the quote (openapi Pod: "the rate actually billed").
- vast.ai: N instances of one physical cluster on an overlay network, one option per cluster with N
  machines of the profile's GPUs (gpucli/providers/vast/overlayrent.py), quoted on the N offers' prices
  (``dph_total``) and the bandwidth they bill; the attempt is held to its cluster (``cluster_id=ID``,
  the docs' own search: multi-node-training-using-torch-nccl.mdx).

An attempt is the multi-node launch as one provider does it (gpucli/run/starting/multinode.py): whatever it
rented is ended there when it fails; :func:`confirm_gone` asks the provider before the next one starts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucli.errors import GpucliError, NoCapacityError, ProviderError, UsageError
from gpucli.providers.api import InstanceNotFound
from gpucli.providers.clients import get_provider
from gpucli.providers.cloudtarget import run_cost
from gpucli.providers.clusterend import cluster_of
from gpucli.providers.registry import get_target
from gpucli.providers.runpod.clusterrent import ClusterNotReady, clusters_client, end_cluster, gpu_type_id
from gpucli.providers.runpod.clusters import ClusterRefused
from gpucli.providers.vast.cluster import OverlayNotReady, VastOverlays
from gpucli.providers.vast.overlayrent import cluster_choices, end_vast, overlay_of
from gpucli.runs.records import RunRecord

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog
    from gpucli.providers.api import Offer
    from gpucli.run.inputs.launch import LaunchRequest, ResolvedLaunch

#: A rental of N machines that failed with nothing of it left (each rental ends what it made before it
#: raises): the next option, on either provider, may work.
RENT_FAILED = (ClusterRefused, ClusterNotReady, OverlayNotReady)
RUNPOD_LISTINGS = 50  # the RunPod listings read to find the GPU type's cheapest Secure Cloud one


@dataclass(frozen=True)
class NodesOption:
    """N machines of one provider, rented as one unit."""

    provider: str
    offers: tuple[Offer, ...]  # one per node (RunPod: the listing the cluster is quoted on, for each)
    hourly_usd: float  # every node together
    cost_usd: float  # the whole run on every node: planned hours at the hourly price, plus bandwidth
    cluster_id: str | None = None  # vast.ai: the physical cluster the attempt is held to

    @property
    def option_id(self) -> str:
        return self.cluster_id or f"{self.offers[0].gpu_name} cluster"

    @property
    def label(self) -> str:
        n = len(self.offers)
        if self.cluster_id is not None:
            return f"overlay of {n} instances on cluster {self.cluster_id}"
        return f"Instant Cluster of {n} pods"

    def request(self, req: LaunchRequest) -> LaunchRequest:
        """The launch request of this option's attempt."""
        if self.cluster_id is None:
            return dataclasses.replace(req, provider=self.provider)
        held = f"cluster_id={self.cluster_id}"
        return dataclasses.replace(req, provider=self.provider, query=f"{req.query} {held}" if req.query else held)


def _total(offers: tuple[Offer, ...], hours: float | None, transfer_gb: tuple[float, float]) -> float:
    """Every node's run cost; the run's planned bytes shared evenly between the nodes."""
    share = (transfer_gb[0] / len(offers), transfer_gb[1] / len(offers))
    return sum(run_cost(o, spot=False, hours=hours, transfer_gb=share) for o in offers)


def options(catalog: Catalog, req: LaunchRequest, resolved: ResolvedLaunch, *, hours: float | None,
            transfer_gb: tuple[float, float], limit: int) -> list[NodesOption]:
    """What ``req.provider`` can rent as ``req.nodes`` machines for this run, cheapest first; a
    :class:`NoCapacityError` (one line) when it can do none."""
    target = get_target(req.provider)
    if resolved.gpu_id is None:
        raise UsageError(f"profile {req.profile} has no GPU; cloud machines need a GPU profile")
    nodes = req.nodes
    if target.caps.overlays:
        found = []
        for cid, offers in cluster_choices(resolved, req, nodes)[:limit]:
            picked = tuple(offers)
            found.append(NodesOption(req.provider, picked, sum(o.price_per_hour_usd for o in picked),
                                     _total(picked, hours, transfer_gb), cluster_id=cid))
        return found
    if not target.caps.clusters:
        raise NoCapacityError(f"{req.provider} rents no {nodes} machines as one")
    try:
        gpu_type_id(catalog, resolved.gpu_id)
    except UsageError as exc:  # this GPU is not RunPod's: another provider may have it
        raise NoCapacityError(str(exc)) from None
    listed = target.choose_offers(catalog, resolved.gpu_id, resolved.n_gpus, spot=False,
                                  limit=RUNPOD_LISTINGS, disk_gb=req.disk_gb or resolved.pod_disk_gb,
                                  hours=hours, query=req.query)
    secure = sorted((o for o in listed if o.cloud_type == "SECURE"), key=lambda o: o.price_per_hour_usd)
    if not secure:
        raise NoCapacityError(f"no RunPod Secure Cloud listing of {resolved.n_gpus}x {resolved.gpu_name} to quote "
                              f"an Instant Cluster of {nodes} pods on")
    picked = (secure[0],) * nodes
    return [NodesOption(req.provider, picked, secure[0].price_per_hour_usd * nodes, _total(picked, hours, transfer_gb))]


def _vast_left(record: RunRecord) -> list[str]:
    """What vast.ai still has of the run's overlay: its instances it still lists, and the overlay."""
    client = get_provider("vast")
    left = []
    for iid in [i for i in [record.instance_id, *(n.instance_id for n in record.nodes)] if i]:
        try:
            client.get(iid)
        except InstanceNotFound:
            continue  # vast says it is gone
        left.append(f"instance {iid}")
    overlay_id, name = overlay_of(record), record.inputs.overlay_name
    if any(o.overlay_id == overlay_id or (name and o.name == name) for o in VastOverlays(client).list()):  # type: ignore[arg-type]
        left.append(f"overlay {overlay_id or name}")
    return left


def confirm_gone(record: RunRecord) -> None:
    """Everything the failed attempt rented is gone by its provider's word (ended again where it is
    not), or the launch stops here: no other option is tried while something may bill."""
    try:
        cid = cluster_of(record)
        if cid:
            client = clusters_client()
            try:
                if client.pods(cid) is not None:  # None only for v2's own 404: the cluster is gone
                    end_cluster(client, cid, lambda text: None)
                    if client.pods(cid) is not None:
                        raise ProviderError(f"RunPod cluster {cid} is still listed after its delete")
            finally:
                client.close()
        if overlay_of(record) or record.inputs.overlay_name:
            if _vast_left(record):
                end_vast(record)
                left = _vast_left(record)
                if left:
                    raise ProviderError(f"vast.ai still has {', '.join(left)} after ending it")
    except GpucliError as exc:
        raise ProviderError(f"the failed attempt of {record.name} may still bill: {str(exc).splitlines()[0]}",
                            hint=f"end it with `gpucli down {record.name}` or `gpucli down --strays`; "
                                 "no other option was tried") from None
