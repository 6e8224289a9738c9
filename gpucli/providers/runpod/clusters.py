"""RunPod Instant Clusters through the REST API v2: several pods on one fast private network, rented and
ended as one.

Routes and shapes (runpod/docs api-reference-v2/openapi.json, tag Clusters):
- ``POST /v2/clusters`` (CreateClusterRequest: ``name``, ``type`` TRAINING, ``compute`` {``gpuTypeId``,
  ``gpuCountPerPod``, ``podCount`` >= 2}, ``dataCenterIds``, the container config ``image``, ``disk``,
  ``env``, ``ports``, and ``startSsh``) answers 201 with the Cluster;
- ``GET /v2/clusters`` lists them (``{"clusters": [...]}``), ``GET /v2/clusters/{id}`` one;
- ``GET /v2/clusters/{id}/pods`` gives the member pods (``{"pods": [Pod]}``): ``status`` PROVISIONING |
  STARTING | RUNNING | EXITED | ERROR | TERMINATED, ``cluster`` {``id``, ``rank`` (NODE_RANK, null until
  assigned), ``ip`` (the overlay address)}, ``ssh.direct`` {``host``, ``port``, ``username``} once
  RUNNING with 22/tcp published; member pods are managed only through their cluster;
- ``DELETE /v2/clusters/{id}`` (204) deletes the cluster and terminates every member pod.
Inside, every node has PRIMARY_ADDR/MASTER_ADDR, NODE_RANK, NUM_NODES, NUM_TRAINERS, WORLD_SIZE, and
inter-node traffic must use ens1 (runpod/docs instant-clusters/configuration.mdx).

The base URL is ``RUNPOD_API_V2_URL`` (default https://api.runpod.io, the spec's server); the key is the
account's RunPod key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gpucli.errors import ProviderError
from gpucli.providers.http import HttpClient
from gpucli.providers.runpod.v2 import is_problem_404

V2_DEFAULT_URL = "https://api.runpod.io"
BAD_STATES = ("EXITED", "ERROR", "TERMINATED")


def v2_base_url() -> str:
    return (os.environ.get("RUNPOD_API_V2_URL") or V2_DEFAULT_URL).rstrip("/")


class ClusterRefused(ProviderError):
    """RunPod answered the create with an error: no cluster was made (capacity, a data centre, a shape)."""


@dataclass(frozen=True)
class ClusterPod:
    pod_id: str
    status: str
    rank: int | None
    ip: str | None  # on the cluster's overlay network
    ssh_host: str | None
    ssh_port: int | None
    cost_per_hour: float | None = None

    @property
    def ready(self) -> bool:
        """RUNNING with its rank and cluster address. An SSH endpoint is not asked of every member: the
        docs give one only for the primary (openapi ClusterPrimary.sshEndpoint; instant-clusters.mdx: "The
        eth0 interface on the primary node handles external traffic"); a worker without one is reached
        through the primary (:func:`gpucli.providers.runpod.clusterrent.rent_cluster`)."""
        return self.status == "RUNNING" and self.rank is not None and bool(self.ip)


@dataclass(frozen=True)
class ClusterInfo:
    cluster_id: str
    name: str
    pods: int


def _pod(item: Any) -> ClusterPod:
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        raise ProviderError("RunPod answered a cluster pod without an id")
    member = item.get("cluster") or {}
    direct = (item.get("ssh") or {}).get("direct") or {}
    rank = member.get("rank")
    cost = item.get("cost")
    return ClusterPod(pod_id=item["id"], status=str(item.get("status") or "PROVISIONING"),
                      rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
                      ip=member.get("ip") if isinstance(member.get("ip"), str) else None,
                      ssh_host=direct.get("host") if isinstance(direct.get("host"), str) else None,
                      ssh_port=direct.get("port") if isinstance(direct.get("port"), int) else None,
                      cost_per_hour=float(cost) if isinstance(cost, int | float) else None)


class RunPodClusters:
    """The cluster routes of RunPod's API v2 (see the module's docstring)."""

    def __init__(self, api_key: str, base_url: str | None = None) -> None:
        self.http = HttpClient(base_url or v2_base_url(), api_key=api_key, service="RunPod")

    def create(self, *, name: str, gpu_type_id: str, gpus_per_pod: int, pods: int, image: str, disk_gb: int,
               public_key: str, env: dict[str, str] | None = None, data_centers: tuple[str, ...] = (),
               volume_id: str | None = None, mount_path: str = "/workspace") -> str:
        body: dict[str, Any] = {
            "name": name, "type": "TRAINING",
            "compute": {"gpuTypeId": gpu_type_id, "gpuCountPerPod": gpus_per_pod, "podCount": pods},
            "image": image, "disk": disk_gb, "ports": ["22/tcp"], "startSsh": True,
            "env": {"PUBLIC_KEY": public_key, **(env or {})},
        }
        if data_centers:
            body["dataCenterIds"] = list(data_centers)
        if volume_id:
            # A network volume is attached at cluster creation and "mounts at /workspace on each node"
            # (runpod/docs storage/network-volumes.mdx L112); the container disk (``disk``) is "ephemeral,
            # wiped on restart" (openapi BaseContainerConfig.disk). ``mounts`` is the container config's,
            # as CreatePodRequest's: ``{"network": [{volumeId, path}]}``, path required (NetworkMount).
            body["mounts"] = {"network": [{"volumeId": volume_id, "path": mount_path}]}
        resp = self.http.request("POST", "/v2/clusters", json_body=body, what="create cluster")
        if resp.status not in (200, 201) or not isinstance(resp.body, dict) or not resp.body.get("id"):
            detail = resp.body.get("detail") or resp.body.get("title") if isinstance(resp.body, dict) else resp.text
            raise ClusterRefused(f"RunPod refused the cluster ({resp.status}): {str(detail)[:200]}",
                                hint="another GPU type, fewer nodes or another data centre may have capacity")
        return str(resp.body["id"])

    def pods(self, cluster_id: str) -> list[ClusterPod] | None:
        """The member pods; None when the cluster does not exist (any more). Only v2's own 404 (its RFC
        9457 problem body, openapi ``ErrorResponse``) says so: a bare 404 (a wrong URL, a proxy) is an
        error, never "gone"."""
        resp = self.http.request("GET", f"/v2/clusters/{cluster_id}/pods", what="list cluster pods")
        if resp.status == 404 and is_problem_404(resp.body):
            return None
        if not resp.ok or not isinstance(resp.body, dict) or not isinstance(resp.body.get("pods"), list):
            raise ProviderError(f"RunPod cluster {cluster_id}: unexpected answer to its pods ({resp.status})")
        return [_pod(p) for p in resp.body["pods"]]

    def delete(self, cluster_id: str) -> bool:
        """Delete the cluster and every member pod; False when it was already gone (v2's problem 404 only)."""
        resp = self.http.request("DELETE", f"/v2/clusters/{cluster_id}", what="delete cluster")
        if resp.status == 404 and is_problem_404(resp.body):
            return False
        if resp.status not in (200, 202, 204):
            raise ProviderError(f"RunPod did not delete cluster {cluster_id} (HTTP {resp.status})")
        return True

    def list(self) -> list[ClusterInfo]:
        resp = self.http.request("GET", "/v2/clusters", what="list clusters")
        if not resp.ok or not isinstance(resp.body, dict) or not isinstance(resp.body.get("clusters"), list):
            raise ProviderError(f"RunPod: unexpected answer to the cluster list ({resp.status})")
        out = []
        for c in resp.body["clusters"]:
            if isinstance(c, dict) and isinstance(c.get("id"), str):
                total = (c.get("pods") or {}).get("total")
                out.append(ClusterInfo(c["id"], str(c.get("name") or ""), total if isinstance(total, int) else 0))
        return out

    def close(self) -> None:
        self.http.close()
