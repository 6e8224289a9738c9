"""A vast.ai REST emulator: the subset gpucli uses, with vast's shapes and quirks.

Faithful to providers.md §2: Bearer auth; ``POST /api/v0/bundles/`` evaluating ``{field: {op: value}}``
filters (numbers arrive as strings) with ``order``/``type``/``limit``; ``PUT /api/v0/asks/{id}/``
answering ``{"success": true, "new_contract": N}``, where a bid is the ``price`` key and a bid below
``min_bid`` creates a *stopped* contract and still reports an error carrying ``new_contract``;
``GET /api/v0/instances/{id}/`` -> ``{"instances": obj|null}``; ``GET /api/v1/instances/`` paged by
``next_token`` (25 per page); the v0 collection answers 410 (the SkyPilot claim, unverified);
``DELETE /api/v0/instances/{id}/`` of a gone instance 404 ``not_found`` "Instance not found"
(destroy_instance.yaml L64-78); a wrong key 404 ``auth_error`` (show_charges.yaml); ``ports`` as a Docker map with a string
``HostPort``; ``actual_status`` null -> loading -> running. The no-capacity answer (``no_such_ask``) and
the HTTP statuses of errors are this emulator's choices where the reference records none.

Strictness (each switchable): ``runtype`` must be space-separated words the official CLI uses
(``ssh_direc ssh_proxy`` from vastai/cli/commands/instances.py ``get_runtype``); an instance has the
proxy route (``ssh_host``/``ssh_port``: ``localhost`` and a forwarding port, so a different host:port
than direct, as ``sshN.vast.ai`` is) when its runtype asks for it, and the direct route
(``public_ipaddr`` + ``ports["22/tcp"]``) only when its runtype asks for it *and* its machine has
direct ports (``direct_port_count > 0``); ``attach_requires_running``: attaching a key to an instance
that is not running yet fails (no source says it works; the safe assumption); new instances take the
account's SSH keys (``/api/v0/ssh/``, guides ssh.mdx); an offer that is gone answers the documented
404 ``invalid_args`` "... no_such_ask ..." (or 410 ``no_such_ask`` with ``gone_ask_status = 410``);
``dph_total`` is priced at the search's ``allocated_storage`` (the offers' listed price is at the CLI's
default 5 GB) and an instance bills its ``disk``; a too-low bid with ``cancel_unavail`` creates nothing.
``GET /api/v0/users/current`` answers ``credit``.

Instances: each one's environment carries ``CONTAINER_ID`` and an instance-scoped ``CONTAINER_API_KEY``
(a fresh random key, also the create answer's ``instance_api_key``; vast documents both as set in every
instance); ``VAST_URL`` only with the ``pod_env_has_base_url`` switch (off, as on real instances). That key may ``PUT /api/v0/instances/{own id}/``
``{"state": "stopped"}`` and ``DELETE`` its own id only; anything else answers 403 (the status and
message are this emulator's choice).
"""

from __future__ import annotations

import base64
import re
import time
from typing import Any

from tests.support.emulators.common import EmulatorBase, EmuPod, Reply
from tests.support.emulators.startcmd import boot_and_start
from tests.support.emulators.vastnet import VastNet
from tests.support.sshd import SshServer

_CONTROL = {"order", "type", "limit", "allocated_storage", "disable_bundling"}


def _offer(oid: int, gpu: str, n: int, ram_mb: int, dph: float, min_bid: float, rel: float, down: float,
           geo: str, dlperf: float, cuda: float = 12.8, verified: bool = True) -> dict[str, Any]:
    # cuda_max_good: a JSON number, the newest CUDA the host's driver runs (search_offers.yaml L134-136,
    # 11.2 in its example answer)
    return {"id": oid, "ask_contract_id": oid, "bundle_id": oid * 10, "machine_id": oid % 100000,
            "host_id": oid % 1000, "compute_cap": 890, "cpu_cores": 32, "cpu_cores_effective": 16.0,
            "cpu_ram": 65536, "cuda_max_good": cuda, "direct_port_count": 20, "disk_space": 200.0,
            "dlperf": dlperf, "dlperf_per_dphtotal": round(dlperf / dph, 4), "dph_base": round(dph * 0.95, 4),
            "dph_total": dph, "geolocation": geo, "gpu_name": gpu, "gpu_ram": ram_mb,
            "gpu_total_ram": ram_mb * n, "hosting_type": 0, "inet_down": down, "inet_up": down / 2,
            "is_bid": False, "min_bid": min_bid, "num_gpus": n, "public_ipaddr": "127.0.0.1",
            "reliability": rel, "reliability2": rel, "rentable": True, "rented": False, "score": dlperf * rel,
            "static_ip": True, "storage_cost": 0.1, "verification": "verified" if verified else "unverified",
            "verified": verified, "external": False,
            # $/GB in and out (search_offers.yaml L144-148); the values are invented, varying per host
            "inet_up_cost": round(0.002 + (oid % 7) * 0.003, 4), "inet_down_cost": round(0.001 + (oid % 5) * 0.002, 4),
            # seconds the offer stays rentable from now: its contract's end (search_offers.yaml L104-106,
            # faq/instances.mdx L13); 60 days unless a test shortens it
            "duration": 60 * 86400.0}


OFFERS: list[dict[str, Any]] = [
    _offer(1001, "RTX 3090", 4, 24576, 0.88, 0.40, 0.98, 500.0, "Texas, US", 60.0),
    _offer(1002, "RTX 3090", 1, 24576, 0.21, 0.10, 0.99, 800.0, "Quebec, CA", 15.0),
    _offer(1003, "RTX 4090", 4, 24564, 1.60, 0.90, 0.97, 300.0, "Taipei, TW", 110.0),
    _offer(1004, "RTX 5090", 4, 32607, 2.40, 1.30, 0.96, 1000.0, "Stockholm, SE", 170.0),
    _offer(1005, "RTX 3090", 8, 24576, 1.70, 0.80, 0.90, 150.0, "Hanoi, VN", 120.0),
    _offer(1006, "A100 SXM4", 1, 81920, 1.10, 0.70, 0.995, 2000.0, "Oregon, US", 40.0),
    _offer(1007, "H100 SXM", 8, 81559, 16.0, 9.0, 0.999, 5000.0, "Virginia, US", 900.0),
    _offer(1008, "RTX 4090", 1, 24564, 0.40, 0.22, 0.93, 100.0, "Berlin, DE", 28.0, verified=False),
    _offer(1009, "RTX 3090", 4, 24576, 0.95, 0.45, 0.97, 250.0, "Ohio, US", 61.0),
    _offer(1010, "RTX 4090", 2, 24564, 0.78, 0.40, 0.985, 600.0, "Oslo, NO", 56.0),
]


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _eq(field: str, actual: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or expected is None:
        return actual == expected
    a, e = _num(actual), _num(expected)
    if a is not None and e is not None:
        return a == e
    if field == "geolocation" and isinstance(actual, str):
        return actual == expected or actual.rsplit(",", 1)[-1].strip() == str(expected)
    return str(actual) == str(expected)


def _passes(offer: dict[str, Any], field: str, op: str, value: Any) -> bool:
    actual = offer.get(field)
    if op == "eq":
        return _eq(field, actual, value)
    if op == "neq":
        return not _eq(field, actual, value)
    if op in ("in", "notin"):
        hit = any(_eq(field, actual, v) for v in (value if isinstance(value, list) else [value]))
        return hit if op == "in" else not hit
    a, e = _num(actual), _num(value)
    if a is None or e is None:
        return False
    return {"gt": a > e, "gte": a >= e, "lt": a < e, "lte": a <= e}.get(op, False)


_RUNTYPE_WORDS = {"ssh", "ssh_proxy", "ssh_direct", "ssh_direc", "jupyter", "jupyter_proxy", "jupyter_direct",
                  "jupyter_direc", "args"}
DEFAULT_STORAGE_GB = 5.0  # the vastai CLI's --storage default; OFFERS list dph_total at this disk


def _storage_dph(offer: dict[str, Any], disk_gb: float) -> float:
    """$/h of ``disk_gb`` on this machine (storage_cost is $/GB/month; gpuhunt's formula)."""
    return float(offer.get("storage_cost") or 0.0) * disk_gb / 30 / 24


def _priced(offer: dict[str, Any], disk_gb: float) -> float:
    return round(offer["dph_total"] + _storage_dph(offer, disk_gb) - _storage_dph(offer, DEFAULT_STORAGE_GB), 6)


_INSTANCE = re.compile(r"^/api/v0/instances/(\d+)/$")
_INSTANCE_SSH = re.compile(r"^/api/v0/instances/(\d+)/ssh/$")
_ASK = re.compile(r"^/api/v0/asks/(\d+)/$")


class VastEmulator(EmulatorBase):
    provider = "vast"

    def __init__(self, root: Any, api_key: str = "vast-test-key") -> None:
        super().__init__(root, api_key)
        self.offers = [dict(o) for o in OFFERS]
        self.search_bodies: list[dict[str, Any]] = []
        self.create_bodies: list[tuple[str, dict[str, Any]]] = []
        self.onstart: dict[str, str] = {}  # instance id -> its onstart script (run again at every resume)
        self.run_onstart = False  # run it on resume (off: the emulator's pods are this machine's user)
        self.run_start_commands = False  # run a container's start command at every start (startcmd.py)
        self.started_containers: set[str] = set()
        self._next_id = 20_000_000
        self.offers_rentable_again = True  # keep offers rentable after a rent (fault loops rent many)
        self.attach_requires_running = True
        self.strict_runtype = True
        self.gone_ask_status = 404
        self.honour_cancel_unavail = True
        self.account_keys: list[dict[str, Any]] = []
        self.balance_usd: float | None = 42.5
        self.runtypes: dict[str, str] = {}  # pod id -> runtype it was created with
        self.offer_durations: dict[str, float] = {}  # pod id -> its offer's duration (s) when rented
        self.direct_ports: dict[str, bool] = {}  # pod id -> its machine has direct ports
        # Each route a metered forwarder (bandwidth billed; GET /api/v0/charges/), and the fault switch
        # ``net.silent`` (a route that accepts TCP and never answers): tests/support/emulators/vastnet.py.
        self.net = VastNet(self)
        #: Price increases hosts ask on live contracts (vast-cli vastai/api/price_increase.py row shape);
        #: ``price_answers`` records every accept/reject PUT (gpucli must never send one).
        self.price_increases: list[dict[str, Any]] = []
        self.price_answers: list[tuple[str, Any]] = []
        self.add_route("GET", r"/api/v0/instances/pending-price-increases/", "pending",
                       lambda c: Reply(200, {"success": True, "count": len(self.price_increases), "truncated": False,
                                             "pending_price_increases": list(self.price_increases)}))
        self.add_route("PUT", r"/api/v0/instances/(?P<verb>accept|reject)-price-increase/", "price",
                       lambda c: (self.price_answers.append((c.groups["verb"], c.body)),
                                  Reply(200, {"success": True}))[1])

    def unauthorized(self) -> Reply:
        # A wrong or revoked key: 404 ``auth_error`` "Invalid user key" (vast-ai/docs show_charges.yaml
        # 404; jhammant/AIonDemandCluster PR#1 "a wrong/revoked key comes back as HTTP 404").
        return Reply(404, {"success": False, "error": "auth_error", "msg": "Invalid user key"})

    def forbidden(self, endpoint: str) -> Reply:
        return Reply(403, {"success": False, "error": "forbidden",
                           "msg": "This key is scoped to one instance: it can only stop or destroy it."})

    def boot(self, pod: EmuPod) -> SshServer:
        """Start the container; its start command runs at every start with ``run_start_commands`` (startcmd.py)."""
        return boot_and_start(self, pod, super().boot)

    def pod_environment(self, pod: EmuPod) -> dict[str, str]:
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "CONTAINER_ID": pod.pod_id, "CONTAINER_API_KEY": pod.scoped_key,
                "VAST_CONTAINERLABEL": f"C.{pod.pod_id}"}
        if self.pod_env_has_base_url:
            env["VAST_URL"] = self.url
        return env

    def pod_key_allows(self, pod_id: str, method: str, path: str, body: Any, endpoint: str) -> bool:
        match = _INSTANCE.match(path)
        if match is None or match.group(1) != pod_id:
            return False
        if endpoint == "terminate":
            return True
        return endpoint == "stop" and isinstance(body, dict) and body.get("state") == "stopped"

    def classify(self, method: str, path: str, body: Any) -> str:
        if path.rstrip("/") == "/api/v0/ssh":
            return "keys"
        if path.rstrip("/") == "/api/v0/users/current":
            return "user"
        if path == "/api/v0/bundles/":
            return "search"
        if _ASK.match(path):
            return "create"
        if _INSTANCE_SSH.match(path):
            return "attach"
        if _INSTANCE.match(path):
            return {"GET": "get", "DELETE": "terminate", "PUT": "stop"}.get(method, "other")
        if path.startswith("/api/v1/instances"):
            return "list"
        return "other"

    def handle(self, method: str, path: str, query: dict[str, str], body: Any, endpoint: str, *,
               no_capacity: bool, by: str) -> Reply:
        if endpoint == "search" and method == "POST":
            return self._search(body if isinstance(body, dict) else {})
        if endpoint == "create" and method == "PUT":
            return self._create(_ASK.match(path).group(1), body if isinstance(body, dict) else {},  # type: ignore[union-attr]
                                no_capacity)
        if endpoint == "keys":
            return self._keys(method, body)
        if endpoint == "user" and method == "GET":
            return Reply(200, {"id": 1, "username": "emu", "credit": self.balance_usd, "balance": 0.0})
        if endpoint == "attach" and method == "POST":
            pod = self.pods.get(_INSTANCE_SSH.match(path).group(1))  # type: ignore[union-attr]
            if pod is None:
                return Reply(404, {"success": False, "error": "no_such_instance", "msg": "Instance not found"})
            if self.attach_requires_running and pod.sshd is None:
                return Reply(400, {"success": False, "error": "invalid_args",
                                   "msg": "Instance is not running; cannot attach ssh key"})
            with self.lock:
                pod.add_key(str((body or {}).get("ssh_key") or ""))
            return Reply(200, {"success": True, "msg": "SSH key attached"})
        if endpoint in ("get", "terminate", "stop"):
            pod_id = _INSTANCE.match(path).group(1)  # type: ignore[union-attr]
            return getattr(self, "_" + endpoint)(pod_id, body, by)
        if path in ("/api/v0/instances/", "/api/v0/instances") and method == "GET":
            return Reply(410, {"success": False, "error": "gone", "msg": "Use /api/v1/instances/ instead"})
        if endpoint == "list" and method == "GET":
            return self._list(query)
        return Reply(404, {"success": False, "error": "not_found", "msg": f"no route {method} {path}"})

    # -- operations ------------------------------------------------------------------------------
    def _keys(self, method: str, body: Any) -> Reply:
        with self.lock:
            if method == "GET":
                if not self.account_keys:  # vast-ai/docs show_ssh_keys.yaml L54: 404 "No SSH keys found"
                    return Reply(404, {"success": False, "error": "not_found", "msg": "No SSH keys found"})
                return Reply(200, list(self.account_keys))
            if method == "POST":
                key = str((body or {}).get("ssh_key") or "").strip()
                if not key.startswith(("ssh-", "ecdsa-", "sk-")):
                    return Reply(400, {"success": False, "error": "invalid_args", "msg": "invalid ssh key"})
                entry = {"id": len(self.account_keys) + 1, "user_id": 1, "public_key": key,
                         "created_at": time.time()}
                self.account_keys.append(entry)
                return Reply(200, {"success": True, "key": entry})
        return Reply(405, {"success": False, "error": "method_not_allowed", "msg": method})

    def _search(self, body: dict[str, Any]) -> Reply:
        with self.lock:
            self.search_bodies.append(body)
        storage = _num(body.get("allocated_storage"))
        storage = DEFAULT_STORAGE_GB if storage is None else storage
        rows = []
        for listed in self.offers:
            offer = dict(listed, dph_total=_priced(listed, storage))
            ok = all(_passes(offer, f, op, v) for f, cond in body.items() if f not in _CONTROL
                     and isinstance(cond, dict) for op, v in cond.items())
            if ok:
                rows.append(dict(offer, is_bid=body.get("type") == "bid"))
        for field, direction in reversed(body.get("order") or []):
            rows.sort(key=lambda o, f=field: _num(o.get(f)) or 0.0, reverse=direction == "desc")
        limit = body.get("limit")
        if isinstance(limit, int) and limit > 0:
            rows = rows[:limit]
        return Reply(200, {"offers": rows})

    def _create(self, ask_id: str, body: dict[str, Any], no_capacity: bool) -> Reply:
        with self.lock:
            self.create_bodies.append((ask_id, body))
            onstart = body.get("onstart") if isinstance(body, dict) else None
            offer = next((o for o in self.offers if str(o["id"]) == ask_id), None)
        if no_capacity or offer is None or not offer["rentable"]:
            if self.gone_ask_status == 410:
                return Reply(410, {"success": False, "error": "no_such_ask",
                                   "msg": f"Instance type by id {ask_id} is not available."})
            return Reply(404, {"success": False, "error": "invalid_args",
                               "msg": f"error 404/3603: no_such_ask  Instance type by id {ask_id} is not available.",
                               "ask_id": int(ask_id)})
        runtype = str(body.get("runtype") or "ssh")
        if self.strict_runtype and not set(runtype.split()) <= _RUNTYPE_WORDS:
            return Reply(400, {"success": False, "error": "invalid_args", "msg": f"invalid runtype {runtype!r}"})
        price = body.get("price")
        spot = price is not None
        too_low = spot and (not isinstance(price, int | float) or price < offer["min_bid"])
        if too_low and body.get("cancel_unavail") is True and self.honour_cancel_unavail:
            return Reply(400, {"success": False, "error": "invalid_price",
                               "msg": f"Bid price {price} is below the minimum {offer['min_bid']}; cancelled"})
        disk = _num(body.get("disk")) or 10.0
        with self.lock:
            self._next_id += 1
            pod_id = str(self._next_id)
            pod = EmuPod(pod_id=pod_id, label=body.get("label"), gpu_name=offer["gpu_name"],
                         gpu_count=offer["num_gpus"], image=str(body.get("image")),
                         price_per_hour=float(price) if spot and not too_low else _priced(offer, disk),
                         spot=spot, bid=float(price) if isinstance(price, int | float) else None,
                         behaviour=self.next_behaviour())
            pod.stopped = bool(too_low)
            pod.disk_gb = disk
            if isinstance(onstart, str):
                self.onstart[pod_id] = onstart
            for entry in self.account_keys:  # new instances take the account's keys
                pod.add_key(str(entry["public_key"]))
            self.runtypes[pod_id] = runtype
            self.offer_durations[pod_id] = float(_num(offer.get("duration")) or 60 * 86400.0)
            self.direct_ports[pod_id] = (_num(offer.get("direct_port_count")) or 0) > 0
            self.add_pod(pod)
            self.net.created(pod, offer)
            if not self.offers_rentable_again:
                offer["rentable"] = False
        self.ledger.record(pod_id, "created", label=pod.label, spot=spot, bid=pod.bid)
        if too_low:
            return Reply(400, {"success": False, "error": "invalid_price",
                               "msg": f"Bid price {price} is below the minimum {offer['min_bid']}",
                               "new_contract": int(pod_id)})
        return Reply(200, {"success": True, "new_contract": int(pod_id), "instance_api_key": pod.scoped_key})

    def _render(self, pod: EmuPod, *, advance: bool) -> dict[str, Any]:
        b = pod.behaviour
        if advance and b.exit_after_polls is not None and pod.polls > b.exit_after_polls:
            pod.exited = True
            pod.stop_sshd()
        inst: dict[str, Any] = {
            "id": int(pod.pod_id), "label": pod.label, "num_gpus": pod.gpu_count, "gpu_name": pod.gpu_name,
            "dph_total": pod.price_per_hour, "image_uuid": pod.image, "image_runtype": "ssh_direct",
            "public_ipaddr": "127.0.0.1", "start_date": pod.created_at, "status_msg": "",
            "intended_status": "running", "cur_state": "running", "next_state": "running",
            "actual_status": None, "ssh_host": None, "ssh_port": None, "ports": {},
            "direct_port_start": -1, "direct_port_end": -1, "is_bid": pod.spot,
            "storage_cost": 0.1, "disk_space": pod.disk_gb,
            # the rental end date, locked at rent from the offer's (faq/instances.mdx L13)
            "end_date": pod.created_at + self.offer_durations.get(pod.pod_id, 60 * 86400.0),
        }
        if pod.stopped:
            inst.update(actual_status="stopped", intended_status="stopped", cur_state="stopped",
                        next_state="stopped", status_msg="stopped")
        elif pod.exited:
            inst.update(actual_status=b.bad_state, status_msg="container exited with code 1")
        elif b.stuck or pod.polls <= b.pending_polls:
            inst["actual_status"] = None if pod.polls <= 1 and not b.stuck else "loading"
            inst["status_msg"] = "Pulling image"
        else:
            sshd = self.boot(pod) if advance or pod.sshd else None
            if sshd is not None:
                words = set(self.runtypes.get(pod.pod_id, "ssh").split())
                inst.update(actual_status="running", status_msg="running",
                            image_runtype=self.runtypes.get(pod.pod_id, "ssh"))
                if words & {"ssh", "ssh_proxy", "jupyter", "jupyter_proxy"}:
                    inst.update(ssh_host="localhost", ssh_port=self.net.proxy_port(pod))
                if words & {"ssh_direct", "ssh_direc", "jupyter_direct", "jupyter_direc"} and \
                        self.direct_ports.get(pod.pod_id, True):
                    port = self.net.direct_port(pod)
                    inst.update(ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(port)}]},
                                direct_port_start=port, direct_port_end=port)
            else:
                inst["actual_status"] = "loading"
        return inst

    def _get(self, pod_id: str, body: Any, by: str) -> Reply:
        with self.lock:
            pod = self.pods.get(pod_id)
            if pod is None:
                return Reply(200, {"instances": None})
            pod.polls += 1
            return Reply(200, {"instances": self._render(pod, advance=True)})

    def end_pod(self, pod_id: str, event: str, by: str) -> EmuPod | None:
        pod = super().end_pod(pod_id, event, by)
        if pod is not None and event == "terminated":
            self.net.terminated(pod_id)  # its direct port goes, its bill stops
        return pod

    def stop(self) -> None:
        super().stop()
        self.net.close()

    def _terminate(self, pod_id: str, body: Any, by: str) -> Reply:
        if self.end_pod(pod_id, "terminated", by) is None:  # destroy_instance.yaml L64-78
            return Reply(404, {"success": False, "error": "not_found", "msg": "Instance not found"})
        return Reply(200, {"success": True})

    def _stop(self, pod_id: str, body: Any, by: str) -> Reply:
        with self.lock:
            if pod_id not in self.pods:
                return Reply(404, {"success": False, "error": "no_such_instance", "msg": "Instance not found"})
            state = body.get("state") if isinstance(body, dict) else None
            if state == "running" and self.pods[pod_id].stopped:
                # vast-cli start_instance: PUT {"state": "running"} (manage_instance.yaml); the container
                # starts again and its onstart runs (guides/reference/faq/instances.mdx)
                pod = self.pods[pod_id]
                pod.stopped = pod.exited = False
                pod.polls = max(pod.polls, pod.behaviour.pending_polls + 1)
            elif state != "stopped":
                return Reply(200, {"success": True})  # another state change: nothing this emulator models
            else:
                self.end_pod(pod_id, "stopped", by)
                return Reply(200, {"success": True})
        self.boot(pod)
        self.ledger.record(pod_id, "started", label=pod.label)
        return Reply(200, {"success": True})

    def _list(self, query: dict[str, str]) -> Reply:
        limit = min(25, int(query.get("limit") or 25))
        start = int(base64.b64decode(query["after_token"]).decode()) if query.get("after_token") else 0
        with self.lock:
            pods = list(self.pods.values())
            page = [self._render(p, advance=False) for p in pods[start:start + limit]]
        end = start + len(page)
        token = base64.b64encode(str(end).encode()).decode() if end < len(pods) else None
        return Reply(200, {"instances": page, "next_token": token, "total_instances": len(pods),
                           "label_counts": {}})

    # -- test controls ---------------------------------------------------------------------------
    def preempt(self, pod_id: str) -> None:
        """Outbid / interrupted: cur_state, intended_status and next_state all become "stopped"."""
        if self.end_pod(pod_id, "preempted", "preemption") is None:
            raise KeyError(pod_id)

    def outbid(self, pod_id: str) -> None:
        """An interruptible instance outbid: paused (stopped); its processes die with the container.
        It still bills its storage ("Storage charges apply ... stopped", guides/instances/pricing.mdx)."""
        with self.lock:
            pod = self.pods.get(pod_id)
            if pod is not None and pod.sshd is not None:
                # The same instance on the same machine: its port mapping is kept for the resume (no
                # source says either way; keeping it is this emulator's choice).
                pod.keep_port = pod.sshd.port
        if self.end_pod(pod_id, "preempted", "outbid") is None:
            raise KeyError(pod_id)

    def expire(self, pod_id: str) -> None:
        """The rental end date is reached: "the rental contract expires and the instance is stopped"
        (faq/instances.mdx L13); it keeps billing storage until destroyed ("may be deleted 48 hours after
        expiration", instance-types.mdx L49 - not modelled: a test destroys it or asserts it stays)."""
        if self.end_pod(pod_id, "expired", "contract end") is None:
            raise KeyError(pod_id)

    def resume(self, pod_id: str) -> None:
        """Priority returns: a paused interruptible instance "resume[s] automatically"
        (guides/instances/choosing/instance-types.mdx L78, L93). The container starts again, so its
        ``onstart`` runs again (with the instance's environment); nothing gpucli started over SSH does."""
        import subprocess

        with self.lock:
            pod = self.pods[pod_id]
            pod.stopped = pod.exited = False
            pod.polls = max(pod.polls, pod.behaviour.pending_polls + 1)
        sshd = self.boot(pod)
        self.ledger.record(pod_id, "resumed", label=pod.label)
        script = self.onstart.get(pod_id)
        if script and self.run_onstart and not self.run_start_commands:  # else boot() ran it
            env = {**self.pod_environment(pod), "GPUCLI_EMU_POD": pod.marker,
                   "GPUCLI_POD_ENVIRON": str(pod.environ_path), "HOME": str(sshd.root)}
            subprocess.Popen(["/bin/sh", "-c", script], env=env, cwd=str(sshd.root), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
