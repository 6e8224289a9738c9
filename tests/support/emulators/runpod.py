"""A RunPod emulator: REST API v2 (what gpucli uses), the GraphQL left for the v2 gaps, v1 retired.

Every rule cites its source (runpod/docs snapshot 2026-08-20 unless said otherwise); where no source
settles a point, the choice is this emulator's and says so.

* Base ``https://api.runpod.io`` with paths under ``/v2`` (api-reference-v2/openapi.json ``servers``);
  Bearer auth, 401 otherwise; errors in RFC 9457 shape ``{title, status, detail, errors?}``
  (migrate-from-v1.mdx "RFC 9457 error objects").
* ``/v1/...`` answers 410: "REST API v1 ... retired on November 15, 2026" (release-notes.mdx 2026-08-18).
  The 410 and its words are this emulator's.
* GraphQL (``POST /graphql``) serves only ``myself { clientBalance pubKey }``, ``podStop`` and
  ``podTerminate``; ``graphql_enabled = False`` answers 404, standing for its retirement in early 2027
  (release-notes.mdx). ``podRentInterruptable`` and ``podFindAndDeployOnDemand`` are unknown fields:
  interruptible pods were removed (runpodctl PR #267 maintainer, 2026-04-13; runpod/docs 8e5aebdb).
* Catalog: ``GET /v2/catalog/gpus`` lists ``price {secure, community}`` per GPU and ``maxCount``; with
  ``include=AVAILABILITY`` it needs ``product`` (400 otherwise) and adds ``availability``,
  ``dataCenters`` and ``cudaVersions`` scoped by ``count``, ``cloud`` (default SECURE) and
  ``minCudaVersion`` (openapi ``listGpuTypes`` parameters). Stock is kept per data centre, cloud and
  GPU type as a number of free GPUs, so a count is in stock only where that many are free (the numbers
  are invented).
* Create ``POST /v2/pods`` (openapi ``CreatePodRequest``): ``name`` required, exactly one of ``gpu`` /
  ``cpu``, unknown fields 422, ``cloud`` default SECURE, ``dataCenterIds`` honoured,
  ``minCudaVersion`` and a non-empty ``allowedCudaVersions`` together 400, ``mounts.persistent`` needs
  ``size`` >= 10 and ``path``, a network mount needs ``path`` ("No default - must be specified
  explicitly") and a volume in the pod's data centre; network volumes only on SECURE
  (storage/network-volumes.mdx L98). No capacity: 400 whose ``detail`` is the wording runpodctl PR
  #267 recorded. Answer 201 with the pod, ``cost`` = the GPU rate of the pod's cloud in its data
  centre (times ``billed_markup`` of that data centre, a test control) plus its disks' running rate.
* Pods: ``GET /v2/pods/{id}`` 404 (problem body) once terminated; ``GET /v2/pods`` -> ``{"pods": [...]}``
  without terminated pods ("no longer appears in listPods", openapi ``deletePod``); ``POST
  /v2/pods/{id}/action`` start/stop/restart/terminate with 409 for an action the status does not allow;
  stop -> EXITED, ``cost`` 0.0; ``DELETE`` -> 204. A stop wipes the container disk ("erased when Pod
  stops", pods/pricing.mdx L46): the emulator empties the pod's ``container_dir``; the volume disk
  (``volume_dir``) is kept and bills $0.20/GB/month while stopped (L47).
* ``GET/PUT /v2/account/ssh-keys`` ``{keys}``; ``GET/POST /v2/network-volumes`` (``{name, size,
  dataCenter}``, 201), ``DELETE /v2/network-volumes/{id}`` 204.
* Pod-scoped key (``RUNPOD_API_KEY`` in the pod): may stop/terminate its own pod (v2 action/DELETE and
  GraphQL); anything else 403. Whether real v2 accepts a pod key is not documented: the emulator says yes
  unless ``pod_key_rest_v2`` is off (then v2 answers it 403 and only GraphQL works).
* Start commands (create ``args``) run at every container start: startcmd.py; ``restart`` (and
  :meth:`restart_container`, a host-side restart) starts the container again.
"""

from __future__ import annotations

import random
import shutil
import string
from pathlib import Path
from typing import Any

from tests.support.emulators.common import EmulatorBase, EmuPod, Reply, RouteCall
from tests.support.emulators.runpod_graphql import install_graphql
from tests.support.emulators.startcmd import boot_and_start
from tests.support.sshd import SshServer

NO_CAPACITY_DETAIL = "There are no instances available with the request specifications. Please try again later."

GPU_TYPES: list[dict[str, Any]] = [
    {"id": "NVIDIA GeForce RTX 4090", "name": "RTX 4090", "memory": 24, "price": {"secure": 0.69, "community": 0.34},
     "maxCount": {"secure": 8, "community": 8}},
    {"id": "NVIDIA A100 80GB PCIe", "name": "A100 PCIe", "memory": 80, "price": {"secure": 1.64, "community": 1.19},
     "maxCount": {"secure": 8, "community": 4}},
    {"id": "NVIDIA H100 80GB HBM3", "name": "H100 SXM", "memory": 80, "price": {"secure": 2.99, "community": 2.69},
     "maxCount": {"secure": 8, "community": 8}},
    {"id": "NVIDIA RTX A4000", "name": "RTX A4000", "memory": 16, "price": {"secure": 0.35, "community": 0.2},
     "maxCount": {"secure": 4, "community": 4}},  # listed, nothing free anywhere
]

#: (data centre, cloud) -> {GPU id: free GPUs}, and each data centre's host CUDA version: "major.minor" text
#: as GpuType.cudaVersions[].version reports it, compared per component (openapi gpu.minCudaVersion:
#: "compared numerically rather than as a decimal — so 12.11 is above 12.2"). EU-SE-1's hosts are too old
#: for a CUDA 12.8 image.
DATA_CENTERS: list[dict[str, Any]] = [
    {"id": "EU-RO-1", "cuda": "12.8", "stock": {"SECURE": {"NVIDIA GeForce RTX 4090": 2, "NVIDIA A100 80GB PCIe": 2},
                                                "COMMUNITY": {"NVIDIA GeForce RTX 4090": 8}}},
    {"id": "US-KS-2", "cuda": "12.10", "stock": {"SECURE": {"NVIDIA GeForce RTX 4090": 16, "NVIDIA H100 80GB HBM3": 8},
                                                "COMMUNITY": {"NVIDIA A100 80GB PCIe": 4}}},
    {"id": "EU-SE-1", "cuda": "12.2", "stock": {"SECURE": {"NVIDIA H100 80GB HBM3": 1}, "COMMUNITY": {}}},
]
CREATE_FIELDS = frozenset({"name", "image", "args", "disk", "env", "ports", "registry", "cloud", "cpu",
                           "dataCenterIds", "globalNetworking", "gpu", "mounts", "startJupyter", "startSsh",
                           "templateId"})
VOLUME_FIELDS = frozenset({"name", "size", "dataCenter", "type"})
_ID = r"(?P<id>[A-Za-z0-9_]+)"


def problem(status: int, title: str, detail: str, errors: list[str] | None = None) -> Reply:
    body: dict[str, Any] = {"title": title, "status": status, "detail": detail}
    if errors:
        body["errors"] = errors
    return Reply(status, body)


def _level(free: int, count: int) -> str:
    units = free // max(1, count)
    return "HIGH" if units >= 4 else "MEDIUM" if units >= 2 else "LOW" if units >= 1 else "NONE"


def _cuda(v: str) -> tuple[int, int]:
    major, _, minor = v.partition(".")
    return int(major), int(minor or 0)


class RunPodEmulator(EmulatorBase):
    provider = "runpod"

    def __init__(self, root: Any, api_key: str = "rp-test-key") -> None:
        super().__init__(root, api_key)
        self.gpu_types = [dict(g) for g in GPU_TYPES]
        self.data_centers = [{**dc, "stock": {c: dict(s) for c, s in dc["stock"].items()}} for dc in DATA_CENTERS]
        self.billed_markup: dict[str, float] = {}  # data centre -> factor on the GPU rate (a billed-price test)
        self.run_start_commands = False  # run a container's start command at every start (startcmd.py)
        self.started_containers: set[str] = set()
        self.calls: list[tuple[str, dict[str, Any]]] = []  # (operation, body) of every v2 / GraphQL call
        self._rng = random.Random(5)
        self.graphql_enabled = True
        # Whether REST v2 takes a pod's own key: no source says (environment-variables.mdx L89 calls it
        # "Pod-scoped API key"; v2 "may return 403 when a valid key lacks access"). False answers those
        # calls 403, so the GraphQL fallback is tested too.
        self.pod_key_rest_v2 = True
        self.account_keys: list[str] = []
        self.balance_usd: float | None = 25.0
        self.volumes: dict[str, dict[str, Any]] = {}  # id -> {id, name, size, dataCenter, type}
        self.volume_ids: list[str] = []  # ids the next created volumes get
        self.volume_create_fails = 0  # the next N volume creates answer 500 (a test control)
        self.pod_info: dict[str, dict[str, Any]] = {}  # id -> cloud, dc, disk, mounts, status
        #: (cloud, data centre) pairs this account may not use: createPod there answers 403 "Your account
        #: cannot access the requested pool." (openapi createPod error table: "Skip this candidate").
        self.closed_pools: set[tuple[str, str]] = set()
        self.default_volume_type: dict[str, str] = {}  # data centre -> its default tier (STANDARD if absent)
        #: ``GET /v2/pods`` page size (None: one page). The spec shows no paging; v2 clients follow a
        #: cursor (gipper 0.5.0, SkyPilot PR#10846); the ``nextCursor``/``truncated`` envelope is
        #: runpod-mcp PR#46's, this emulator's choice for the shape.
        self.pods_page_size: int | None = None
        self._routes()
        install_graphql(self)

    # -- routes ------------------------------------------------------------------------------------
    def _routes(self) -> None:
        r = self.add_route
        r("GET", "/v2/catalog/gpus", "search", self._catalog)
        r("POST", "/v2/pods", "create", self._create)
        r("GET", "/v2/pods", "list", self._list)
        r("GET", f"/v2/pods/{_ID}", "get", self._get)
        r("DELETE", f"/v2/pods/{_ID}", "terminate", self._delete,
          pod_key_ok=lambda pod, c: self.pod_key_rest_v2 and c.groups["id"] == pod)
        r("POST", f"/v2/pods/{_ID}/action", "action", self._action,
          pod_key_ok=lambda pod, c: self.pod_key_rest_v2 and c.groups["id"] == pod and isinstance(c.body, dict)
          and c.body.get("action") in ("stop", "terminate"))
        r("GET", "/v2/account/ssh-keys", "keys", lambda c: Reply(200, {"keys": list(self.account_keys)}))
        r("PUT", "/v2/account/ssh-keys", "keys_put", self._put_keys)
        r("GET", "/v2/network-volumes", "volumes", lambda c: Reply(200, {"networkVolumes": [
            dict(v) for v in self.volumes.values()]}))
        r("POST", "/v2/network-volumes", "volume_create", self._create_volume_rest)
        r("DELETE", f"/v2/network-volumes/{_ID}", "volume_delete", self._delete_volume)
        # the real API has the cluster list (openapi listClusters); this pod emulator rents none (clusters.py does)
        r("GET", "/v2/clusters", "list_clusters", lambda c: Reply(200, {"clusters": []}))
        for method in ("GET", "POST", "DELETE", "PUT", "PATCH"):
            r(method, "/v1/.*", "v1", lambda c: problem(410, "Gone", "REST API v1 was retired on 2026-11-15; use /v2"))

    def classify(self, method: str, path: str, body: Any) -> str:
        return "other"

    def handle(self, method: str, path: str, query: dict[str, str], body: Any, endpoint: str, *,
               no_capacity: bool, by: str) -> Reply:
        return Reply(404, text="404 page not found")  # an unknown path: no v2 problem body (this emulator's)

    def unauthorized(self) -> Reply:
        return problem(401, "Unauthorized", "missing or invalid API key")

    def forbidden(self, endpoint: str) -> Reply:
        return problem(403, "Forbidden", "this API key is scoped to one pod: it can only stop or terminate it")

    def pod_key_allows(self, pod_id: str, method: str, path: str, body: Any, endpoint: str) -> bool:
        return False

    def boot(self, pod: EmuPod) -> SshServer:
        """Start the container; its start command runs at every start with ``run_start_commands`` (startcmd.py)."""
        return boot_and_start(self, pod, super().boot)

    def pod_environment(self, pod: EmuPod) -> dict[str, str]:
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "RUNPOD_POD_ID": pod.pod_id, "RUNPOD_API_KEY": pod.scoped_key,
               "RUNPOD_GPU_COUNT": str(pod.gpu_count), "RUNPOD_POD_HOSTNAME": f"{pod.pod_id}-64410065"}
        if self.pod_env_has_base_url:
            env["RUNPOD_API_BASE_URL"] = self.url
        return env

    def _log(self, op: str, body: Any) -> None:
        with self.lock:
            self.calls.append((op, body if isinstance(body, dict) else {}))

    # -- catalog -----------------------------------------------------------------------------------
    def _catalog(self, c: RouteCall) -> Reply:
        self._log("listGpuTypes", dict(c.query))
        q = c.query
        avail = q.get("include") == "AVAILABILITY"
        if avail and not q.get("product"):
            return problem(400, "Bad Request", "include=AVAILABILITY requires product")
        if not avail and any(k in q for k in ("count", "cloud", "minCudaVersion", "product")):
            return problem(400, "Bad Request", "count, cloud, product and minCudaVersion need include=AVAILABILITY")
        count = int(q.get("count") or 1)
        cloud = q.get("cloud") or "SECURE"
        min_cuda = q.get("minCudaVersion")
        out = []
        for g in self.gpu_types:
            item = {k: g[k] for k in ("id", "name", "memory", "price", "maxCount")}
            item.update({"pool": None, "manufacturer": "NVIDIA", "secure": True, "community": True})
            if avail:
                dcs, cudas = [], {}
                for dc in self.data_centers:
                    if min_cuda and _cuda(dc["cuda"]) < _cuda(min_cuda):
                        continue
                    free = dc["stock"].get(cloud, {}).get(g["id"], 0)
                    level = _level(free, count)
                    cudas[dc["cuda"]] = cudas.get(dc["cuda"], False) or level != "NONE"
                    if level != "NONE":
                        dcs.append({"id": dc["id"], "name": dc["id"], "availability": level})
                order = ["NONE", "LOW", "MEDIUM", "HIGH"]
                item["availability"] = max((d["availability"] for d in dcs), key=order.index, default="NONE")
                if dcs:
                    item["dataCenters"] = dcs
                item["cudaVersions"] = [{"version": v, "available": a} for v, a in sorted(cudas.items())]
            out.append(item)
        return Reply(200, {"gpus": out})

    # -- pods --------------------------------------------------------------------------------------
    def _create(self, c: RouteCall) -> Reply:
        spec = c.body
        self._log("createPod", spec)
        if not isinstance(spec, dict):
            return problem(422, "Unprocessable Entity", "body must be a JSON object")
        unknown = sorted(set(spec) - CREATE_FIELDS)
        if unknown:
            return problem(422, "Unprocessable Entity", "invalid request", [f"unknown field {k}" for k in unknown])
        if not spec.get("name") or not spec.get("image"):
            return problem(422, "Unprocessable Entity", "invalid request", ["name and image are required"])
        gpu = spec.get("gpu")
        if not isinstance(gpu, dict) or spec.get("cpu") is not None:
            return problem(400, "Bad Request", "set exactly one of gpu or cpu")
        if gpu.get("minCudaVersion") and gpu.get("allowedCudaVersions"):
            return problem(400, "Bad Request", "minCudaVersion and allowedCudaVersions are mutually exclusive")
        gtype = next((g for g in self.gpu_types if g["id"] == gpu.get("id")), None)
        if gtype is None:
            return problem(400, "Bad Request", f"unknown GPU type {gpu.get('id')!r}")
        count = int(gpu.get("count") or 1)
        cloud = spec.get("cloud") or "SECURE"
        mounts = spec.get("mounts") or {}
        persistent = mounts.get("persistent")
        network = mounts.get("network") or []
        if persistent is not None and (not isinstance(persistent.get("size"), int) or persistent["size"] < 10
                                       or not persistent.get("path")):
            return problem(422, "Unprocessable Entity", "invalid request", ["mounts.persistent needs size >= 10 and path"])
        volume = None
        if network:
            if any(not m.get("path") for m in network):
                return problem(422, "Unprocessable Entity", "invalid request", ["mounts.network[].path is required"])
            volume = self.volumes.get(str(network[0].get("volumeId")))
            if volume is None:
                return problem(404, "Not Found", f"network volume {network[0].get('volumeId')} does not exist")
            if cloud != "SECURE":
                return problem(400, "Bad Request", "network volumes are available on Secure Cloud only")
        wanted = spec.get("dataCenterIds") or [dc["id"] for dc in self.data_centers]
        min_cuda = gpu.get("minCudaVersion")
        with self.lock:
            dc = next((d for d in self.data_centers if d["id"] in wanted
                       and d["stock"].get(cloud, {}).get(gtype["id"], 0) >= count
                       and (volume is None or volume["dataCenter"] == d["id"])
                       and (not min_cuda or _cuda(d["cuda"]) >= _cuda(min_cuda))), None)
            if c.no_capacity or dc is None:
                return problem(400, "Bad Request", NO_CAPACITY_DETAIL)
            if (cloud, dc["id"]) in self.closed_pools:
                return problem(403, "Forbidden", "Your account cannot access the requested pool.")
            dc["stock"][cloud][gtype["id"]] -= count
        disk = int(spec.get("disk") or 0)
        volume_gb = int(persistent["size"]) if persistent else 0
        rate = gtype["price"][cloud.lower()] * count * self.billed_markup.get(dc["id"], 1.0)
        cost = round(rate + (disk * 0.10 + volume_gb * 0.10) / 730.0, 6)
        pod_id = "".join(self._rng.choice(string.ascii_lowercase + string.digits) for _ in range(14))
        env = spec.get("env") or {}
        pod = EmuPod(pod_id=pod_id, label=spec["name"], gpu_name=gtype["id"], gpu_count=count,
                     image=str(spec["image"]), price_per_hour=cost, spot=False, bid=None,
                     behaviour=self.next_behaviour())
        for var in ("PUBLIC_KEY", "SSH_PUBLIC_KEY"):
            for line in str(env.get(var) or "").splitlines():
                pod.add_key(line)
        if spec.get("startSsh") and not env.get("PUBLIC_KEY"):
            for line in self.account_keys:
                pod.add_key(line)
        self.pod_info[pod_id] = {"cloud": cloud, "dc": dc["id"], "disk": disk, "volume_gb": volume_gb,
                                 "mounts": mounts, "cuda": dc["cuda"], "network_volume": volume["id"] if volume else None}
        self.container_dir(pod_id).mkdir(parents=True, exist_ok=True)
        self.volume_disk_dir(pod_id).mkdir(parents=True, exist_ok=True)
        self.add_pod(pod)
        self.ledger.record(pod_id, "created", label=pod.label)
        return Reply(201, self._render(pod, advance=False))

    def _get(self, c: RouteCall) -> Reply:
        self._log("getPod", {"id": c.groups["id"]})
        with self.lock:
            pod = self.pods.get(c.groups["id"])
            if pod is None:
                return problem(404, "Not Found", "The requested Pod does not exist.")
            pod.polls += 1
            return Reply(200, self._render(pod, advance=True))

    def _list(self, c: RouteCall) -> Reply:
        self._log("listPods", dict(c.query))
        with self.lock:
            pods = [self._render(p, advance=False) for p in self.pods.values()]
        if not self.pods_page_size:
            return Reply(200, {"pods": pods})
        start = int(c.query.get("cursor") or 0)
        end = start + self.pods_page_size
        more = end < len(pods)
        return Reply(200, {"pods": pods[start:end], "truncated": more, "nextCursor": str(end) if more else None})

    def _delete(self, c: RouteCall) -> Reply:
        self._log("deletePod", {"id": c.groups["id"]})
        if self.end_pod(c.groups["id"], "terminated", c.by) is None:
            return problem(404, "Not Found", "The requested Pod does not exist.")
        return Reply(204, text="")

    def _action(self, c: RouteCall) -> Reply:
        action = c.body.get("action") if isinstance(c.body, dict) else None
        self._log("podAction", {"id": c.groups["id"], "action": action})
        pod_id = c.groups["id"]
        with self.lock:
            pod = self.pods.get(pod_id)
        if pod is None:
            return problem(404, "Not Found", "The requested Pod does not exist.")
        if action not in ("start", "stop", "restart", "terminate"):
            return problem(422, "Unprocessable Entity", "invalid request", ["action must be start|stop|restart|terminate"])
        status = self._status(pod)
        allowed = {"RUNNING": ("stop", "restart", "terminate"), "EXITED": ("start", "terminate"),
                   "ERROR": ("start", "terminate")}.get(status, ("stop", "terminate"))
        if action not in allowed:
            return problem(409, "Conflict", f"action {action} is not valid for a pod that is {status}")
        if action == "terminate":
            self.end_pod(pod_id, "terminated", c.by)
            return Reply(204, text="")
        if action == "stop":
            self.end_pod(pod_id, "stopped", c.by)
        elif action == "start":
            self.start_pod(pod_id)
        elif action == "restart":
            self.restart_container(pod_id)
        with self.lock:
            return Reply(200, self._render(pod, advance=False))

    def on_end(self, pod_id: str, event: str) -> None:
        if event in ("stopped", "preempted") and pod_id in self.pod_info:
            # "Container disk ... erased when Pod stops" (pricing.mdx L46)
            shutil.rmtree(self.container_dir(pod_id), ignore_errors=True)
            self.container_dir(pod_id).mkdir(parents=True, exist_ok=True)

    def end_pod(self, pod_id: str, event: str, by: str) -> EmuPod | None:
        pod = super().end_pod(pod_id, event, by)
        info = self.pod_info.get(pod_id)
        if pod is not None and info is not None:
            if event in ("stopped", "preempted", "terminated") and not info.get("released"):
                info["released"] = True  # a stopped pod's GPUs go back to the pool (it may not start again)
                with self.lock:
                    dc = next(d for d in self.data_centers if d["id"] == info["dc"])
                    stock = dc["stock"].setdefault(info["cloud"], {})
                    stock[pod.gpu_name] = stock.get(pod.gpu_name, 0) + pod.gpu_count
        return pod

    def start_pod(self, pod_id: str) -> None:
        with self.lock:
            pod = self.pods[pod_id]
            info = self.pod_info[pod_id]
            if info.get("released"):
                dc = next(d for d in self.data_centers if d["id"] == info["dc"])
                dc["stock"][info["cloud"]][pod.gpu_name] = dc["stock"][info["cloud"]].get(pod.gpu_name, 0) - pod.gpu_count
                info["released"] = False
            pod.stopped = pod.exited = False
            pod.polls = 0
        self.ledger.record(pod_id, "started", label=pod.label)

    def restart_container(self, pod_id: str) -> None:
        """The pod's container starts again on its host (``restart``, or the host's own restart): what
        ran in it dies, its volume disk stays, and its start command runs again (startcmd.py). The
        container disk is kept: no source says a restart erases it (only a stop, pricing.mdx L46)."""
        with self.lock:
            pod = self.pods[pod_id]
            pod.keep_port = pod.sshd.port if pod.sshd is not None else pod.keep_port
            pod.stop_sshd()
        self.boot(pod)
        self.ledger.record(pod_id, "restarted", label=pod.label)

    def _status(self, pod: EmuPod) -> str:
        if pod.stopped or pod.exited:
            return "EXITED"
        return "RUNNING" if pod.sshd is not None else "STARTING"

    def _render(self, pod: EmuPod, *, advance: bool) -> dict[str, Any]:
        b = pod.behaviour
        if advance and b.exit_after_polls is not None and pod.polls > b.exit_after_polls:
            pod.exited = True
            pod.stop_sshd()
        info = self.pod_info.get(pod.pod_id, {})
        runtime = None
        direct = None
        if not (pod.stopped or pod.exited) and not b.stuck and pod.polls > b.pending_polls:
            sshd = self.boot(pod) if advance or pod.sshd else None
            if sshd is not None:
                runtime = {"uptime": max(0, pod.polls - b.pending_polls), "ports": [
                    {"private": 22, "public": sshd.port, "type": "tcp", "ip": "127.0.0.1"}]}
                direct = {"host": "127.0.0.1", "port": sshd.port, "username": "root",
                          "command": f"ssh root@127.0.0.1 -p {sshd.port}"}
                if b.no_public_ip:  # a host without a public IP (use-ssh.mdx L110): no 22/tcp published
                    runtime["ports"] = [{"private": 22, "public": None, "type": "tcp", "ip": None}]
                    direct = None
        status = "EXITED" if (pod.stopped or pod.exited) else ("RUNNING" if runtime else "PROVISIONING")
        mounts = info.get("mounts") or {}
        return {
            "id": pod.pod_id, "name": pod.label, "status": status, "image": pod.image,
            "actions": {"RUNNING": ["stop", "restart", "terminate"], "EXITED": ["start", "terminate"]}.get(
                status, ["stop", "terminate"]),
            "gpu": {"id": pod.gpu_name, "count": pod.gpu_count}, "disk": info.get("disk", 0), "mounts": mounts,
            "cloud": info.get("cloud"), "dataCenterId": info.get("dc"), "cudaVersion": info.get("cuda"),
            "cost": 0.0 if status == "EXITED" else pod.price_per_hour, "runtime": runtime,
            "ssh": {"proxy": None, "direct": direct}, "ports": ["22/tcp"], "env": {}, "locked": False,
        }

    # -- account and volumes -----------------------------------------------------------------------
    def _put_keys(self, c: RouteCall) -> Reply:
        keys = c.body.get("keys") if isinstance(c.body, dict) else None
        if not isinstance(keys, list):
            return problem(422, "Unprocessable Entity", "invalid request", ["keys is required"])
        self.account_keys = [str(k) for k in keys]
        return Reply(200, {"keys": list(self.account_keys)})

    def _create_volume_rest(self, c: RouteCall) -> Reply:
        body = c.body
        self._log("createNetworkVolume", body)
        if not isinstance(body, dict):
            return problem(422, "Unprocessable Entity", "body must be a JSON object")
        unknown = sorted(set(body) - VOLUME_FIELDS)
        if unknown:
            return problem(422, "Unprocessable Entity", "invalid request", [f"unknown field {k}" for k in unknown])
        name, size, dc = body.get("name"), body.get("size"), body.get("dataCenter")
        if not isinstance(name, str) or not 1 <= len(name) <= 255:
            return problem(422, "Unprocessable Entity", "invalid request", ["name: 1 to 255 characters"])
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 4000:
            return problem(422, "Unprocessable Entity", "invalid request", ["size: a whole number of GB, 1 to 4000"])
        if dc not in {d["id"] for d in self.data_centers}:
            return problem(400, "Bad Request", f"unknown data center {dc!r}")
        if self.volume_create_fails > 0:
            self.volume_create_fails -= 1
            return problem(400, "Bad Request", f"could not allocate {size} GB in {dc}")
        with self.lock:
            volume_id = self.volume_ids.pop(0) if self.volume_ids else None
        # "When omitted ... the requested data center's default (primary) storage tier" (openapi
        # CreateNetworkVolumeRequest.type); ``default_volume_type`` says which tier that is per centre.
        kind = body.get("type") or self.default_volume_type.get(dc, "STANDARD")
        if kind not in ("STANDARD", "HIGH_PERFORMANCE"):
            return problem(422, "Unprocessable Entity", "invalid request", ["type: STANDARD or HIGH_PERFORMANCE"])
        volume_id = self.create_volume(name, dc, size, volume_id=volume_id, volume_type=kind)
        return Reply(201, dict(self.volumes[volume_id]))

    def _delete_volume(self, c: RouteCall) -> Reply:
        if self.volumes.pop(c.groups["id"], None) is None:
            return problem(404, "Not Found", "The requested network volume does not exist.")
        return Reply(204, text="")

    # -- test controls -----------------------------------------------------------------------------
    def create_volume(self, name: str, data_center_id: str = "EU-RO-1", size_gb: int = 50, *,
                      volume_id: str | None = None, volume_type: str = "STANDARD") -> str:
        """A network volume; its store is a folder of this emulator (what its pods see at the mount)."""
        volume_id = volume_id or "".join(self._rng.choice(string.ascii_lowercase + string.digits) for _ in range(10))
        self.volumes[volume_id] = {"id": volume_id, "name": name, "size": size_gb, "dataCenter": data_center_id,
                                   "type": volume_type}
        self.volume_dir(volume_id).mkdir(parents=True, exist_ok=True)
        return volume_id

    def preempt(self, pod_id: str) -> None:
        """The pod stopped by RunPod, not by gpucli (its host went away, or the balance reached $0:
        "Pods are automatically stopped when your account balance reaches $0", pods/pricing.mdx L59)."""
        if self.end_pod(pod_id, "preempted", "preemption") is None:
            raise KeyError(pod_id)

    def pod_volumes(self) -> dict[str, str]:
        """Pod id -> the network volume it was created with."""
        return {p: i["network_volume"] for p, i in self.pod_info.items() if i.get("network_volume")}

    def volume_dir(self, volume_id: str) -> Path:
        return Path(self.root) / "volumes" / volume_id

    def container_dir(self, pod_id: str) -> Path:
        """The pod's container disk: emptied when the pod stops."""
        return Path(self.root) / "container" / pod_id

    def volume_disk_dir(self, pod_id: str) -> Path:
        """The pod's volume disk (``mounts.persistent``): kept across stop/start until terminate."""
        return Path(self.root) / "volume-disk" / pod_id

    def stopped_usd_per_month(self, pod_id: str) -> float:
        """What a stopped pod bills per month: its volume disk at $0.20/GB/month (pricing.mdx L47)."""
        return self.pod_info[pod_id]["volume_gb"] * 0.20
