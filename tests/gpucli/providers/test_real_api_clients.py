"""The clients as the official sources describe RunPod and vast.ai, against the strict emulators.

Each test names the issue item it covers; each would fail on the clients before these changes.
"""

from __future__ import annotations

import pytest

from gpucli.errors import NoCapacityError, ProviderError
from gpucli.providers.api import LaunchSpec, SpotRefusedError
from gpucli.providers.clients import get_provider
from gpucli.providers.http import USER_AGENT, HttpClient, RetryPolicy
from gpucli.providers.query import parse_query
from tests.gpucli.providers.test_clients import provision, spec_for, ssh_ok

FAST = RetryPolicy(max_attempts=4, base_delay_s=0.001, max_delay_s=0.005, deadline_s=5)


def _vast_offer(vp, query="gpu_name=RTX_3090 num_gpus=1", **kw):
    return vp.search_offers(parse_query(query), **kw)[0]


# --- item 1: User-Agent, success:false -------------------------------------------------------------
def test_every_request_sends_gpucli_user_agent(runpod_emulator, vast_emulator, client_key):
    rp = get_provider("runpod", policy=FAST)
    offer = rp.search_offers(parse_query("num_gpus=1"))[0]
    inst = rp.create(spec_for(offer, client_key[1]))
    rp.get(inst.instance_id)
    rp.terminate(inst.instance_id)
    vp = get_provider("vast", policy=FAST)
    vinst = vp.create(spec_for(_vast_offer(vp), client_key[1]))
    vp.terminate(vinst.instance_id)
    agents = set(runpod_emulator.user_agents) | set(vast_emulator.user_agents)
    assert agents == {USER_AGENT} and USER_AGENT.startswith("gpucli/")


@pytest.mark.parametrize("agent", [None, "Python-urllib/3.11", "python-requests/2.32"])
def test_default_agents_get_cloudflare_403(vast_emulator, agent):
    client = HttpClient(vast_emulator.url, api_key=vast_emulator.api_key, service="vast.ai", policy=FAST,
                        user_agent=agent or "")
    with pytest.raises(ProviderError, match="1010"):
        client.request("GET", "/api/v1/instances/")
    vast_emulator.strict_user_agent = False  # the switch: the same call then passes
    assert client.request("GET", "/api/v1/instances/").ok


def test_vast_success_false_is_a_failure(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    inst = vp.create(spec_for(_vast_offer(vp), client_key[1]))
    vast_emulator.faults.add("refuse", "terminate")
    with pytest.raises(ProviderError, match="request refused"):
        vp.terminate(inst.instance_id)
    assert inst.instance_id in vast_emulator.ledger.alive()
    vp.terminate(inst.instance_id)
    assert vast_emulator.ledger.alive() == set()


# --- item 2: vast SSH ------------------------------------------------------------------------------
def test_vast_runtype_and_direct_port_filter(vast_emulator, client_key):
    vast_emulator.offers[1]["direct_port_count"] = 0  # 1002: a machine without direct ports
    vp = get_provider("vast", policy=FAST)
    offers = vp.search_offers(parse_query("gpu_name=RTX_3090"))
    assert vast_emulator.search_bodies[-1]["direct_port_count"] == {"gte": 1}
    assert "1002" not in [o.offer_id for o in offers] and offers
    vp.create(spec_for(offers[0], client_key[1]))
    assert vast_emulator.create_bodies[-1][1]["runtype"] == "ssh_direc ssh_proxy"  # as vastai's get_runtype
    proxy_only = get_provider("vast", policy=FAST, direct_ssh=False)
    proxy_only.search_offers(parse_query("gpu_name=RTX_3090"))
    assert "direct_port_count" not in vast_emulator.search_bodies[-1]


def test_vast_falls_back_to_the_proxy_route(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    offer = _vast_offer(vp)
    vast_emulator.offers = [dict(o, direct_port_count=0) if str(o["id"]) == offer.offer_id else o
                            for o in vast_emulator.offers]  # its direct ports went away after the search
    result = provision(vp, spec_for(offer, client_key[1]), [offer])
    inst = result.instance
    pod = vast_emulator.pods[inst.instance_id]
    assert (inst.ssh_host, inst.ssh_port) == ("localhost", pod.proxy.port) != ("127.0.0.1", pod.sshd.port)
    assert ssh_ok(inst, client_key[0])
    vp.terminate(inst.instance_id)


def test_vast_registers_the_key_on_the_account_once(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    offer = _vast_offer(vp)
    inst = provision(vp, spec_for(offer, client_key[1], name="a"), [offer]).instance
    assert ssh_ok(inst, client_key[0])
    vp.create(spec_for(offer, client_key[1], name="b"))
    posts = [r for r in vast_emulator.requests if r[0] == "POST" and r[1] == "/api/v0/ssh/"]
    assert len(posts) == 1 and [k["public_key"] for k in vast_emulator.account_keys] == [client_key[1].strip()]


def test_vast_failed_attach_is_retried_not_destroyed(vast_emulator, client_key):
    vast_emulator.faults.add("refuse", "keys", times=10)  # account keys unavailable: only the attach path
    vp = get_provider("vast", policy=FAST)
    offer = _vast_offer(vp)
    result = provision(vp, spec_for(offer, client_key[1]), [offer])
    inst = result.instance
    attaches = [r for r in vast_emulator.requests if r[1].endswith("/ssh/") and "/instances/" in r[1]]
    assert len(attaches) >= 2  # refused while loading, then attached once running
    assert len(vast_emulator.ledger.created()) == 1 and vast_emulator.ledger.alive() == {inst.instance_id}
    assert vast_emulator.account_keys == [] and ssh_ok(inst, client_key[0])
    vp.terminate(inst.instance_id)


def test_vast_lost_create_answer_still_gets_the_key(vast_emulator, client_key):
    vast_emulator.faults.add("refuse", "keys", times=10)
    vast_emulator.faults.add("lose_answer", "create")
    vp = get_provider("vast", policy=FAST)
    offer = _vast_offer(vp)
    result = provision(vp, spec_for(offer, client_key[1]), [offer])
    assert ssh_ok(result.instance, client_key[0])
    assert vast_emulator.ledger.alive() == {result.instance.instance_id}
    vp.terminate(result.instance.instance_id)


# --- item 3: vast price = billed -------------------------------------------------------------------
def test_vast_quote_includes_the_launch_disk(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    small = _vast_offer(vp, disk_gb=5)
    big = _vast_offer(vp, disk_gb=200)
    assert vast_emulator.search_bodies[-1]["allocated_storage"] == 200
    assert big.price_per_hour_usd > small.price_per_hour_usd
    spec = LaunchSpec(name="disk", gpu_name=big.gpu_name, gpu_count=1, image="img", disk_gb=200,
                      ssh_public_key=client_key[1], offer_id=big.offer_id)
    inst = vp.create(spec)
    assert vast_emulator.pods[inst.instance_id].price_per_hour == pytest.approx(big.price_per_hour_usd)
    _vast_offer(vp)  # not told the disk: priced at the default launch disk, never at 5 GB
    assert vast_emulator.search_bodies[-1]["allocated_storage"] == 50


def test_vast_bid_sends_cancel_unavail_and_leaves_nothing(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    offer = _vast_offer(vp, spot=True)
    with pytest.raises(ProviderError, match="bid"):
        vp.create(spec_for(offer, client_key[1], spot=True, bid_per_gpu_usd=0.01))
    assert vast_emulator.create_bodies[-1][1]["cancel_unavail"] is True
    assert vast_emulator.ledger.created() == []


@pytest.mark.parametrize("status", [404, 410])
def test_vast_gone_offer_shapes_are_no_capacity(vast_emulator, client_key, status):
    vast_emulator.gone_ask_status = status
    vp = get_provider("vast", policy=FAST)
    offer = _vast_offer(vp)
    vast_emulator.faults.add("no_capacity", "create")
    with pytest.raises(NoCapacityError):
        vp.create(spec_for(offer, client_key[1]))


# --- item 4: RunPod (REST v2) ----------------------------------------------------------------------
def test_runpod_sends_public_key_and_ssh_public_key(runpod_emulator, client_key):
    rp = get_provider("runpod", policy=FAST)
    offer = rp.search_offers(parse_query("num_gpus=1"))[0]
    result = provision(rp, spec_for(offer, client_key[1]), [offer])
    create = next(b for op, b in runpod_emulator.calls if op == "createPod")
    assert create["env"]["PUBLIC_KEY"] == create["env"]["SSH_PUBLIC_KEY"] == client_key[1].strip()
    assert ssh_ok(result.instance, client_key[0])
    rp.terminate(result.instance.instance_id)


def test_runpod_count_out_of_stock_in_every_data_centre_is_no_offer(runpod_emulator):
    rp = get_provider("runpod", policy=FAST)
    assert any(o.gpu_name == "NVIDIA H100 80GB HBM3" for o in rp.search_offers(parse_query("num_gpus=1")))
    # EU-SE-1 has one H100 free, US-KS-2 eight: 8 H100s only in US-KS-2, and that is where the offer goes
    eight = [o for o in rp.search_offers(parse_query("num_gpus=8")) if o.gpu_name == "NVIDIA H100 80GB HBM3"]
    assert [(o.cloud_type, o.data_center_id) for o in eight] == [("SECURE", "US-KS-2")]
    for dc in runpod_emulator.data_centers:
        dc["stock"]["SECURE"].pop("NVIDIA H100 80GB HBM3", None)
    assert all(o.gpu_name != "NVIDIA H100 80GB HBM3" for o in rp.search_offers(parse_query("num_gpus=1")))


def test_runpod_v1_and_interruptible_are_gone(runpod_emulator):
    rp = get_provider("runpod", policy=FAST)
    assert rp.http.request("POST", "/v1/pods/abc/stop").status == 410  # retired 2026-11-15
    resp = rp.http.request("POST", "/graphql", json_body={"query": "mutation R($input: String!) { "
                                                                  "podRentInterruptable(input: $input) { id } }",
                                                         "variables": {"input": "x"}})
    assert "Cannot query field" in str(resp.body)
    assert runpod_emulator.ledger.created() == []


def test_runpod_refused_spot_is_one_line_and_never_on_demand(runpod_emulator, client_key):
    rp = get_provider("runpod", policy=FAST)
    offer = rp.search_offers(parse_query("num_gpus=1"))[0]
    spec = spec_for(offer, client_key[1], spot=True, bid_per_gpu_usd=1.0)
    with pytest.raises(SpotRefusedError) as err:
        provision(rp, spec, [offer, offer])
    assert "\n" not in str(err.value) and "vast" in str(err.value)
    assert runpod_emulator.ledger.created() == []
    assert "createPod" not in [op for op, _ in runpod_emulator.calls]


def test_runpod_unknown_create_fields_are_422(runpod_emulator):
    rp = get_provider("runpod", policy=FAST)
    resp = rp.http.request("POST", "/v2/pods", json_body={"name": "gpucli-x", "image": "i", "gpu": {"id": "x"},
                                                          "cloudType": "ALL"}, idempotent=False)
    assert resp.status == 422 and "cloudType" in str(resp.body)
    assert runpod_emulator.ledger.created() == []


@pytest.mark.parametrize("action", ["stop", "terminate"])
def test_runpod_stop_and_terminate_go_through_v2(runpod_emulator, client_key, action):
    rp = get_provider("runpod", policy=FAST)
    offer = rp.search_offers(parse_query("num_gpus=1"))[0]
    inst = rp.create(spec_for(offer, client_key[1]))
    getattr(rp, action)(inst.instance_id)
    ends = [r for r in runpod_emulator.requests if inst.instance_id in r[1] and r[0] in ("POST", "DELETE")]
    assert ends[0][:2] == (("POST", f"/v2/pods/{inst.instance_id}/action") if action == "stop"
                           else ("DELETE", f"/v2/pods/{inst.instance_id}"))
    assert not any(r[1].startswith(("/v1/", "/graphql")) for r in runpod_emulator.requests)
    events = [e.event for e in runpod_emulator.ledger.ended(inst.instance_id)]
    assert events == ["stopped" if action == "stop" else "terminated"]
    rp.terminate(inst.instance_id)


@pytest.mark.parametrize("fault", ["server_error", "not_json"])
def test_runpod_terminate_that_is_not_the_documented_answer_fails(runpod_emulator, client_key, fault):
    """A 5xx (after retries) or a 200 that is not the documented 204 never says "terminated"."""
    rp = get_provider("runpod", policy=FAST)
    offer = rp.search_offers(parse_query("num_gpus=1"))[0]
    inst = rp.create(spec_for(offer, client_key[1]))
    runpod_emulator.faults.add(fault, "terminate", times=FAST.max_attempts if fault == "server_error" else 1)
    with pytest.raises(ProviderError):
        rp.terminate(inst.instance_id)
    assert inst.instance_id in runpod_emulator.ledger.alive()
    rp.terminate(inst.instance_id)
    assert runpod_emulator.ledger.alive() == set()


def test_runpod_a_bare_404_is_not_gone(runpod_emulator, client_key):
    """Only v2's own 404 for the id proves a pod gone; a 404 without the problem body (a wrong URL, a
    proxy, the retired v1) is a failure."""
    rp = get_provider("runpod", policy=FAST, base_url=runpod_emulator.url + "/nowhere")
    with pytest.raises(ProviderError):
        rp.terminate("abc123")


# --- item 7: the pod-side switches ------------------------------------------------------------------
def test_pod_side_strictness_switches(vast_emulator, client_key):
    import urllib.error
    import urllib.request

    vast_emulator.pod_env_has_base_url = False
    vp = get_provider("vast", policy=FAST)
    offer = _vast_offer(vp)
    inst = provision(vp, spec_for(offer, client_key[1]), [offer]).instance
    pod = vast_emulator.pods[inst.instance_id]
    environ = dict(kv.split("=", 1) for kv in pod.environ_path.read_bytes().decode().split("\0") if kv)
    assert "VAST_URL" not in environ and environ["CONTAINER_ID"] == inst.instance_id
    vast_emulator.strict_pod_calls = True  # the pod's own key with Python's default agent: Cloudflare 403
    req = urllib.request.Request(f"{vast_emulator.url}/api/v0/instances/{inst.instance_id}/", method="DELETE",
                                 headers={"Authorization": f"Bearer {environ['CONTAINER_API_KEY']}"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)  # noqa: S310 - the local emulator
    assert err.value.code == 403 and inst.instance_id in vast_emulator.ledger.alive()
    req = urllib.request.Request(req.full_url, method="DELETE", headers={**req.headers, "User-Agent": USER_AGENT})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
        assert resp.status == 200
    assert vast_emulator.ledger.alive() == set()
