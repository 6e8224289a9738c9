"""vast.ai physical clusters and overlay networks on top of the vast.ai emulator, as strict as the sources.

Sources: vast-ai/docs multi-node-training-using-torch-nccl.mdx (the docs) and vast-ai/vast-cli
vastai/api/clusters.py + vast.py ``create/join/delete/show overlay`` (the CLI). Each rule names its source;
where none says, the rule is this emulator's choice and says so.

- Offers of machines in a physical cluster carry ``cluster_id``; others have none (the docs search
  ``cluster_id!=None``). Three clusters of 1x H100 SXM machines: 501 and 502 with two machines each,
  503 with one.
- ``POST /api/v0/overlay/`` takes exactly ``cluster_id`` (an int naming a physical cluster) and ``name``
  (CLI ``create_overlay``); the name is lowercase letters, digits and ``-`` (CLI ``parse_env``, the
  ``-n`` network option); a name already taken is refused (``join overlay`` names an overlay by its name
  alone: this emulator's reading). The answer has only ``msg`` (the CLI prints ``r.json()["msg"]``).
- ``GET /api/v0/overlay/`` lists ``overlay_id``, ``name``, ``internal_subnet``, ``cluster_id``,
  ``instances`` (CLI ``show__overlays``).
- ``PUT /api/v0/overlay/`` takes exactly ``name`` and ``instance_id`` (CLI ``join_overlay``); the instance
  must be the account's and on a machine of the overlay's cluster (the docs: overlays are "for instances
  located in the same physical cluster"); a repeat join is refused (this emulator's choice).
- ``DELETE /api/v0/overlay/`` takes ``overlay_id`` or ``overlay_name`` (CLI ``delete_overlay``); it
  "removes all of its associated instances" (CLI help): here from the overlay only - they keep running
  and billing (the reading that costs money if a client relies on the other one). A destroyed instance
  leaves its overlay. An instance's own key may call none of these routes (scripts/data/api_scopes.json
  puts them under user_read/user_write: this emulator's reading).
- Inside a member, the overlay interface (``eth0``, the docs; ``overlay_ifname`` here, since the
  pods' processes share this machine's network) has an address of the overlay's subnet: each pod's
  PATH has a fake ``ip`` that prints it for ``ip -4 -o addr show dev IFACE`` (loopback addresses
  ``127.0.<n>.<k>``, so the nodes really reach each other here).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from tests.support.emulators.common import EmuPod, Reply, RouteCall
from tests.support.emulators.vast import VastEmulator, _offer
from tests.support.sshd import SshServer

_NAME = re.compile(r"[a-z0-9-]+")  # vast.py parse_env: the -n network name's characters


def _cluster_offer(oid: int, cluster_id: int, dph: float) -> dict[str, Any]:
    return {**_offer(oid, "H100 SXM", 1, 81559, dph, dph * 0.6, 0.995, 5000.0, "Virginia, US", 110.0),
            "cluster_id": cluster_id}


CLUSTER_OFFERS = [_cluster_offer(3001, 501, 2.20), _cluster_offer(3002, 501, 2.25),
                  _cluster_offer(3003, 502, 2.60), _cluster_offer(3004, 502, 2.70),
                  _cluster_offer(3005, 503, 1.90)]

_IP = """#!/bin/sh
# the overlay's address for `ip -4 -o addr show dev IFACE` (vastcluster.py emulator)
for last; do :; done
f='{state}'
if [ -f "$f" ] && [ "$(cut -d' ' -f1 "$f")" = "$last" ]; then
  echo "2: $last    inet $(cut -d' ' -f2 "$f") scope global $last\\       valid_lft forever preferred_lft forever"
  exit 0
fi
echo "Device \\"$last\\" does not exist." >&2
exit 1
"""


def _err(status: int, error: str, msg: str) -> Reply:
    return Reply(status, {"success": False, "error": error, "msg": msg})


@dataclass
class EmuOverlay:
    overlay_id: int
    name: str
    cluster_id: int
    members: list[str] = field(default_factory=list)
    joined: int = 0  # addresses handed out


class VastClusterEmulator(VastEmulator):
    def __init__(self, root: Any, api_key: str = "vast-test-key") -> None:
        super().__init__(root, api_key)
        self.offers += [dict(o) for o in CLUSTER_OFFERS]
        self.clusters = {o["cluster_id"]: {m["machine_id"] for m in CLUSTER_OFFERS if m["cluster_id"] == o["cluster_id"]}
                         for o in CLUSTER_OFFERS}
        self.machine_of: dict[str, int] = {}  # instance id -> the machine of its offer
        self.overlays: dict[int, EmuOverlay] = {}
        self.overlay_ifname = "eth0"
        # No source says whether a join is taken before the instance runs: with this on, it is refused.
        self.join_requires_running = False
        self._next_overlay = 700
        for method, endpoint in (("GET", "show_overlays"), ("POST", "create_overlay"), ("PUT", "join_overlay"),
                                 ("DELETE", "delete_overlay")):
            self.add_route(method, r"/api/v0/overlay/", endpoint, getattr(self, "_" + endpoint))

    # -- instances: their machine, their overlay address -------------------------------------------
    def _create(self, ask_id: str, body: dict[str, Any], no_capacity: bool) -> Reply:
        reply = super()._create(ask_id, body, no_capacity)
        contract = reply.body.get("new_contract") if isinstance(reply.body, dict) else None
        offer = next((o for o in self.offers if str(o["id"]) == ask_id), None)
        if contract and offer is not None:
            self.machine_of[str(contract)] = offer["machine_id"]
        return reply

    def _state(self, pod_id: str) -> Any:
        folder = self.root / f"pod-{pod_id}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / "overlay"

    def boot(self, pod: EmuPod) -> SshServer:
        """As EmuPod.ensure_sshd, with the fake ``ip`` first on the pod's PATH."""
        if pod.sshd is None:
            folder = self.root / f"pod-{pod.pod_id}"
            (folder / "bin").mkdir(parents=True, exist_ok=True)
            (folder / "bin" / "ip").write_text(_IP.format(state=self._state(pod.pod_id)))
            os.chmod(folder / "bin" / "ip", 0o755)
            pod.environ_path = folder / "environ"
            pod.environ_path.write_bytes(b"".join(f"{k}={v}".encode() + b"\0"
                                                  for k, v in self.pod_environment(pod).items()))
            os.chmod(pod.environ_path, 0o600)
            pod.sshd = SshServer.start(folder, authorized_keys=pod.keys, port=pod.keep_port, set_env={
                "GPUCLI_POD_ENVIRON": str(pod.environ_path), "GPUCLI_EMU_POD": pod.marker,
                "PATH": f"{folder / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
        return pod.sshd

    def end_pod(self, pod_id: str, event: str, by: str) -> EmuPod | None:
        pod = super().end_pod(pod_id, event, by)
        if pod is not None and event == "terminated":
            with self.lock:  # a destroyed instance leaves its overlay
                for o in self.overlays.values():
                    if pod_id in o.members:
                        o.members.remove(pod_id)
                self._state(pod_id).unlink(missing_ok=True)
        return pod

    # -- routes ---------------------------------------------------------------------------------------
    def _overlay_json(self, o: EmuOverlay) -> dict[str, Any]:
        return {"overlay_id": o.overlay_id, "name": o.name, "internal_subnet": f"127.0.{o.overlay_id % 250}.0/24",
                "cluster_id": o.cluster_id, "instances": [int(i) for i in o.members]}

    def _show_overlays(self, call: RouteCall) -> Reply:
        with self.lock:
            return Reply(200, [self._overlay_json(o) for o in self.overlays.values()])

    def _create_overlay(self, call: RouteCall) -> Reply:
        body = call.body
        if not isinstance(body, dict) or set(body) != {"cluster_id", "name"}:
            return _err(400, "invalid_args", "create overlay takes cluster_id and name")
        cid, name = body["cluster_id"], body["name"]
        if not isinstance(cid, int) or isinstance(cid, bool) or cid not in self.clusters:
            return _err(400, "invalid_args", f"no physical cluster {cid!r}")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            return _err(400, "invalid_args", f"invalid overlay name {name!r}")
        with self.lock:
            if any(o.name == name for o in self.overlays.values()):
                return _err(400, "invalid_args", f"an overlay named {name} exists")
            self._next_overlay += 1
            self.overlays[self._next_overlay] = EmuOverlay(self._next_overlay, name, cid)
        self.ledger.record(f"overlay-{self._next_overlay}", "created", label=name)
        return Reply(200, {"success": True, "msg": f"Overlay network {name} created"})

    def _join_overlay(self, call: RouteCall) -> Reply:
        body = call.body
        if not isinstance(body, dict) or set(body) != {"name", "instance_id"}:
            return _err(400, "invalid_args", "join overlay takes name and instance_id")
        iid = str(body["instance_id"])
        with self.lock:
            o = next((o for o in self.overlays.values() if o.name == body["name"]), None)
            if o is None:
                return _err(404, "no_such_overlay", f"no overlay named {body['name']!r}")
            if iid not in self.pods:
                return _err(404, "no_such_instance", "Instance not found")
            if self.machine_of.get(iid) not in self.clusters[o.cluster_id]:
                return _err(400, "invalid_args", f"instance {iid} is not on a machine of cluster {o.cluster_id}")
            if self.join_requires_running and self.pods[iid].sshd is None:
                return _err(400, "invalid_args", f"instance {iid} is not running yet")
            if iid in o.members:
                return _err(400, "invalid_args", f"instance {iid} is already on overlay {o.name}")
            o.members.append(iid)
            o.joined += 1
            self._state(iid).write_text(f"{self.overlay_ifname} 127.0.{o.overlay_id % 250}.{o.joined}/24\n")
        return Reply(200, {"success": True, "msg": f"Instance {iid} joined {o.name}"})

    def _delete_overlay(self, call: RouteCall) -> Reply:
        body = call.body if isinstance(call.body, dict) else {}
        with self.lock:
            o = next((o for o in self.overlays.values() if o.overlay_id == body.get("overlay_id")
                      or o.name == body.get("overlay_name")), None)
            if o is None:
                return _err(404, "no_such_overlay", "Overlay not found")
            del self.overlays[o.overlay_id]
            for iid in o.members:  # removed from the overlay; they go on running (and billing)
                self._state(iid).unlink(missing_ok=True)
        self.ledger.record(f"overlay-{o.overlay_id}", "terminated", label=o.name, by=call.by)
        return Reply(200, {"success": True, "msg": f"Overlay {o.name} deleted"})

    # -- what the tests read ------------------------------------------------------------------------
    def billing(self) -> set[str]:
        """Instances created and not destroyed, and overlays not deleted (``overlay-<id>``)."""
        return self.ledger.alive()
