"""vast.ai's two SSH routes (issue 27 item 7): a direct port that accepts TCP and never sends an SSH
banner falls back to the proxy route; with both routes dead the launch fails in one line and the
instance is terminated. The emulator's fault switch: ``vast_emulator.net.silent``
(tests/support/emulators/vastnet.py)."""

from __future__ import annotations

import pytest

from gpucli.providers.clients import get_provider
from gpucli.providers.http import RetryPolicy
from gpucli.providers.provision import ProvisionFailed
from gpucli.providers.query import parse_query
from gpucli.providers.vast.api import parse_instance
from tests.gpucli.providers.test_clients import provision, spec_for, ssh_ok

FAST = RetryPolicy(max_attempts=4, base_delay_s=0.001, max_delay_s=0.005, deadline_s=5)


def _offer(vp):
    return vp.search_offers(parse_query("gpu_name=RTX_3090 num_gpus=1"))[0]


def test_both_routes_are_kept_direct_first():
    inst = parse_instance({"id": 7, "actual_status": "running", "public_ipaddr": "203.0.113.9",
                           "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41022"}]},
                           "ssh_host": "ssh5.vast.ai", "ssh_port": 12345})
    assert [(r.via, r.host, r.port) for r in inst.routes()] == [("direct", "203.0.113.9", 41022),
                                                              ("proxy", "ssh5.vast.ai", 12345)]
    assert (inst.ssh_host, inst.ssh_port) == ("203.0.113.9", 41022)


def test_a_silent_direct_port_falls_back_to_the_proxy(vast_emulator, client_key):
    vast_emulator.net.silent.add("direct")
    vp = get_provider("vast", policy=FAST)
    events: list[str] = []
    result = provision(vp, spec_for(_offer(vp), client_key[1]), [_offer(vp)], on_event=events.append,
                       ready_timeout_s=20)
    inst = result.instance
    pod = vast_emulator.pods[inst.instance_id]
    direct = vast_emulator.net.direct[inst.instance_id]
    assert (inst.ssh_host, inst.ssh_port) == ("localhost", pod.proxy.port) != ("127.0.0.1", direct.port)
    assert direct._held, "the direct port was tried (it accepted TCP and never answered)"
    assert any("proxy" in e and "gave no SSH banner" in e for e in events), events
    assert ssh_ok(inst, client_key[0])
    vp.terminate(inst.instance_id)


def test_both_routes_silent_fails_in_one_line_and_terminates(vast_emulator, client_key):
    vast_emulator.net.silent.update({"direct", "proxy"})
    vp = get_provider("vast", policy=FAST)
    with pytest.raises(ProvisionFailed) as info:
        provision(vp, spec_for(_offer(vp), client_key[1]), [_offer(vp)], ready_timeout_s=1)
    message = info.value.message
    assert "\n" not in message and "no SSH banner" in message and "direct" in message and "proxy" in message
    assert not info.value.left_running
    assert len(vast_emulator.ledger.created()) == 1 and vast_emulator.ledger.alive() == set()  # money never leaked
