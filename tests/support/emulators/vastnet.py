"""vast.ai's two SSH routes and its bandwidth bill, for the vast emulator (tests/support/emulators/vast.py).

Routes: "If the machine supports open ports our system will try to setup both a direct ssh connection
and a backup proxy connection" (vast-ai/docs guides/instances/connect/overview.mdx L45-46; ssh.mdx
L140-145: proxy SSH works on every machine, direct is faster). Here each route of an instance is a
:class:`MeteredForwarder` to its sshd: the direct one (``public_ipaddr`` + ``ports["22/tcp"]``) lives as
long as the instance, so its port survives an outbid pause; the proxy one (``ssh_host``/``ssh_port``)
lives as long as the container. Fault switch: a route named in ``VastNet.silent`` accepts TCP and never
sends a byte (a host whose firewall half-opens the mapped port) - no source describes that failure;
it is the one the issue reports.

Bandwidth: "Charges apply per byte transferred" (guides/instances/pricing.mdx L68-70); the offer's
``inet_down_cost``/``inet_up_cost`` are "Download/Upload bandwidth cost ($/GB)" (search_offers.yaml
L143-148), download and upload seen from the instance: bytes reaching it bill at ``inet_down_cost``
(charge type ``bwd``), bytes leaving it at ``inet_up_cost`` (``bwu``). ``GET /api/v0/charges/``
answers per-contract rows with ``gpu``/``disk``/``bwd``/``bwu`` items (api-reference/openapi/yaml
show_charges.yaml; ``select_filters`` with a ``day`` range is required, 400 without). GB is 1e9 bytes
here (no source says; the decimal unit the docs' $/GB reads as).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tests.support.emulators.common import Reply, RouteCall
from tests.support.emulators.forward import TcpForwarder

if TYPE_CHECKING:
    from tests.support.emulators.common import EmuPod

GB = 1e9


@dataclass
class Meter:
    """Bytes through every route of one instance, both ways, for its whole life."""

    to_pod: int = 0  # the instance downloads: billed at inet_down_cost
    from_pod: int = 0  # the instance uploads: billed at inet_up_cost


class MeteredForwarder(TcpForwarder):
    """A route to a pod's sshd that counts the bytes it carries into ``meter``. ``target`` gives the
    sshd's port now (None: the container is down, the connection is closed); ``silent()`` true: the
    route accepts TCP and never answers."""

    def __init__(self, target: Callable[[], int | None], meter: Meter, silent: Callable[[], bool]) -> None:
        self._target, self.meter, self._silent = target, meter, silent
        self._held: list[socket.socket] = []
        self._count_lock = threading.Lock()
        super().__init__(0)

    def _hold(self, client: socket.socket) -> bool:
        if self._silent():
            self._held.append(client)  # open, never a byte: no SSH banner ever comes
            return True
        return False

    def _upstream_port(self) -> int | None:
        return self._target()

    def _carried(self, n: int, inbound: bool) -> None:
        with self._count_lock:
            if inbound:
                self.meter.to_pod += n
            else:
                self.meter.from_pod += n

    def close(self) -> None:
        super().close()
        for s in self._held:
            s.close()


class VastNet:
    """The routes and meters of every instance of one vast emulator, and its charges endpoint."""

    def __init__(self, emulator: Any) -> None:
        self.emu = emulator
        self.silent: set[str] = set()  # "direct" and/or "proxy": those routes never send a banner
        self.meters: dict[str, Meter] = {}
        self.rates: dict[str, tuple[float, float]] = {}  # pod id -> (inet_down_cost, inet_up_cost) $/GB
        self.direct: dict[str, MeteredForwarder] = {}
        self.ended_at: dict[str, float] = {}
        self.contracts: dict[str, tuple[float, float, str | None]] = {}  # pod id -> (created at, $/h, label)
        emulator.add_route("GET", r"/api/v0/charges/?", "charges", self._charges)

    def created(self, pod: EmuPod, offer: dict[str, Any]) -> None:
        self.meters[pod.pod_id] = Meter()
        self.contracts[pod.pod_id] = (pod.created_at, pod.price_per_hour, pod.label)
        self.rates[pod.pod_id] = (float(offer.get("inet_down_cost") or 0.0), float(offer.get("inet_up_cost") or 0.0))

    def _forwarder(self, pod: EmuPod, route: str) -> MeteredForwarder:
        return MeteredForwarder(lambda: pod.sshd.port if pod.sshd is not None else None,
                                self.meters.setdefault(pod.pod_id, Meter()), lambda: route in self.silent)

    def proxy_port(self, pod: EmuPod) -> int:
        if pod.proxy is None:  # closed with the container (EmuPod.stop_sshd), made again at its next start
            pod.proxy = self._forwarder(pod, "proxy")
        return pod.proxy.port

    def direct_port(self, pod: EmuPod) -> int:
        fwd = self.direct.get(pod.pod_id)
        if fwd is None:
            fwd = self.direct[pod.pod_id] = self._forwarder(pod, "direct")
        return fwd.port

    def terminated(self, pod_id: str) -> None:
        self.ended_at.setdefault(pod_id, time.time())
        fwd = self.direct.pop(pod_id, None)
        if fwd is not None:
            fwd.close()

    def close(self) -> None:
        for pod_id in list(self.direct):
            self.terminated(pod_id)

    # -- the bill ----------------------------------------------------------------------------------
    def bandwidth_usd(self, pod_id: str) -> tuple[float, float]:
        """(download, upload) $ so far: bytes reaching the instance at inet_down_cost, leaving at inet_up_cost."""
        meter = self.meters.get(pod_id, Meter())
        down, up = self.rates.get(pod_id, (0.0, 0.0))
        return meter.to_pod / GB * down, meter.from_pod / GB * up

    def charges_of(self, pod_id: str, created_at: float, price_per_hour: float, label: str | None) -> dict[str, Any]:
        end = self.ended_at.get(pod_id, time.time())
        hours = max(0.0, end - created_at) / 3600
        bwd, bwu = self.bandwidth_usd(pod_id)
        items = [{"type": "gpu", "amount": round(hours * price_per_hour, 6),
                  "description": f"{hours:.3f} hours at ${price_per_hour}/hour"},
                 {"type": "bwd", "amount": round(bwd, 9), "description": "download bandwidth"},
                 {"type": "bwu", "amount": round(bwu, 9), "description": "upload bandwidth"}]
        return {"start": int(created_at), "end": int(end), "type": "instance", "source": f"instance-{pod_id}",
                "description": f"Instance {pod_id} Charges", "amount": round(sum(i["amount"] for i in items), 9),
                "metadata": {"label": label} if label else {}, "items": items}

    def _charges(self, call: RouteCall) -> Reply:
        try:
            filters = json.loads(call.query.get("select_filters") or "")
            day = filters["day"]
            float(day["gte"]), float(day["lte"])
        except (ValueError, KeyError, TypeError):
            return Reply(400, {"success": False,
                               "msg": "Must provide both 'day' gte and lte filters for instance charges"})
        with self.emu.lock:
            rows = [self.charges_of(pod_id, *contract) for pod_id, contract in self.contracts.items()]
        return Reply(200, {"success": True, "count": len(rows), "total": len(rows), "next_token": None,
                           "results": rows})
