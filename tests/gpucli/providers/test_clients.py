"""RunPod and vast.ai clients against the emulators: offers, create/get/terminate, spot, keys, recovery."""

from __future__ import annotations

import json
import subprocess

import pytest

from gpucli import settings
from gpucli.errors import NoCapacityError, ProviderError, UsageError
from gpucli.providers.api import (
    CreateAnswerLost,
    InstanceNotFound,
    InstanceState,
    LaunchSpec,
    SpotRefusedError,
)
from gpucli.providers.clients import get_provider
from gpucli.providers.credentials import ApiKey, MissingKeyError, resolve_key
from gpucli.providers.http import RetryPolicy
from gpucli.providers.provision import ProvisionFailed, provision_with_retries
from gpucli.providers.query import parse_query
from tests.support.emulators import PodBehaviour

FAST = RetryPolicy(max_attempts=4, base_delay_s=0.001, max_delay_s=0.005, deadline_s=5)


def spec_for(offer, pub, name="run1", **kw):
    return LaunchSpec(name=name, gpu_name=offer.gpu_name, gpu_count=offer.gpu_count, image="pytorch/pytorch",
                      disk_gb=20, ssh_public_key=pub, offer_id=offer.offer_id, **kw)


def ssh_ok(inst, key_path) -> bool:
    """A real SSH login with gpucli's key proves the key was injected into the pod."""
    proc = subprocess.run(
        ["ssh", "-i", str(key_path), "-p", str(inst.ssh_port), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5",
         f"{inst.ssh_user}@{inst.ssh_host}", "echo pod-ok"], capture_output=True, text=True, timeout=20)
    return proc.returncode == 0 and "pod-ok" in proc.stdout


def provision(provider, spec, offers=(None,), **kw):
    kw.setdefault("poll_interval_s", 0.005)
    kw.setdefault("ready_timeout_s", 5)
    return provision_with_retries(provider, spec, offers, **kw)


# --- keys --------------------------------------------------------------------------------------------
def test_missing_key_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    with pytest.raises(MissingKeyError, match=r"gpucli keys set runpod.*RUNPOD_API_KEY"):
        resolve_key("runpod")
    with pytest.raises(MissingKeyError, match=r"gpucli keys set vast.*VAST_API_KEY"):
        get_provider("vast").search_offers()


def test_key_sources_in_order(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / ".runpod").mkdir()
    (tmp_path / ".runpod" / "config.toml").write_text('[default]\napi_key = "rp-from-toml"\n')
    (tmp_path / ".vast_api_key").write_text("vast-home\n")
    assert resolve_key("runpod").value == "rp-from-toml"
    assert resolve_key("vast").value == "vast-home"
    (tmp_path / "xdg" / "vastai").mkdir(parents=True)
    (tmp_path / "xdg" / "vastai" / "vast_api_key").write_text("vast-xdg")
    assert resolve_key("vast").source.startswith("$XDG_CONFIG_HOME")
    settings.save_key("runpod", "rp-from-keys-json")
    assert resolve_key("runpod").value == "rp-from-keys-json"
    monkeypatch.setenv("RUNPOD_API_KEY", "rp-env")
    key = resolve_key("runpod")
    assert key.value == "rp-env"
    assert "rp-env" not in repr(key) and "rp-env" not in str(key)
    assert "***" in repr(ApiKey("vast", "x", "secret"))


def test_unknown_provider_name():
    with pytest.raises(UsageError, match="did you mean runpod"):
        get_provider("runpd")


# --- RunPod ------------------------------------------------------------------------------------------
def test_runpod_offers_are_filtered_client_side_and_sorted(runpod_emulator):
    rp = get_provider("runpod", policy=FAST)
    offers = rp.search_offers(parse_query("gpu_ram>=40 num_gpus in [1,2]"))
    assert offers and all(o.vram_gb_per_gpu >= 40 and o.gpu_count in (1, 2) for o in offers)
    assert [o.price_per_hour_usd for o in offers] == sorted(o.price_per_hour_usd for o in offers)
    assert not any(o.gpu_name == "NVIDIA RTX A4000" for o in offers)  # no stock
    exact = rp.search_offers(parse_query("gpu_name=RTX_4090 num_gpus=4"))
    # one offer per cloud: Secure and Community are priced (and billed) differently
    assert sorted((o.gpu_name, o.gpu_count, o.cloud_type) for o in exact) == [
        ("NVIDIA GeForce RTX 4090", 4, "COMMUNITY"), ("NVIDIA GeForce RTX 4090", 4, "SECURE")]
    # every offer is pinned to a cloud and to a data centre that has that many GPUs free
    assert all(o.cloud_type in ("SECURE", "COMMUNITY") and o.data_center_id for o in offers)
    # the catalog was read through REST v2 only (no GraphQL, no v1)
    assert {op for op, _ in runpod_emulator.calls} == {"listGpuTypes"}


def test_runpod_round_trip_with_real_ssh(runpod_emulator, client_key):
    rp = get_provider("runpod", policy=FAST)
    offer = rp.search_offers(parse_query("gpu_name=RTX_4090 num_gpus=1"), disk_gb=20)[0]
    assert offer.cloud_type == "COMMUNITY"  # the cheaper cloud, quoted at its own price
    runpod_emulator.behaviours.append(PodBehaviour(pending_polls=3))
    seen = []
    result = provision(rp, spec_for(offer, client_key[1], env={"HF_HOME": "/workspace/hf"}),
                       on_created=seen.append)
    inst = result.instance
    assert seen and seen[0].instance_id == inst.instance_id
    assert inst.state is InstanceState.RUNNING and inst.label == "gpucli-run1"
    assert ssh_ok(inst, client_key[0])
    body = next(b for op, b in runpod_emulator.calls if op == "createPod")
    assert body["env"]["PUBLIC_KEY"] == client_key[1] and body["env"]["HF_HOME"] == "/workspace/hf"
    assert body["name"] == "gpucli-run1" and body["ports"] == ["22/tcp"]
    # pinned to the offer's cloud and data centre; the run folder's disk mounted at an explicit path
    _, _, cloud, dc = offer.offer_id.split("|")
    assert body["cloud"] == cloud and body["dataCenterIds"] == [dc]
    assert body["mounts"]["persistent"] == {"size": 20, "path": "/workspace"}
    assert result.billed_usd_per_hour == pytest.approx(offer.price_per_hour_usd, abs=1e-5)
    assert [i.instance_id for i in rp.list_instances()] == [inst.instance_id]
    assert rp.find_by_label("gpucli-run1").instance_id == inst.instance_id
    rp.terminate(inst.instance_id)
    rp.terminate(inst.instance_id)  # idempotent: v2 GET answers 404 for the id, so it is gone
    with pytest.raises(InstanceNotFound):
        rp.get(inst.instance_id)
    assert runpod_emulator.ledger.alive() == set()
    assert runpod_emulator.running_sshd_count() == 0


def test_runpod_spot_is_refused_in_one_line_naming_vast_bids(runpod_emulator, client_key):
    """RunPod removed interruptible pods in 2026 (runpodctl PR #267; runpod/docs 8e5aebdb)."""
    rp = get_provider("runpod", policy=FAST)
    with pytest.raises(SpotRefusedError, match=r"--provider vast --spot"):
        rp.search_offers(parse_query("gpu_name=RTX_4090 num_gpus=2"), spot=True)
    assert runpod_emulator.calls == [] and runpod_emulator.ledger.created() == []


def test_runpod_no_capacity(runpod_emulator, client_key):
    rp = get_provider("runpod", policy=FAST)
    offer = rp.search_offers(parse_query("gpu_name=RTX_4090 num_gpus=1"))[0]
    runpod_emulator.faults.add("no_capacity", "create")
    with pytest.raises(NoCapacityError):
        rp.create(spec_for(offer, client_key[1]))
    assert runpod_emulator.ledger.alive() == set()


def test_spot_without_bid_is_refused_before_any_call():
    with pytest.raises(UsageError, match="bid"):
        LaunchSpec(name="x", gpu_name="g", gpu_count=1, image="i", disk_gb=10,
                   ssh_public_key="ssh-ed25519 AAAA", spot=True)


def test_runpod_stop(runpod_emulator, client_key):
    rp = get_provider("runpod", policy=FAST)
    offer = rp.search_offers(parse_query("gpu_name=RTX_4090 num_gpus=1"))[0]
    inst = rp.create(spec_for(offer, client_key[1]))
    rp.stop(inst.instance_id)
    assert rp.get(inst.instance_id).state is InstanceState.EXITED
    rp.terminate(inst.instance_id)


def test_runpod_lost_create_answer_is_found_by_label(runpod_emulator, client_key):
    rp = get_provider("runpod", policy=FAST)
    offer = rp.search_offers(parse_query("gpu_name=RTX_4090 num_gpus=1"))[0]
    runpod_emulator.faults.add("lose_answer", "create")
    with pytest.raises(CreateAnswerLost):
        rp.create(spec_for(offer, client_key[1], name="lost1"))
    runpod_emulator.faults.add("lose_answer", "create")
    result = provision(rp, spec_for(offer, client_key[1], name="lost2"))
    assert len(runpod_emulator.ledger.created()) == 2  # exactly one per create call: no duplicate
    assert result.instance.label == "gpucli-lost2" and ssh_ok(result.instance, client_key[0])
    for inst in rp.list_instances():
        rp.terminate(inst.instance_id)
    assert runpod_emulator.ledger.alive() == set()


# --- vast.ai -----------------------------------------------------------------------------------------
def test_vast_search_sends_the_parsed_body(vast_emulator):
    vp = get_provider("vast", policy=FAST)
    offers = vp.search_offers(parse_query("gpu_name=RTX_3090 num_gpus>=4 reliability>0.95 inet_down>200"),
                              order="dlperf_usd-", limit=10)
    assert [o.offer_id for o in offers] == ["1001", "1009"]  # 68.2 then 64.2 dlperf per $
    assert json.dumps(vast_emulator.search_bodies[-1]) == json.dumps(
        {**parse_query("gpu_name=RTX_3090 num_gpus>=4 reliability>0.95 inet_down>200").to_vast_body(
            order="dlperf_usd-", limit=10, allocated_storage=50.0), "direct_port_count": {"gte": 1}})
    vp.search_offers(None, spot=True)
    assert vast_emulator.search_bodies[-1]["type"] == "bid"


def test_vast_round_trip_with_real_ssh(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    offers = vp.search_offers(parse_query("gpu_name=RTX_4090"))
    vast_emulator.behaviours.append(PodBehaviour(pending_polls=3))
    inst = provision(vp, spec_for(offers[0], client_key[1], name="v1"), offers).instance
    assert inst.ssh_ready and ssh_ok(inst, client_key[0])
    ask, body = vast_emulator.create_bodies[-1]
    assert ask == offers[0].offer_id and body["label"] == "gpucli-v1" and "price" not in body
    assert client_key[1] in body["onstart"]
    assert vp.find_by_label("gpucli-v1").instance_id == inst.instance_id
    vp.terminate(inst.instance_id)
    vp.terminate(inst.instance_id)  # 404 not_found "Instance not found" (destroy_instance.yaml) is success
    assert vast_emulator.ledger.alive() == set() and vast_emulator.running_sshd_count() == 0


def test_vast_spot_always_sends_price(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    offer = vp.search_offers(parse_query("gpu_name=RTX_3090 num_gpus=4"), spot=True)[0]
    inst = vp.create(spec_for(offer, client_key[1], spot=True, bid_per_gpu_usd=0.5))
    _, body = vast_emulator.create_bodies[-1]
    assert body["price"] == pytest.approx(0.5 * offer.gpu_count)
    vast_emulator.preempt(inst.instance_id)
    assert vp.get(inst.instance_id).state is InstanceState.STOPPED
    vp.terminate(inst.instance_id)


def test_vast_low_bid_contract_is_destroyed(vast_emulator, client_key):
    vast_emulator.honour_cancel_unavail = False  # a server that still makes the stopped contract
    vp = get_provider("vast", policy=FAST)
    offer = vp.search_offers(parse_query("gpu_name=RTX_3090 num_gpus=4"), spot=True)[0]
    with pytest.raises(ProviderError, match="bid"):
        vp.create(spec_for(offer, client_key[1], spot=True, bid_per_gpu_usd=0.01))
    assert len(vast_emulator.ledger.created()) == 1 and vast_emulator.ledger.alive() == set()


def test_vast_no_capacity_falls_through_to_next_offer(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    offers = vp.search_offers(parse_query("gpu_name=RTX_3090"))
    vast_emulator.faults.add("no_capacity", "create")
    result = provision(vp, spec_for(offers[0], client_key[1], name="cap"), offers, ssh_check=None)
    assert [a.ok for a in result.attempts] == [False, True]
    assert "no capacity" in result.attempts[0].reason
    vp.terminate(result.instance.instance_id)


def test_vast_listing_pages_and_v0_collection_is_gone(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    offer = vp.search_offers(parse_query("gpu_name=RTX_3090 num_gpus=1"))[0]
    made = {vp.create(spec_for(offer, client_key[1], name=f"p{i}")).instance_id for i in range(30)}
    assert {i.instance_id for i in vp.list_instances()} == made  # two pages of 25
    assert vp.http.request("GET", "/api/v0/instances/").status == 410
    for pod_id in made:
        vp.terminate(pod_id)
    assert vast_emulator.ledger.alive() == set()


@pytest.mark.parametrize("bad", ["exited", "offline", "unknown"])
def test_vast_dead_states_are_terminated_and_reported(vast_emulator, client_key, bad):
    vp = get_provider("vast", policy=FAST)
    offers = vp.search_offers(parse_query("gpu_name=RTX_3090"))[:2]
    for _ in offers:
        vast_emulator.behaviours.append(PodBehaviour(pending_polls=1, exit_after_polls=1, bad_state=bad))
    with pytest.raises(ProvisionFailed) as info:
        provision(vp, spec_for(offers[0], client_key[1], name="dead"), offers)
    assert len(info.value.attempts) == 2 and all(bad in a.reason for a in info.value.attempts)
    assert vast_emulator.ledger.alive() == set()


def test_stuck_loading_hits_the_deadline_and_is_terminated(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    offers = vp.search_offers(parse_query("gpu_name=RTX_3090"))[:1]
    vast_emulator.behaviours.append(PodBehaviour(stuck=True))
    with pytest.raises(ProvisionFailed, match="within"):
        provision(vp, spec_for(offers[0], client_key[1], name="stuck"), offers, ready_timeout_s=0.2)
    assert vast_emulator.ledger.alive() == set()
