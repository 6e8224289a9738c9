"""Renting the machines of a multi-node run as one unit: a RunPod Instant Cluster (gpucli.providers.runpod.clusters).

Money first: the cluster's id goes into the run record the moment RunPod returns it, and every member
pod's id as soon as it is listed, before anything waits; a cluster whose N pods are not all RUNNING
with SSH within the ready timeout, or any of whose pods fails, is deleted whole (RunPod's DELETE ends
every member); a create whose answer was lost is found again by its name (``gpucli-<run>``) and
deleted. Ending the run deletes the cluster (``gpucli down``; ``down --strays`` finds gpucli-named
clusters no run owns).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError, ProviderError, UsageError
from gpucli.providers.api import LABEL_PREFIX
from gpucli.providers.credentials import resolve_key
from gpucli.providers.http import RequestMaybeSent
from gpucli.providers.runpod.clusters import RunPodClusters

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.providers.runpod.api import RunPodProvider
    from gpucli.providers.runpod.clusters import ClusterPod, RunPodClusters
    from gpucli.providers.runpod.v2 import NetworkVolume
    from gpucli.runs.nodespec import NodeSpec

#: The container's own environment, where RunPod puts a cluster's variables (SSH sessions do not get
#: them); an emulator names its file in GPUCLI_POD_ENVIRON, as the pod-side watchdog reads it (podend.py).
ENVIRON_COMMAND = 'tr "\\0" "\\n" < "${GPUCLI_POD_ENVIRON:-/proc/1/environ}"'


class ClusterNotReady(ProviderError):
    """The cluster did not come up whole within the ready timeout (it has been deleted)."""


@dataclass(frozen=True)
class RentedNode:
    rank: int
    pod_id: str
    ip: str  # its address on the cluster's network (openapi PodCluster.ip)
    ssh_host: str | None  # its own SSH endpoint (ssh.direct); None: reached through the primary
    ssh_port: int | None
    cost_per_hour: float | None = None  # the member's billed ``cost`` (openapi Pod: "the rate actually billed")


def clusters_client() -> RunPodClusters:
    return RunPodClusters(resolve_key("runpod").value)


def gpu_type_id(catalog: Any, gpu_id: str) -> str:
    gpu = catalog.gpus[gpu_id]
    if not gpu.runpod_ids:
        raise UsageError(f"{gpu.name} is not offered in RunPod Instant Clusters (no RunPod id in the catalogue)")
    return str(gpu.runpod_ids[0])


def rent_cluster(client: RunPodClusters, *, name: str, gpu_type: str, gpus_per_pod: int, nodes: int, image: str,
                 disk_gb: int, public_key: str, ready_timeout_s: float, poll_s: float,
                 on_cluster: Callable[[str], None], on_pods: Callable[[list[ClusterPod]], None],
                 on_event: Callable[[str], None], sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, volume: NetworkVolume | None = None,
                 mount_path: str = "/workspace") -> tuple[str, list[RentedNode]]:
    """Create the cluster and wait until all ``nodes`` pods are up; (cluster id, nodes by rank). Whatever
    this call created is deleted before an error leaves it."""
    cluster_id = None
    try:
        on_event(f"creating a RunPod Instant Cluster {name}: {nodes} x {gpus_per_pod}x {gpu_type}")
        try:
            cluster_id = client.create(
                name=name, gpu_type_id=gpu_type, gpus_per_pod=gpus_per_pod, pods=nodes, image=image,
                disk_gb=disk_gb, public_key=public_key, mount_path=mount_path,
                volume_id=volume.volume_id if volume is not None else None,
                # the volume's data centre: a network volume mounts only on pods there (network-volumes.mdx)
                data_centers=(volume.data_center_id,) if volume is not None and volume.data_center_id else ())
        except RequestMaybeSent:
            end_named(client, name)  # the answer was lost: the cluster may exist; it must not bill
            raise
        on_cluster(cluster_id)
        deadline = clock() + ready_timeout_s
        while True:
            pods = client.pods(cluster_id)
            if pods is None:
                raise ProviderError(f"RunPod cluster {cluster_id} disappeared while starting")
            if pods:
                on_pods(pods)
            bad = [p for p in pods if p.status in ("EXITED", "ERROR", "TERMINATED")]
            if bad:
                raise ProviderError(f"pod {bad[0].pod_id} of cluster {cluster_id} is {bad[0].status}")
            ready = [p for p in pods if p.ready]
            # whole when every member is RUNNING with its rank and address and the primary (rank 0) has
            # its SSH endpoint; workers without one are reached through it (RentedNode.ssh_host None)
            primary_ssh = any(p.rank == 0 and p.ssh_host and p.ssh_port for p in ready)
            if len(ready) == nodes and primary_ssh and sorted(int(p.rank or 0) for p in ready) == list(range(nodes)):
                return cluster_id, sorted((RentedNode(p.rank or 0, p.pod_id, p.ip or "", p.ssh_host,
                                                      p.ssh_port, p.cost_per_hour) for p in ready),
                                          key=lambda n: n.rank)
            if clock() >= deadline:
                raise ClusterNotReady(f"RunPod cluster {cluster_id}: {len(ready)} of {nodes} pods ready after "
                                      f"{ready_timeout_s:g} s; deleted", hint="try again, or fewer nodes")
            sleep(poll_s)
    except BaseException:
        if cluster_id is not None:
            end_cluster(client, cluster_id, on_event)
        raise


def end_cluster(client: RunPodClusters, cluster_id: str, on_event: Callable[[str], None]) -> None:
    """Delete the cluster (every member pod with it), retried once; an error says what still bills."""
    for attempt in (1, 2):
        try:
            client.delete(cluster_id)
            on_event(f"deleted RunPod cluster {cluster_id} (every pod of it)")
            return
        except GpucliError as exc:
            if attempt == 2:
                raise ProviderError(f"could not delete RunPod cluster {cluster_id}: {exc}; it may still bill",
                                    hint="`gpucli down --strays` or the RunPod console ends it") from None


def end_named(client: RunPodClusters, name: str) -> list[str]:
    """Delete every cluster called ``name`` (a create whose answer never came back)."""
    ended = []
    for c in client.list():
        if c.name == name:
            client.delete(c.cluster_id)
            ended.append(c.cluster_id)
    return ended


def cluster_strays(client: RunPodClusters, owned: set[str]) -> list[tuple[str, str, int]]:
    """(id, name, pods) of gpucli-named clusters whose id no active run holds."""
    return [(c.cluster_id, c.name, c.pods) for c in client.list()
            if c.name.startswith(LABEL_PREFIX) and c.cluster_id not in owned]


def billed_usd_per_hour(nodes: list[RentedNode]) -> float | None:
    """What the cluster bills per hour: the sum of its members' billed ``cost`` (a catalogue ``price`` is a
    list price per GPU, "the rate actually billed ... is ``cost`` on the pod", openapi GpuType); None when
    a member does not say."""
    costs = [n.cost_per_hour for n in nodes]
    return None if not costs or any(c is None or c <= 0 for c in costs) else round(sum(c or 0.0 for c in costs), 6)


def cluster_addresses(hosts: Sequence[Host], specs: list[NodeSpec]) -> list[NodeSpec]:
    """The nodes' addresses as the cluster's own variables give them, read on each node: rank 0's (the
    rendezvous) is ``PRIMARY_ADDR`` (``MASTER_ADDR`` when absent), every other node's its ``NODE_ADDR``
    (runpod/docs instant-clusters/configuration.mdx: PRIMARY_ADDR/MASTER_ADDR "the address of the primary
    node", on ens1, which inter-node traffic must use; NODE_RANK, NUM_NODES). The API's ``cluster.ip`` is
    an overlay address (openapi PodCluster.ip: "address on the cluster's private overlay network") that
    the docs never name for rendezvous, so it is used only for a node whose NODE_ADDR is missing. A node
    whose NODE_RANK is not the rank the API gave it, or nodes that disagree on the primary, are refused
    in one line before anything starts."""
    primaries: dict[str, int] = {}
    out = []
    for spec, host in zip(specs, hosts, strict=True):
        res = host.run(ENVIRON_COMMAND, timeout_s=60, check=False)
        env = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        primary = (env.get("PRIMARY_ADDR") or env.get("MASTER_ADDR") or "").strip()
        if not primary:
            raise ProviderError(f"node {spec.rank} of the cluster has neither PRIMARY_ADDR nor MASTER_ADDR in its "
                                "environment", hint="RunPod sets them on every cluster node; nothing was started")
        if env.get("NODE_RANK", str(spec.rank)).strip() != str(spec.rank):
            raise ProviderError(f"node {spec.rank} of the cluster says NODE_RANK={env.get('NODE_RANK')}; "
                                f"the API gave it rank {spec.rank}", hint="nothing was started")
        primaries.setdefault(primary, spec.rank)
        address = primary if spec.rank == 0 else ((env.get("NODE_ADDR") or "").strip() or spec.address)
        out.append(dataclasses.replace(spec, address=address))
    if len(primaries) > 1:
        raise ProviderError("the cluster's nodes name different primaries (PRIMARY_ADDR: "
                            f"{', '.join(f'{a} on node {r}' for a, r in primaries.items())})", hint="nothing was started")
    return out


def cluster_volume(client: RunPodProvider, name_or_id: str, *, size_gb: int | None, gpu_type: str, gpus_per_pod: int,
                   volume_id: str | None = None) -> NetworkVolume:
    """The network volume the cluster's nodes mount at /workspace (their run folders and checkpoints on
    it, kept when the cluster is deleted): ``volume_id`` (a resume: the one the run used) while it
    exists, else the account's volume of that name or id, else, with ``size_gb``, one created in the
    Secure Cloud data centre with the most ``gpus_per_pod`` x ``gpu_type`` free (network volumes are
    Secure Cloud only, network-volumes.mdx L98) and marked ``created``."""
    if volume_id is not None:
        known = next((v for v in client.network_volumes() if v.volume_id == volume_id), None)
        if known is not None:
            return known
    try:
        return client.find_volume(name_or_id)
    except UsageError:
        if size_gb is None:
            raise
    dc = client.data_center_for(gpu_type, gpus_per_pod)
    return dataclasses.replace(client.create_volume(name_or_id, size_gb, dc), created=True)
