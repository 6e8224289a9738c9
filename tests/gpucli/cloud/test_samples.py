"""The recorded sample responses in providers.md parse into the typed dataclasses unchanged."""

from __future__ import annotations

import json

from gpucli.cloud.base import InstanceNotFound, InstanceState
from gpucli.cloud.runpod import graphql_error, parse_gpu_type, parse_pod
from gpucli.cloud.vast import parse_instance, parse_offer
from gpucli.errors import NoCapacityError, ProviderError

# Sample 1 (verbatim)
RUNPOD_GPU_TYPE = json.loads("""{"data": {"gpuTypes": [{"lowestPrice": {"minimumBidPrice": 0.2,
 "uninterruptablePrice": 0.35, "minVcpu": 2, "minMemory": 8, "stockStatus": "High", "compliance": null,
 "maxUnreservedGpuCount": 5, "availableGpuCounts": [1, 2, 4], "__typename": "GpuTypeLowestPrice"},
 "id": "NVIDIA RTX A4000", "displayName": "RTX A4000", "memoryInGb": 16, "securePrice": 0.35,
 "communityPrice": 0.2, "oneMonthPrice": 200, "oneWeekPrice": 60, "threeMonthPrice": 500,
 "sixMonthPrice": 900, "secureSpotPrice": 0.18, "__typename": "GpuType"}]}}""")

# Sample 3 (verbatim)
RUNPOD_POD = json.loads("""{"data": {"pod": {"id": "ldl1dxirsim64n", "name": "Runpod Pytorch", "runtime": {
 "uptimeInSeconds": 11, "ports": [{"ip": "100.65.0.101", "isIpPublic": false, "privatePort": 8888,
 "publicPort": 60141, "type": "http"}], "gpus": [{"id": "GPU-e0488b7e-6932-795b-a125-4472c16ea72c",
 "gpuUtilPercent": 0, "memoryUtilPercent": 0}], "container": {"cpuPercent": 0, "memoryPercent": 0}}}}}""")

# Sample 6 (transcribed from the vast docs' YAML, values unchanged)
VAST_OFFER = json.loads("""{"id": 12345678, "ask_contract_id": 12345678, "bundle_id": 987654321,
 "compute_cap": 900, "cpu_cores": 64, "cpu_cores_effective": 32, "cpu_ram": 65536,
 "cuda_max_good": 11.2, "direct_port_count": 42, "disk_space": 2048.5,
 "dlperf": 222.22, "dlperf_per_dphtotal": 333.33, "dph_base": 0.123456, "dph_total": 0.234567,
 "geolocation": "Atlantis, AT", "gpu_name": "Imaginary RTX 9999", "gpu_ram": 24576,
 "gpu_total_ram": 49152, "hosting_type": 0, "inet_down": 9876.5, "inet_up": 8765.4,
 "is_bid": false, "machine_id": 88888, "min_bid": 0.111111, "num_gpus": 4,
 "public_ipaddr": "203.0.113.42", "reliability": 0.9999, "reliability2": 0.9999,
 "rentable": true, "rented": false, "score": 1234.5678, "static_ip": true,
 "storage_cost": 0.987654, "verification": "verified", "discounted_dph_total": 0.224567}""")

# Sample 7 (verbatim)
VAST_LOADING = json.loads('{"instances": {"actual_status": "loading", "ssh_host": "...", "ssh_port": 12345}}')


def test_runpod_gpu_type_sample():
    item = RUNPOD_GPU_TYPE["data"]["gpuTypes"][0]
    offer = parse_gpu_type(item, 2)
    assert offer is not None
    assert (offer.gpu_name, offer.gpu_display_name, offer.gpu_count) == ("NVIDIA RTX A4000", "RTX A4000", 2)
    assert offer.vram_gb_per_gpu == 16.0
    assert offer.price_per_gpu_hour_usd == 0.35
    assert offer.price_per_hour_usd == 0.70
    assert offer.spot_price_per_hour_usd == 0.4
    assert offer.stock == "High"
    assert parse_gpu_type(item, 8) is None  # 8 is not in availableGpuCounts


def test_runpod_create_sample_id_and_error_shapes():
    err = graphql_error([{"message": "Error Message"}], what="pod")  # Sample 4
    assert type(err) is ProviderError and "Error Message" in str(err)
    cap = graphql_error([{"message": "There are no longer any instances available with the requested "
                                     "specifications. Please refresh and try again."}], what="create")
    assert isinstance(cap, NoCapacityError)
    gone = graphql_error([{"message": "pod not found to terminate"}], what="podTerminate")
    assert isinstance(gone, InstanceNotFound)


def test_runpod_pod_sample_http_port_is_not_ssh():
    inst = parse_pod(RUNPOD_POD["data"]["pod"])
    assert inst.instance_id == "ldl1dxirsim64n"
    assert inst.label == "Runpod Pytorch" and not inst.is_ours
    assert inst.state is InstanceState.RUNNING
    assert inst.ssh_host is None and inst.ssh_port is None and not inst.ssh_ready


def test_runpod_runtime_null_is_pending_and_public_22_is_the_endpoint():
    pending = parse_pod({"id": "p", "name": "gpucli-x", "desiredStatus": "RUNNING", "runtime": None})
    assert pending.state is InstanceState.PENDING and "runtime=null" in pending.raw_status
    up = parse_pod({"id": "p", "name": "gpucli-x", "desiredStatus": "RUNNING", "runtime": {"ports": [
        {"ip": "10.0.0.1", "isIpPublic": False, "privatePort": 22, "publicPort": 1, "type": "tcp"},
        {"ip": "203.0.113.9", "isIpPublic": True, "privatePort": 22, "publicPort": 40022, "type": "tcp"}]}})
    assert (up.ssh_host, up.ssh_port, up.ssh_ready) == ("203.0.113.9", 40022, True)
    assert parse_pod({"id": "p", "desiredStatus": "EXITED", "runtime": None}).state is InstanceState.EXITED


def test_vast_offer_sample():
    offer = parse_offer(VAST_OFFER)
    assert offer is not None
    assert offer.offer_id == "12345678" and offer.gpu_name == "Imaginary RTX 9999" and offer.gpu_count == 4
    assert offer.vram_gb_per_gpu == 24.0
    assert offer.price_per_hour_usd == 0.234567
    assert offer.price_per_gpu_hour_usd == 0.234567 / 4
    assert offer.spot_price_per_hour_usd == 0.111111
    assert (offer.reliability, offer.inet_down_mbps, offer.inet_up_mbps) == (0.9999, 9876.5, 8765.4)
    assert (offer.location, offer.dlperf, offer.cuda_max, offer.disk_gb) == ("Atlantis, AT", 222.22, 11.2, 2048.5)
    assert offer.machine_id == "88888" and offer.verified is True


def test_vast_loading_sample_and_states():
    inst = parse_instance({**VAST_LOADING["instances"], "id": 7})
    assert inst.state is InstanceState.PENDING and inst.ssh_port == 12345
    assert not inst.ssh_ready
    direct = parse_instance({"id": 8, "actual_status": "running", "public_ipaddr": "203.0.113.42 ",
                             "ssh_host": "ssh2281.vast.ai", "ssh_port": 20000,
                             "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41234"}]}})
    assert (direct.ssh_host, direct.ssh_port, direct.ssh_ready) == ("203.0.113.42", 41234, True)
    proxy = parse_instance({"id": 9, "actual_status": "running", "ssh_host": "ssh2281.vast.ai", "ssh_port": 20000})
    assert (proxy.ssh_host, proxy.ssh_port) == ("ssh2281.vast.ai", 20000)
    for word, state in [("exited", InstanceState.EXITED), ("offline", InstanceState.FAILED),
                        ("unknown", InstanceState.UNKNOWN), (None, InstanceState.PENDING)]:
        assert parse_instance({"id": 1, "actual_status": word}).state is state
    outbid = parse_instance({"id": 1, "actual_status": "running", "cur_state": "stopped",
                             "intended_status": "stopped", "next_state": "stopped"})
    assert outbid.state is InstanceState.STOPPED
    oci = parse_instance({"id": 1, "actual_status": "created",
                          "status_msg": "Error response from daemon: OCI runtime create failed: x"})
    assert oci.state is InstanceState.FAILED
