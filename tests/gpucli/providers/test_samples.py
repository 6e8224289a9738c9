"""Sample responses (RunPod REST v2 openapi examples, vast docs) parse into the typed dataclasses."""

from __future__ import annotations

import json

from gpucli.providers.api import InstanceState
from gpucli.providers.runpod.v2 import is_problem_404, parse_gpu_type, parse_pod, problem_detail
from gpucli.providers.vast.api import parse_instance, parse_offer

# REST v2 shapes, with the example values of runpod/docs api-reference-v2/openapi.json (GpuType, Pod).
RUNPOD_GPU_TYPE = {"id": "NVIDIA RTX A4000", "name": "RTX A4000", "pool": None, "manufacturer": "NVIDIA",
                   "memory": 16, "secure": True, "community": True, "price": {"secure": 0.44, "community": 0.31},
                   "maxCount": {"secure": 8, "community": 4}, "availability": "HIGH",
                   "dataCenters": [{"id": "US-TX-3", "name": "US-TX-3", "availability": "LOW"},
                                   {"id": "EU-RO-1", "name": "EU-RO-1", "availability": "HIGH"}],
                   "cudaVersions": [{"version": "12.8", "available": True}, {"version": "12.6", "available": False}]}

RUNPOD_POD = {"id": "pod_abc123", "name": "my-training-pod", "status": "RUNNING", "image": "runpod/pytorch",
              "gpu": {"id": "NVIDIA RTX A4000", "count": 1}, "cloud": "SECURE", "dataCenterId": "US-TX-3",
              "cudaVersion": "12.8", "cost": 0.35, "mounts": {"persistent": {"size": 20, "path": "/workspace"}},
              "ssh": {"proxy": None, "direct": None},
              "runtime": {"uptime": 11, "ports": [{"private": 8888, "public": 60141, "type": "http",
                                                    "ip": "100.65.0.101"}]}}

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
    offer = parse_gpu_type(RUNPOD_GPU_TYPE, 2, "COMMUNITY", storage_per_hour=0.01)
    assert offer is not None
    assert (offer.gpu_name, offer.gpu_display_name, offer.gpu_count) == ("NVIDIA RTX A4000", "RTX A4000", 2)
    assert offer.vram_gb_per_gpu == 16.0
    assert offer.price_per_gpu_hour_usd == (0.62 + 0.01) / 2  # the whole quote per GPU, disks included
    assert offer.price_per_hour_usd == 0.62 + 0.01  # the GPUs plus the disks
    assert offer.spot_price_per_hour_usd is None  # no spot on RunPod any more
    assert (offer.cloud_type, offer.data_center_id, offer.cuda_max) == ("COMMUNITY", "EU-RO-1", 12.8)
    assert parse_gpu_type(RUNPOD_GPU_TYPE, 8, "COMMUNITY", storage_per_hour=0) is None  # maxCount.community 4
    assert parse_gpu_type({**RUNPOD_GPU_TYPE, "availability": "NONE"}, 1, "SECURE", storage_per_hour=0) is None


def test_runpod_v2_errors_and_gone():
    assert problem_detail({"title": "Bad Request", "status": 400, "detail": "no", "errors": ["a"]}, "") == "no; a"
    assert is_problem_404({"title": "Not Found", "status": 404, "detail": "The requested Pod does not exist."})
    assert not is_problem_404(None) and not is_problem_404({"message": "Pod not found"})  # v1's shape


def test_runpod_pod_sample_http_port_is_not_ssh():
    inst = parse_pod(RUNPOD_POD)
    assert inst.instance_id == "pod_abc123"
    assert inst.label == "my-training-pod" and not inst.is_ours
    assert inst.state is InstanceState.RUNNING and inst.price_per_hour_usd == 0.35
    assert inst.ssh_host is None and inst.ssh_port is None and not inst.ssh_ready
    assert inst.stopped_usd_per_month == 20 * 0.20  # the volume disk at its stopped rate


def test_runpod_runtime_null_is_pending_and_ssh_direct_is_the_endpoint():
    pending = parse_pod({"id": "p", "name": "gpucli-x", "status": "STARTING", "runtime": None})
    assert pending.state is InstanceState.PENDING and "runtime=null" in pending.raw_status
    up = parse_pod({"id": "p", "name": "gpucli-x", "status": "RUNNING", "runtime": {"ports": []},
                    "ssh": {"direct": {"host": "203.0.113.9", "port": 40022, "username": "root", "command": "x"}}})
    assert (up.ssh_host, up.ssh_port, up.ssh_ready) == ("203.0.113.9", 40022, True)
    assert parse_pod({"id": "p", "status": "EXITED", "runtime": None}).state is InstanceState.EXITED
    assert parse_pod({"id": "p", "status": "TERMINATED"}).state is InstanceState.TERMINATED


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
