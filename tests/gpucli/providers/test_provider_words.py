"""Answers read as the providers' sources define them (issue 41 point 8), against the emulators.

vast: a revoked key answers 404 ``auth_error`` (show_charges.yaml) and is an auth error, never "gone";
destroy of a gone instance answers 404 ``not_found`` (destroy_instance.yaml L64-78) and is done.
RunPod: createPod 403 "cannot access the requested pool" skips that offer (openapi createPod error
table); a pod that runs without a public SSH port is given up early and its cloud is not tried again;
a pod list that pages is read to the end; ``cudaVersions`` compare per component.
"""

from __future__ import annotations

import pytest

from gpucli.errors import ProviderError
from gpucli.providers.api import InstanceNotFound, LaunchSpec
from gpucli.providers.clients import get_provider
from gpucli.providers.http import AuthError, RetryPolicy
from gpucli.providers.provision import provision_with_retries
from gpucli.providers.query import parse_query
from gpucli.providers.runpod.v2 import parse_gpu_type
from gpucli.providers.vast.words import AUTH, GONE, OTHER, instance_answer
from tests.support.emulators import PodBehaviour

FAST = RetryPolicy(max_attempts=3, base_delay_s=0.001, max_delay_s=0.005, deadline_s=5)


def spec_for(offer, pub, name="words1"):
    return LaunchSpec(name=name, gpu_name=offer.gpu_name, gpu_count=offer.gpu_count, image="pytorch/pytorch",
                      disk_gb=20, ssh_public_key=pub, offer_id=offer.offer_id)


def test_vast_answer_words_in_one_function():
    assert instance_answer(404, {"success": False, "error": "auth_error", "msg": "Invalid user key"}) == AUTH
    assert instance_answer(401, {"error": "auth_error"}) == AUTH
    assert instance_answer(404, {"success": False, "error": "not_found", "msg": "Instance not found"}) == GONE
    assert instance_answer(404, {"success": False, "error": "no_such_instance"}) == GONE
    assert instance_answer(404, None) == OTHER  # a bare 404 (a proxy, a wrong URL) proves nothing
    assert instance_answer(500, {"error": "not_found"}) == OTHER


def test_vast_revoked_key_is_an_auth_error_never_a_gone_pod(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    offer = vp.search_offers(parse_query("gpu_name=RTX_3090 num_gpus=1"))[0]
    inst = vp.create(spec_for(offer, client_key[1]))
    vast_emulator.api_key = "a-new-key"  # the user revoked the key gpucli holds
    with pytest.raises(AuthError, match="rejected the API key"):
        vp.get(inst.instance_id)
    with pytest.raises(AuthError):
        vp.terminate(inst.instance_id)
    assert vast_emulator.ledger.alive() == {inst.instance_id}  # still billing: nobody may call it gone
    vast_emulator.api_key = "vast-test-key"
    vp.terminate(inst.instance_id)


def test_vast_destroy_of_a_gone_instance_is_done(vast_emulator, client_key):
    vp = get_provider("vast", policy=FAST)
    offer = vp.search_offers(parse_query("gpu_name=RTX_3090 num_gpus=1"))[0]
    inst = vp.create(spec_for(offer, client_key[1]))
    vp.terminate(inst.instance_id)
    vp.terminate(inst.instance_id)  # 404 not_found "Instance not found": already gone, no error
    assert [b for m, p, b in vast_emulator.requests if m == "DELETE"] == [None, None]
    with pytest.raises(InstanceNotFound):
        vp.get(inst.instance_id)


def test_runpod_pool_refused_skips_to_the_next_offer(runpod_emulator, client_key):
    rp = get_provider("runpod", policy=FAST)
    offers = rp.search_offers(parse_query("gpu_name=RTX_4090 num_gpus=1"))
    first, other = offers[0], next(o for o in offers[1:] if (o.cloud_type, o.data_center_id)
                                   != (offers[0].cloud_type, offers[0].data_center_id))
    runpod_emulator.closed_pools.add((first.cloud_type, first.data_center_id))
    result = provision_with_retries(rp, spec_for(first, client_key[1]), [first, other], poll_interval_s=0.005,
                                    ready_timeout_s=20)
    assert "cannot use the pool" in result.attempts[0].reason and result.attempts[0].instance_id is None
    assert result.instance.cloud_type == other.cloud_type and result.instance.data_center_id == other.data_center_id
    rp.terminate(result.instance.instance_id)
    assert runpod_emulator.ledger.alive() == set()


def test_runpod_pod_without_public_ssh_is_given_up_early_and_its_cloud_not_retried(runpod_emulator, client_key):
    rp = get_provider("runpod", policy=FAST)
    offers = rp.search_offers(parse_query("gpu_name=RTX_4090 num_gpus=1"))
    community = [o for o in offers if o.cloud_type == "COMMUNITY"]
    secure = [o for o in offers if o.cloud_type == "SECURE"]
    assert community and secure
    runpod_emulator.behaviours.append(PodBehaviour(no_public_ip=True))
    tried = [community[0], community[0], secure[0]]
    result = provision_with_retries(rp, spec_for(community[0], client_key[1]), tried, poll_interval_s=0.01,
                                    ready_timeout_s=600, unexposed_grace_s=0.3)
    reasons = [a.reason for a in result.attempts]
    assert "running without a public SSH port" in reasons[0]  # not "within 600 s"
    assert reasons[1].startswith("skipped: a COMMUNITY pod ran without a public SSH port")
    assert result.instance.cloud_type == "SECURE"
    assert len(runpod_emulator.ledger.created()) == 2  # the unexposed one (terminated) and the one in use
    rp.terminate(result.instance.instance_id)
    assert runpod_emulator.ledger.alive() == set()


def test_runpod_pod_list_is_read_to_its_last_page(runpod_emulator, client_key):
    rp = get_provider("runpod", policy=FAST)
    offer = rp.search_offers(parse_query("gpu_name=RTX_4090 num_gpus=1"))[0]
    made = {rp.create(spec_for(offer, client_key[1], name=f"page{i}")).instance_id for i in range(5)}
    runpod_emulator.pods_page_size = 2
    assert {i.instance_id for i in rp.list_instances()} == made
    cursors = [b.get("cursor") for op, b in runpod_emulator.calls if op == "listPods"]
    assert cursors == [None, "2", "4"]
    for pod_id in made:
        rp.terminate(pod_id)


def test_runpod_page_cut_short_without_a_cursor_is_an_error(runpod_emulator):
    rp = get_provider("runpod", policy=FAST)
    from tests.support.emulators.common import Reply

    runpod_emulator.add_route("GET", "/v2/pods", "list", lambda c: Reply(200, {"pods": [], "truncated": True}))
    runpod_emulator.routes.insert(0, runpod_emulator.routes.pop())  # before the emulator's own route
    with pytest.raises(ProviderError, match="cut short"):
        rp.list_instances()


def test_runpod_cuda_versions_compare_per_component(runpod_emulator):
    item = {"id": "G", "name": "G", "memory": 24, "price": {"secure": 1.0}, "maxCount": {"secure": 8},
            "availability": "HIGH", "dataCenters": [{"id": "DC", "availability": "HIGH"}],
            "cudaVersions": [{"version": "12.4", "available": True}, {"version": "12.10", "available": True},
                             {"version": "12.9", "available": True}]}
    offer = parse_gpu_type(item, 1, "SECURE", storage_per_hour=0.0)
    assert offer is not None and offer.cuda_version == "12.10"
    assert parse_query("cuda_max_good>=12.4").matches(offer.query_record())
    assert not parse_query("cuda_max_good>=12.11").matches(offer.query_record())
    # and through the service: a data centre whose hosts run CUDA 12.10 passes a >= 12.4 filter
    for dc in runpod_emulator.data_centers:
        dc["cuda"] = "12.10" if dc["id"] == "EU-RO-1" else "12.2"
    rp = get_provider("runpod", policy=FAST)
    found = rp.search_offers(parse_query("gpu_name=RTX_4090 num_gpus=1 cuda_max_good>=12.4"))
    assert found and all(o.data_center_id == "EU-RO-1" for o in found)


def test_runpod_network_volume_is_created_standard_and_quoted_at_that_price(runpod_emulator):
    """openapi CreateNetworkVolumeRequest.type: omitted -> the data centre's default tier, which may be
    high-performance ("priced at a premium", high-performance-storage.mdx L42, L55-58)."""
    runpod_emulator.default_volume_type["EU-RO-1"] = "HIGH_PERFORMANCE"
    rp = get_provider("runpod", policy=FAST)
    volume = rp.create_volume("words-vol", 50, "EU-RO-1")
    sent = [b for op, b in runpod_emulator.calls if op == "createNetworkVolume"]
    assert sent[-1]["type"] == "STANDARD" and runpod_emulator.volumes[volume.volume_id]["type"] == "STANDARD"
    assert volume.volume_type == "STANDARD" and volume.usd_per_month == pytest.approx(50 * 0.07)
    fast = runpod_emulator.create_volume("hps", "EU-RO-1", 50, volume_type="HIGH_PERFORMANCE")
    found = rp.find_volume(fast)
    assert found.volume_type == "HIGH_PERFORMANCE" and found.usd_per_month is None  # never quoted as standard
