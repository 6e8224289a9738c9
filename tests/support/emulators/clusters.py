"""An emulator of RunPod Instant Clusters (REST API v2, tag Clusters), as strict as the spec
(runpod/docs api-reference-v2/openapi.json): CreateClusterRequest takes only its own fields
(``unevaluatedProperties: false``), ``compute`` exactly gpuTypeId / gpuCountPerPod / podCount with
podCount in 2..250, ``type`` one of APPLICATION, TRAINING, SLURM, RAY; an unknown field or value is a 400
problem. Member pods answer only through ``/v2/clusters/{id}/pods``; ``DELETE /v2/clusters/{id}``
terminates every member. Each member that reaches RUNNING is a real sshd (tests/support/emulators/common.py)
whose PID 1 environment carries the variables of runpod/docs instant-clusters/configuration.mdx.

Faults (``faults.add(kind, endpoint)``, endpoints ``create_cluster``, ``cluster_pods``, ``delete_cluster``,
``list_clusters``) are the shared ones; per-pod behaviours (``behaviours``) make a member slow, stuck
or fail (``bad_state`` ERROR).
"""

from __future__ import annotations

import contextlib
import re
import secrets
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from tests.support.emulators.common import EmulatorBase, EmuPod, Reply
from tests.support.emulators.forward import TcpForwarder

CREATE_FIELDS = {"name", "type", "compute", "dataCenterIds", "mounts", "startJupyter", "startSsh",
                 "args", "disk", "env", "image", "ports"}
COMPUTE_FIELDS = {"gpuTypeId", "gpuCountPerPod", "podCount"}
TYPES = ("APPLICATION", "TRAINING", "SLURM", "RAY")
GPU_TYPES = {"NVIDIA H100 80GB HBM3": 2.99, "NVIDIA H200": 3.99, "NVIDIA A100-SXM4-80GB": 1.89}


class _ClusterAddress(TcpForwarder):
    """A worker's sshd at its cluster address and the cluster's one SSH port (a pod's is 22; here one free
    port on every 127.0.0.x), where only a connection from inside the cluster reaches it."""

    def __init__(self, target_port: int, host: str, port: int) -> None:
        self.target_port = target_port
        self._sock = socket.create_server((host, port))
        self.port = port
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept: the address is free for the next cluster
        self._sock.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _problem(status: int, detail: str) -> Reply:
    return Reply(status, {"type": "about:blank", "title": "Bad Request" if status == 400 else "Error",
                          "status": status, "detail": detail})


@dataclass
class EmuCluster:
    cluster_id: str
    name: str
    gpu_type: str
    gpus_per_pod: int
    members: list[str] = field(default_factory=list)  # pod ids by rank
    volume_id: str | None = None  # the network volume mounted on every member (kept when the cluster goes)
    deleted: bool = False


class ClusterEmulator(EmulatorBase):
    provider = "runpod"

    def __init__(self, root: Any, api_key: str = "rp-test-key") -> None:
        super().__init__(root, api_key)
        self.clusters: dict[str, EmuCluster] = {}
        self._ranks: dict[str, tuple[str, int]] = {}  # pod id -> (cluster id, rank)
        self._lock2 = threading.Lock()
        # Whether a member's own key may DELETE its cluster: no source says (environment-variables.mdx
        # L89: "Pod-scoped API key"); off, it answers 403 as for any other call with that key.
        self.pod_key_deletes_cluster = False
        # The account's network volumes (``/v2/network-volumes``, served by the RunPod emulator when a test has
        # both: tests/support/emulators/fixtures.py links them); a volume's folder is what its mount shows.
        self.volumes_of: Any = None
        # The docs give an SSH endpoint only for the primary (openapi ClusterPrimary.sshEndpoint;
        # instant-clusters.mdx: "The eth0 interface on the primary node handles external traffic"). On, only
        # rank 0 gets ``ssh.direct``; a worker's sshd answers only at its cluster ip (127.0.0.1 + rank here)
        # and ``cluster_ssh_port``, reached through the primary (a direct-tcpip hop).
        self.primary_ssh_only = False
        self.cluster_ssh_port = _free_port()
        self._inside: dict[str, _ClusterAddress] = {}  # worker pod id -> its address inside the cluster

    def classify(self, method: str, path: str, body: Any) -> str:
        if method == "POST" and path == "/v2/clusters":
            return "create_cluster"
        if method == "GET" and path == "/v2/clusters":
            return "list_clusters"
        if method == "GET" and re.fullmatch(r"/v2/clusters/[^/]+/pods", path):
            return "cluster_pods"
        if method == "DELETE" and re.fullmatch(r"/v2/clusters/[^/]+", path):
            return "delete_cluster"
        if method == "GET" and re.fullmatch(r"/v2/clusters/[^/]+", path):
            return "get_cluster"
        return "unknown"

    def handle(self, method: str, path: str, query: dict[str, str], body: Any, endpoint: str, *,
               no_capacity: bool, by: str) -> Reply:
        if by != "account-key" and endpoint != "delete_cluster":
            return self.forbidden(endpoint)
        if endpoint == "create_cluster":
            return self._create(body, no_capacity)
        if endpoint == "list_clusters":
            return Reply(200, {"clusters": [self._render(c) for c in self.clusters.values() if not c.deleted]})
        cid = path.split("/")[3]
        cluster = self.clusters.get(cid)
        if cluster is None or cluster.deleted:
            return _problem(404, f"cluster {cid} not found")
        if endpoint == "get_cluster":
            return Reply(200, self._render(cluster))
        if endpoint == "cluster_pods":
            return Reply(200, {"pods": [self._pod(cluster, pid, rank) for rank, pid in enumerate(cluster.members)]})
        if endpoint == "delete_cluster":
            cluster.deleted = True
            for pid in cluster.members:
                self.end_pod(pid, "terminated", by)
                inside = self._inside.pop(pid, None)
                if inside is not None:
                    inside.close()
            return Reply(204, None)
        return _problem(404, f"no route {method} {path}")

    def _create(self, body: Any, no_capacity: bool) -> Reply:
        if not isinstance(body, dict):
            return _problem(400, "body must be a JSON object")
        unknown = set(body) - CREATE_FIELDS
        if unknown:
            return _problem(400, f"unknown field(s): {', '.join(sorted(unknown))}")
        for key in ("name", "type", "compute"):
            if key not in body:
                return _problem(400, f"{key} is required")
        if body["type"] not in TYPES or not isinstance(body["name"], str) or not body["name"]:
            return _problem(400, "type or name is not valid")
        compute = body["compute"]
        if not isinstance(compute, dict) or set(compute) != COMPUTE_FIELDS:
            return _problem(400, "compute takes exactly gpuTypeId, gpuCountPerPod and podCount")
        n, per = compute["podCount"], compute["gpuCountPerPod"]
        if not (isinstance(n, int) and 2 <= n <= 250 and isinstance(per, int) and per >= 1):
            return _problem(400, "podCount must be 2..250 and gpuCountPerPod at least 1")
        if compute["gpuTypeId"] not in GPU_TYPES:
            return _problem(400, f"unknown gpuTypeId {compute['gpuTypeId']!r}")
        env = body.get("env") or {}
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            return _problem(400, "env must map names to strings")
        volume_id, refused = self._mount(body)
        if refused is not None:
            return refused
        if no_capacity:
            return _problem(422, f"no capacity for {n} x {per}x {compute['gpuTypeId']} in one data center")
        cid = "cluster_" + secrets.token_hex(6)
        cluster = EmuCluster(cid, body["name"], compute["gpuTypeId"], per, volume_id=volume_id)
        for rank in range(n):
            pid = "pod_" + secrets.token_hex(6)
            pod = EmuPod(pod_id=pid, label=body["name"], gpu_name=compute["gpuTypeId"], gpu_count=per,
                         image=str(body.get("image")), price_per_hour=GPU_TYPES[compute["gpuTypeId"]] * per,
                         spot=False, bid=None, behaviour=self.next_behaviour())
            if body.get("startSsh"):
                for line in str(env.get("PUBLIC_KEY") or "").splitlines():
                    pod.add_key(line)
            self.add_pod(pod)
            self._ranks[pid] = (cid, rank)
            cluster.members.append(pid)
            self.ledger.record(pid, "created", label=body["name"])
        self.clusters[cid] = cluster
        return Reply(201, self._render(cluster))

    def _mount(self, body: dict[str, Any]) -> tuple[str | None, Reply | None]:
        """The network volume of ``mounts`` (None: none asked), or the 400/404 problem that refuses it. A
        volume is "attached during cluster creation; mounts at /workspace on each node"
        (storage/network-volumes.mdx L112); ``mounts.network[]`` is NetworkMount {volumeId, path}, path
        "No default - must be specified explicitly" (openapi); a volume mounts only on pods of its data
        centre, so the cluster must be placed there (dataCenterIds)."""
        mounts = body.get("mounts")
        if mounts is None:
            return None, None
        network = mounts.get("network") if isinstance(mounts, dict) else None
        if (not isinstance(network, list) or len(network) != 1 or not isinstance(network[0], dict)
                or set(network[0]) != {"volumeId", "path"} or not network[0]["path"]):
            return None, _problem(400, "mounts.network takes one {volumeId, path}; path is required")
        volume_id = str(network[0]["volumeId"])
        volume = (self.volumes_of.volumes if self.volumes_of is not None else {}).get(volume_id)
        if volume is None:
            return None, _problem(404, f"network volume {volume_id} does not exist")
        if volume["dataCenter"] not in (body.get("dataCenterIds") or []):
            return None, _problem(400, f"network volume {volume_id} is in {volume['dataCenter']}: the cluster "
                                       "must be created there (dataCenterIds)")
        return volume_id, None

    def _render(self, c: EmuCluster) -> dict[str, Any]:
        return {"id": c.cluster_id, "name": c.name, "type": "TRAINING",
                "compute": {"gpuTypeId": c.gpu_type, "gpuCountPerPod": c.gpus_per_pod, "podCount": len(c.members)},
                "pods": {"total": len(c.members), "byStatus": {}}, "createdAt": "2026-11-25T00:00:00Z"}

    def _pod(self, c: EmuCluster, pid: str, rank: int) -> dict[str, Any]:
        pod = self.pods.get(pid)
        status, direct = "TERMINATED", None
        if pod is not None:
            b = pod.behaviour
            pod.polls += 1
            if b.exit_after_polls is not None and pod.polls > b.exit_after_polls:
                status = b.bad_state if b.bad_state in ("EXITED", "ERROR") else "ERROR"
                pod.stop_sshd()
            elif b.stuck or pod.polls <= b.pending_polls:
                status = "PROVISIONING"
            else:
                status = "RUNNING"
                sshd = self.boot(pod)
                direct = {"host": "127.0.0.1", "port": sshd.port, "username": "root",
                          "command": f"ssh root@127.0.0.1 -p {sshd.port}"}
                if self.primary_ssh_only and rank > 0:
                    direct = None
                    if pid not in self._inside:
                        self._inside[pid] = _ClusterAddress(sshd.port, f"127.0.0.{1 + rank}", self.cluster_ssh_port)
        return {"id": pid, "name": c.name, "status": status, "image": pod.image if pod else "",
                "cost": pod.price_per_hour if pod and status == "RUNNING" else 0.0,
                # PodCluster.ip is the "address on the cluster's private overlay network" (openapi), 10.65/16
                # (audit 2026-11-28 §3.C6): not routable here, so a client that rendezvouses on it fails;
                # the documented address is PRIMARY_ADDR in the node's environment (pod_environment). With
                # primary_ssh_only it is where the worker's sshd answers from inside (127.0.0.1 + rank).
                "cluster": {"id": c.cluster_id, "rank": rank, **({"ip": f"{self._net}.{1 + rank}"}
                                                                   if status == "RUNNING" else {})},
                "ssh": {"proxy": None, "direct": direct}}

    @property
    def _net(self) -> str:
        return "127.0.0" if self.primary_ssh_only else "10.65.0"

    def stop(self) -> None:
        for inside in self._inside.values():
            inside.close()
        self._inside.clear()
        super().stop()

    def pod_environment(self, pod: EmuPod) -> dict[str, str]:
        cid, rank = self._ranks[pod.pod_id]
        c = self.clusters[cid]
        n = len(c.members)
        # runpod/docs instant-clusters/configuration.mdx: every node has PRIMARY_ADDR/MASTER_ADDR (the
        # primary's address on ens1), PRIMARY_PORT/MASTER_PORT, NODE_ADDR, NODE_RANK, NUM_NODES,
        # NUM_TRAINERS, WORLD_SIZE, HOST_NODE_ADDR; here ens1 is the loopback (127.0.0.1 + rank)
        return {"RUNPOD_POD_ID": pod.pod_id, "RUNPOD_API_KEY": pod.scoped_key, "PRIMARY_ADDR": "127.0.0.1",
                "MASTER_ADDR": "127.0.0.1", "PRIMARY_PORT": "29500", "MASTER_PORT": "29500",
                "NODE_ADDR": f"127.0.0.{1 + rank}", "NODE_RANK": str(rank), "NUM_NODES": str(n),
                "NUM_TRAINERS": str(c.gpus_per_pod), "WORLD_SIZE": str(n * c.gpus_per_pod),
                "HOST_NODE_ADDR": "127.0.0.1:29500"}

    def pod_key_allows(self, pod_id: str, method: str, path: str, body: Any, endpoint: str) -> bool:
        # member pods are managed only through their cluster; with the switch on, a member's key may
        # delete its own cluster (rank 0's watchdog tries it: gpucli/pod/watchdog.py)
        own = self._ranks.get(pod_id, ("", 0))[0]
        return self.pod_key_deletes_cluster and endpoint == "delete_cluster" and path.rstrip("/").endswith("/" + own)

    def forbidden(self, endpoint: str) -> Reply:
        return _problem(403, f"{endpoint}: forbidden for this key")

    def unauthorized(self) -> Reply:
        return _problem(401, "missing or invalid API key")

    def billing_pods(self) -> set[str]:
        """Member pods created and not terminated."""
        return self.ledger.alive()
