"""vast.ai clusters: N instances of one physical cluster joined on an overlay network, rented and ended
as one.

What the sources say (vast-ai/docs multi-node-training-using-torch-nccl.mdx; vast-ai/vast-cli
vastai/api/clusters.py and vast.py ``create/join/delete/show overlay``):
- instances on different machines sit on separate bridge networks behind NAT; the only route between
  them is an *overlay* network, which exists only inside a *physical cluster* (machines with fast local
  networking). Offers carry ``cluster_id`` (the docs search ``cluster_id!=None``, then
  ``cluster_id=ID``);
- ``POST /api/v0/overlay/`` ``{cluster_id, name}`` creates one (the answer carries only ``msg``, so
  gpucli finds its id by name in the list); ``GET /api/v0/overlay/`` lists them (``overlay_id``,
  ``name``, ``internal_subnet``, ``cluster_id``, ``instances``); ``PUT /api/v0/overlay/``
  ``{name, instance_id}`` joins an instance; ``DELETE /api/v0/overlay/`` ``{overlay_id}`` deletes it
  ("removes all of its associated instances": gpucli reads that as *from the overlay*, never as
  destroyed, and destroys every instance itself first);
- a network name is lowercase letters, digits and ``-`` (vast.py ``parse_env``, the ``-n`` option);
- inside, ``eth0`` is the overlay interface (``eth1`` the bridge to the internet); NCCL needs
  ``NCCL_SOCKET_IFNAME=eth0``; there are no rank variables: the user (here gpucli) assigns ranks and
  reads rank 0's ``inet`` address of ``eth0`` (``ip a``) for the rendezvous.

The docs attach instances at create time (``--env "-n NAME"``); gpucli uses the join route after the
create, so every instance id is in the run record before it joins or is waited on.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucli.errors import GpucliError, NoCapacityError, ProviderError
from gpucli.providers.api import CreateAnswerLost, InstanceNotFound, InstanceState, LaunchSpec, Offer
from gpucli.providers.query import Query
from gpucli.providers.vast.api import VastProvider, parse_offer

OVERLAY_IFNAME = "eth0"  # the docs' overlay interface inside the container
_NAME_BAD = re.compile(r"[^a-z0-9-]+")


class OverlayNotReady(ProviderError):
    """The instances did not all come up on the overlay within the ready timeout (all ended)."""


@dataclass(frozen=True)
class Overlay:
    overlay_id: str
    name: str
    cluster_id: str
    instances: tuple[str, ...]
    subnet: str | None = None


@dataclass(frozen=True)
class OverlayNode:
    rank: int
    instance_id: str
    ssh_host: str
    ssh_port: int


def overlay_name(label: str) -> str:
    """A network name vast accepts (lowercase letters, digits, ``-``) from a run's label."""
    return _NAME_BAD.sub("-", label.lower()).strip("-")[:63] or "gpucli"


def _id(value: Any) -> str | None:
    return str(value) if isinstance(value, int | str) and not isinstance(value, bool) and str(value) else None


def _num_id(value: str) -> int | str:
    """vast's ids are integers (vast-cli sends ``type=int``); anything else goes as it came."""
    return int(value) if str(value).isdigit() else value


class VastOverlays:
    """The overlay routes of vast's REST API v0, over a :class:`VastProvider`'s HTTP session."""

    def __init__(self, provider: VastProvider) -> None:
        self.provider = provider
        self.http = provider.http

    def list(self) -> list[Overlay]:
        resp = self.http.request("GET", "/api/v0/overlay/", what="show overlays")
        if resp.status == 404:  # no overlay routes at this base URL (an API or proxy without them): none
            return []
        body = resp.body
        if isinstance(body, Mapping):  # a list is what vast.py show__overlays iterates; tolerate a wrapper
            body = body.get("overlays", body.get("results"))
        if not resp.ok or not isinstance(body, list):
            raise ProviderError(f"vast.ai show overlays: HTTP {resp.status} without the overlay list")
        out = []
        for o in body:
            if isinstance(o, Mapping) and _id(o.get("overlay_id")):
                members = tuple(str(i) for i in (o.get("instances") or []) if _id(i))
                out.append(Overlay(str(o["overlay_id"]), str(o.get("name") or ""), str(o.get("cluster_id") or ""),
                                   members, o.get("internal_subnet") if isinstance(o.get("internal_subnet"), str)
                                   else None))
        return out

    def find(self, name: str) -> Overlay | None:
        return next((o for o in self.list() if o.name == name), None)

    def create(self, cluster_id: str, name: str) -> None:
        resp = self.http.request("POST", "/api/v0/overlay/", json_body={"cluster_id": _num_id(cluster_id), "name": name},
                                 idempotent=False, what="create overlay")
        _ok(resp, "create overlay")

    def join(self, name: str, instance_id: str) -> None:
        resp = self.http.request("PUT", "/api/v0/overlay/", json_body={"name": name, "instance_id": _num_id(instance_id)},
                                 idempotent=True, what="join overlay")
        _ok(resp, "join overlay")

    def delete(self, overlay_id: str) -> None:
        """Delete it; done only when vast says so, or when its list no longer has it."""
        resp = self.http.request("DELETE", "/api/v0/overlay/", json_body={"overlay_id": _num_id(overlay_id)},
                                 idempotent=True, what="delete overlay")
        if resp.ok and isinstance(resp.body, Mapping) and resp.body.get("success") is not False:
            return
        if all(o.overlay_id != overlay_id for o in self.list()):
            return  # already gone: the provider's list says so
        _ok(resp, "delete overlay")


def _ok(resp: Any, what: str) -> None:
    body = resp.body
    if resp.ok and not (isinstance(body, Mapping) and body.get("success") is False):
        return
    msg = body.get("msg") or body.get("error") if isinstance(body, Mapping) else (resp.text or "")
    raise ProviderError(f"vast.ai {what} failed: {str(msg)[:200]} (HTTP {resp.status})")


def cluster_offers(provider: VastProvider, query: Query, *, disk_gb: float) -> dict[str, list[Offer]]:
    """Offers of a physical cluster (``cluster_id != None``), by cluster id."""
    body = query.to_vast_body(order="dph_total", type="on-demand", limit=None, allocated_storage=float(disk_gb))
    body.setdefault("cluster_id", {"neq": None})  # the docs' `cluster_id!=None`; `cluster_id=ID` as they search it too
    if provider.direct_ssh and "direct_port_count" not in body:
        body["direct_port_count"] = {"gte": 1}
    resp = provider.http.request("POST", "/api/v0/bundles/", json_body=body, idempotent=True, what="search offers")
    _ok(resp, "search offers")
    rows = resp.body.get("offers") if isinstance(resp.body, Mapping) else None
    out: dict[str, list[Offer]] = {}
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, Mapping) or _id(row.get("cluster_id")) is None:
            continue
        offer = parse_offer({**row, "allocated_storage": float(disk_gb)})
        if offer is not None:
            out.setdefault(str(row["cluster_id"]), []).append(offer)
    return out


def choose_cluster(by_cluster: Mapping[str, Sequence[Offer]], nodes: int, what: str) -> tuple[str, list[Offer]]:
    """The cheapest ``nodes`` offers on distinct machines of one cluster; one line when none has them."""
    best: tuple[float, str, list[Offer]] | None = None
    largest = 0
    for cid, offers in by_cluster.items():
        machines: dict[str, Offer] = {}
        for o in sorted(offers, key=lambda o: o.price_per_hour_usd):
            machines.setdefault(o.machine_id or o.offer_id, o)
        picked = list(machines.values())[:nodes]
        largest = max(largest, len(picked))
        if len(picked) == nodes:
            total = sum(o.price_per_hour_usd for o in picked)
            if best is None or total < best[0]:
                best = (total, cid, picked)
    if best is None:
        raise NoCapacityError(f"no vast.ai cluster has {nodes} machines of {what} (the most in one cluster: "
                              f"{largest})", hint="fewer --nodes, another profile, or --provider runpod")
    return best[1], best[2]


def rent_overlay(provider: VastProvider, overlays: VastOverlays, *, name: str, cluster_id: str, offers: Sequence[Offer],
                 spec: Callable[[int, Offer], LaunchSpec], ready_timeout_s: float, poll_s: float,
                 on_overlay: Callable[[str], None], on_instance: Callable[[int, str], None],
                 on_event: Callable[[str], None], sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> tuple[str, list[OverlayNode]]:
    """Create the overlay, rent one instance per offer (rank = position), join each, and wait until all
    run with SSH and the overlay lists them; (overlay id, nodes by rank). Every id goes to ``on_overlay``
    / ``on_instance`` the moment vast names it; whatever this call made is ended before an error leaves."""
    overlay_id: str | None = None
    ids: dict[int, str] = {}
    try:
        on_event(f"creating vast.ai overlay network {name} on cluster {cluster_id}")
        try:
            overlays.create(cluster_id, name)
        except GpucliError:
            found = overlays.find(name)  # the answer may be lost while the overlay exists: it must not stay
            if found is not None:
                on_overlay(found.overlay_id)
                overlay_id = found.overlay_id
            raise
        found = overlays.find(name)
        if found is None:
            raise ProviderError(f"vast.ai created overlay {name} but does not list it")
        overlay_id = found.overlay_id
        on_overlay(overlay_id)
        for rank, offer in enumerate(offers):
            launch = spec(rank, offer)
            on_event(f"node {rank}: renting vast.ai offer {offer.offer_id} ({offer.gpu_count}x {offer.gpu_name})")
            try:
                inst = provider.create(launch)
            except CreateAnswerLost:
                lost = provider.find_by_label(launch.label)
                if lost is not None:
                    ids[rank] = lost.instance_id
                    on_instance(rank, lost.instance_id)
                raise
            ids[rank] = inst.instance_id
            on_instance(rank, inst.instance_id)
        deadline = clock() + ready_timeout_s
        last_error = ""
        while True:
            # Join every instance not on the overlay yet, on each poll: no source says whether vast takes
            # a join before the instance runs, so a refused join is tried again until the deadline.
            members = set(next((o.instances for o in overlays.list() if o.overlay_id == overlay_id), ()))
            for rank, iid in sorted(ids.items()):
                if iid not in members:
                    try:
                        overlays.join(name, iid)
                    except GpucliError as exc:
                        last_error = f"; node {rank} not joined: {exc}"
            ready: dict[int, OverlayNode] = {}
            for rank, iid in sorted(ids.items()):
                inst = provider.get(iid)
                if inst.state.is_dead or inst.state is InstanceState.TERMINATED:
                    raise ProviderError(f"node {rank}: vast.ai instance {iid} is {inst.raw_status or inst.state.value}")
                if inst.ssh_ready and iid in members:
                    ready[rank] = OverlayNode(rank, iid, str(inst.ssh_host), int(inst.ssh_port or 22))
            if len(ready) == len(offers):
                return overlay_id, [ready[r] for r in range(len(offers))]
            if clock() >= deadline:
                raise OverlayNotReady(f"vast.ai overlay {name}: {len(ready)} of {len(offers)} instances ready on it "
                                      f"after {ready_timeout_s:g} s{last_error[:200]}; all ended",
                                      hint="try again, or fewer nodes")
            sleep(poll_s)
    except BaseException:
        end_overlay(provider, overlays, list(ids.values()), overlay_id)
        raise


def end_overlay(provider: VastProvider, overlays: VastOverlays, instance_ids: Sequence[str],
                overlay_id: str | None) -> list[str]:
    """Destroy every instance (gone only when vast no longer has it), then delete the overlay. Each step
    is tried twice; the error at the end names what may still bill."""
    left: list[str] = []
    for iid in instance_ids:
        for attempt in (1, 2):
            try:
                provider.terminate(iid)
                try:
                    provider.get(iid)
                except InstanceNotFound:
                    break  # vast says it is gone
                if attempt == 2:
                    left.append(f"instance {iid}")
            except GpucliError:
                if attempt == 2:
                    left.append(f"instance {iid}")
    if overlay_id is not None:
        for attempt in (1, 2):
            try:
                overlays.delete(overlay_id)
                break
            except GpucliError:
                if attempt == 2:
                    left.append(f"overlay {overlay_id}")
    if left:
        raise ProviderError(f"could not end vast.ai {', '.join(left)}; it may still bill",
                            hint="`gpucli down --strays` or the vast.ai console ends it")
    return list(instance_ids)


def overlay_strays(overlays: VastOverlays, prefix: str, owned: set[str]) -> list[Overlay]:
    """gpucli-named overlays whose id no active run holds."""
    return [o for o in overlays.list() if o.name.startswith(prefix) and o.overlay_id not in owned]


# Reading a node's overlay address over SSH: `ip` (iproute2, the docs' way), else Python's SIOCGIFADDR
# ioctl on the interface (images without iproute2: the docs say to apt-install it).
_ADDR = re.compile(r"\binet (\d{1,3}(?:\.\d{1,3}){3})/\d+")


def address_command(ifname: str) -> str:
    probe = ("import fcntl,socket,struct,sys;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
             "a=fcntl.ioctl(s.fileno(),0x8915,struct.pack('256s',sys.argv[1].encode()[:15]));"
             "print('inet '+socket.inet_ntoa(a[20:24])+'/32')")
    q = shlex.quote(ifname)
    return (f"if command -v ip >/dev/null 2>&1; then ip -4 -o addr show dev {q} 2>/dev/null; "
            f"else python3 -c {shlex.quote(probe)} {q} 2>/dev/null; fi")


def parse_address(text: str) -> str | None:
    m = _ADDR.search(text or "")
    return m.group(1) if m else None

