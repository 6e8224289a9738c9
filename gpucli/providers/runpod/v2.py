"""RunPod REST API v2: the shapes gpucli reads and writes, and RunPod's published storage prices.

The only place RunPod's raw dicts are read. Sources (runpod/docs, snapshot 2026-08-20):

* ``api-reference-v2/openapi.json``: server ``https://api.runpod.io`` with paths under ``/v2``;
  ``Pod`` (``status`` PROVISIONING|STARTING|RUNNING|EXITED|ERROR|TERMINATED, ``cost`` "current cost in
  USD per hour (0.0 when EXITED or TERMINATED)", ``ssh.direct {host, port, username}``, ``runtime.ports``
  ``{private, public, type, ip}``, ``mounts.persistent {size, path}``, ``cloud``, ``dataCenterId``);
  ``GpuType`` (``price {secure, community}`` per single GPU, ``maxCount``; with
  ``include=AVAILABILITY&product=POD`` also ``availability`` and per-data-centre ``dataCenters`` for
  the asked ``count`` and ``cloud``); ``NetworkVolume {id, name, size, dataCenter}``; ``SshKeys
  {keys}``; errors in the RFC 9457 shape ``{title, status, detail, errors?}``.
* ``api-reference-v2/migrate-from-v1.mdx``: list answers are wrapped (``{"pods": [...]}``,
  ``{"networkVolumes": [...]}``); a 400 from create covers both a broken rule and "no capacity".
* ``pods/pricing.mdx`` L44-48: container disk $0.10/GB/month while running, nothing while stopped,
  "erased when Pod stops"; volume disk $0.10/GB/month running, $0.20/GB/month stopped, "retained until
  Pod deleted"; network volume $0.07/GB/month (under 1 TB).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpucli.providers.api import Instance, InstanceState, Offer
from gpucli.providers.query import as_number, version_key

#: Hours in a month for turning $/GB/month into $/h (8760 / 12).
HOURS_PER_MONTH = 730.0
CONTAINER_DISK_USD_PER_GB_MONTH = 0.10  # pods/pricing.mdx L46 (running only; erased on stop)
VOLUME_DISK_USD_PER_GB_MONTH = 0.10  # pods/pricing.mdx L47, running
VOLUME_DISK_STOPPED_USD_PER_GB_MONTH = 0.20  # pods/pricing.mdx L47, stopped
#: Network volumes: "$0.07 per GB per month for the first 1TB, and $0.05 ... beyond" (network-volumes.mdx
#: L23-25; pods/pricing.mdx L48).
VOLUME_USD_PER_GB_MONTH = 0.07
VOLUME_USD_PER_GB_MONTH_OVER_1TB = 0.05
VOLUME_MAX_GB = 4000
#: The storage tier gpucli creates, always named: "When omitted ... the requested data center's default
#: (primary) storage tier" (openapi CreateNetworkVolumeRequest.type), which may be high-performance,
#: "priced at a premium" (high-performance-storage.mdx L42, L55-58): the quote would not be the bill.
VOLUME_TYPE = "STANDARD"
#: The container disk gpucli asks for: the image's writable layer and pip caches only. The run folder
#: lives on the volume disk (``mounts.persistent``), which a stop keeps (pods/pricing.mdx L46-47).
CONTAINER_DISK_GB = 20
#: ``PersistentMount.size``: "Upstream enforces a 10 GB floor" (openapi.json).
MIN_VOLUME_DISK_GB = 10
MOUNT_PATH = "/workspace"

_STATES = {
    "PROVISIONING": InstanceState.PENDING,
    "STARTING": InstanceState.PENDING,
    "EXITED": InstanceState.EXITED,
    "ERROR": InstanceState.FAILED,
    "TERMINATED": InstanceState.TERMINATED,
}
_AVAILABLE = {"HIGH": 0, "MEDIUM": 1, "LOW": 2}  # AvailabilityLevel; NONE means nothing to rent


def problem_detail(body: Any, text: str) -> str:
    """The human part of a v2 error (RFC 9457 ``detail`` plus validation ``errors``), or the text."""
    if isinstance(body, Mapping):
        parts = [str(body.get("detail") or body.get("title") or "")]
        errors = body.get("errors")
        if isinstance(errors, list):
            parts += [str(e) for e in errors]
        joined = "; ".join(p for p in parts if p)
        if joined:
            return joined
    return " ".join((text or "").split())[:200]


def is_problem_404(body: Any) -> bool:
    """A v2 "no such resource" answer: the RFC 9457 body with ``status: 404``. A 404 without it (a
    wrong URL, a proxy, the retired v1) proves nothing about the pod."""
    return isinstance(body, Mapping) and body.get("status") == 404 and isinstance(body.get("title"), str)


def storage_usd_per_hour(container_gb: float, volume_gb: float) -> float:
    """What a running pod's disks add to its hourly price (pods/pricing.mdx L46-47)."""
    return (container_gb * CONTAINER_DISK_USD_PER_GB_MONTH + volume_gb * VOLUME_DISK_USD_PER_GB_MONTH) / HOURS_PER_MONTH


def stopped_usd_per_month(volume_gb: float) -> float:
    """What a stopped pod bills per month: its volume disk at the stopped rate; the container disk is
    not charged (and is erased) while stopped."""
    return volume_gb * VOLUME_DISK_STOPPED_USD_PER_GB_MONTH


def volume_usd_per_month(size_gb: float) -> float:
    """RunPod's monthly price of a network volume of ``size_gb``."""
    first = min(size_gb, 1000.0)
    return first * VOLUME_USD_PER_GB_MONTH + max(0.0, size_gb - 1000.0) * VOLUME_USD_PER_GB_MONTH_OVER_1TB


@dataclass(frozen=True)
class NetworkVolume:
    """A RunPod network volume: mounted at /workspace of a pod created with it, in its data centre."""

    volume_id: str
    name: str
    size_gb: int | None
    data_center_id: str | None
    created: bool = False  # created by this launch (it stays after the run: it holds the data)
    #: ``VolumeType`` STANDARD | HIGH_PERFORMANCE (openapi NetworkVolume, required). Only STANDARD has a
    #: published flat price; high-performance storage is "priced at a premium ... varies by data centre"
    #: (storage/high-performance-storage.mdx L55-58), so it is not quoted as if it were standard.
    volume_type: str | None = VOLUME_TYPE

    @property
    def usd_per_month(self) -> float | None:
        if self.size_gb is None or self.volume_type != VOLUME_TYPE:
            return None
        return volume_usd_per_month(self.size_gb)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.volume_id, "name": self.name, "size_gb": self.size_gb,
                "data_center_id": self.data_center_id, "created": self.created, "type": self.volume_type}


def parse_volume(item: Mapping[str, Any]) -> NetworkVolume | None:
    if not item.get("id"):
        return None
    size = item.get("size")
    dc = item.get("dataCenter") or item.get("dataCenterId")
    kind = item.get("type")
    return NetworkVolume(volume_id=str(item["id"]), name=str(item.get("name") or item["id"]),
                         size_gb=size if isinstance(size, int) else None, data_center_id=str(dc) if dc else None,
                         volume_type=str(kind) if kind else None)


def best_data_center(gpu: Mapping[str, Any]) -> str | None:
    """The data centre with the most stock for the count and cloud the catalog was asked about
    (HIGH, then MEDIUM, then LOW; ties by id); None when none has any."""
    best: tuple[int, str] | None = None
    for dc in gpu.get("dataCenters") or []:
        if not isinstance(dc, Mapping) or not dc.get("id"):
            continue
        rank = _AVAILABLE.get(str(dc.get("availability")))
        if rank is not None and (best is None or (rank, str(dc["id"])) < best):
            best = (rank, str(dc["id"]))
    return None if best is None else best[1]


def parse_gpu_type(item: Mapping[str, Any], count: int, cloud: str, *, storage_per_hour: float) -> Offer | None:
    """One ``GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=N&cloud=C`` entry -> an Offer
    pinned to that cloud and to the data centre with the most stock, or None when nothing is free."""
    key = cloud.lower()
    prices = item.get("price")
    per_gpu = as_number(prices.get(key)) if isinstance(prices, Mapping) else None
    if per_gpu is None or per_gpu <= 0 or not item.get("id") or item.get(key) is False:
        return None
    max_counts = item.get("maxCount")
    top = max_counts.get(key) if isinstance(max_counts, Mapping) else None
    if isinstance(top, int) and count > top:
        return None
    if str(item.get("availability") or "NONE") == "NONE":
        return None
    dc = best_data_center(item)
    if dc is None:
        return None
    # compared per component ("12.10" > "12.4"), as openapi listGpuTypes compares minCudaVersion
    cudas = [str(c.get("version")) for c in item.get("cudaVersions") or []
             if isinstance(c, Mapping) and c.get("available") and version_key(c.get("version")) is not None]
    cuda_top = max(cudas, key=lambda v: version_key(v) or (), default=None)
    gpu_id = str(item["id"])
    return Offer(
        provider="runpod", offer_id=f"{gpu_id}|{count}|{cloud}|{dc}", gpu_name=gpu_id, gpu_count=count,
        vram_gb_per_gpu=float(as_number(item.get("memory")) or 0.0),
        price_per_hour_usd=per_gpu * count + storage_per_hour,
        price_per_gpu_hour_usd=(per_gpu * count + storage_per_hour) / count,  # as vast's dph_total / num_gpus
        gpu_display_name=str(item.get("name") or gpu_id), stock=str(item.get("availability")),
        location=dc, cuda_max=as_number(cuda_top), cuda_version=cuda_top, cloud_type=cloud, data_center_id=dc,
        storage_usd_per_hour=storage_per_hour,
    )


def next_page(body: Mapping[str, Any]) -> tuple[str | None, bool]:
    """The continuation of a v2 list answer: ``(cursor or None, says-there-is-more)``."""
    cursor = body.get("nextCursor") or body.get("next_cursor") or body.get("cursor")
    more = body.get("truncated") is True or body.get("hasMore") is True
    return (str(cursor) if cursor else None), more


def parse_pod(pod: Mapping[str, Any], *, ssh_user: str = "root") -> Instance:
    """A v2 ``Pod`` -> Instance. SSH is ``ssh.direct`` (the published 22/tcp), else the runtime port
    whose ``private`` is 22; the proxy route carries no scp/rsync (openapi ``PodSsh``), never used."""
    status = str(pod.get("status") or "")
    host: str | None = None
    port: int | None = None
    ssh = pod.get("ssh")
    direct = ssh.get("direct") if isinstance(ssh, Mapping) else None
    if isinstance(direct, Mapping) and direct.get("host") and direct.get("port"):
        host, port = str(direct["host"]), int(direct["port"])
    runtime = pod.get("runtime")
    if host is None and isinstance(runtime, Mapping):
        for entry in runtime.get("ports") or []:
            if isinstance(entry, Mapping) and entry.get("private") == 22 and entry.get("public") and \
                    entry.get("ip") and str(entry.get("type", "tcp")).lower() == "tcp":
                host, port = str(entry["ip"]), int(entry["public"])
                break
    if status == "RUNNING":
        state = InstanceState.RUNNING if isinstance(runtime, Mapping) else InstanceState.PENDING
    else:
        state = _STATES.get(status, InstanceState.UNKNOWN)
    gpu = pod.get("gpu")
    count = gpu.get("count") if isinstance(gpu, Mapping) else None
    mounts = pod.get("mounts")
    persistent = mounts.get("persistent") if isinstance(mounts, Mapping) else None
    volume_gb = as_number(persistent.get("size")) if isinstance(persistent, Mapping) else None
    runtime_word = "null" if runtime is None else ("up, no public ssh port" if host is None else "up")
    return Instance(
        provider="runpod", instance_id=str(pod.get("id")), label=pod.get("name"), state=state,
        ssh_host=host, ssh_port=port, ssh_user=ssh_user, price_per_hour_usd=as_number(pod.get("cost")),
        gpu_name=str(gpu.get("id")) if isinstance(gpu, Mapping) and gpu.get("id") else None,
        gpu_count=count if isinstance(count, int) else None,
        raw_status=f"status={status or None} runtime={runtime_word}",
        data_center_id=str(pod["dataCenterId"]) if pod.get("dataCenterId") else None,
        cloud_type=str(pod["cloud"]) if pod.get("cloud") else None,
        stopped_usd_per_month=None if volume_gb is None else stopped_usd_per_month(volume_gb),
        ssh_unexposed=state is InstanceState.RUNNING and host is None,
    )
