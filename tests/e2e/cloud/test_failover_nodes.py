"""A launch of several machines across both clouds (``--provider any --nodes 2``) against the RunPod
(pods and Instant Clusters) and vast.ai (clusters and overlays) emulators: each provider's option of N
machines ranked on the whole run, a cluster refused or never whole ended before the next option, on the
other provider, trains; a provider that cannot rent N machines is skipped in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from tests.e2e.cloud.test_vast_clusters import vast_cluster_emulator  # noqa: F401 - the fixture
from tests.e2e.lifecycle.test_nodes import OWN_RUN, nothing_running, own_script, step_of
from tests.support.cli import cli, wait_for
from tests.support.emulators.common import PodBehaviour


@pytest.fixture
def clouds(runpod_emulator, cluster_emulator, vast_cluster_emulator):  # noqa: F811 - in this order: the v2 URL
    return runpod_emulator, cluster_emulator, vast_cluster_emulator


def cheap_runpod_h100(rp, usd: float) -> None:
    """RunPod's H100 listing at ``usd`` per GPU: its Instant Cluster is then the cheapest option."""
    for g in rp.gpu_types:
        if g["id"] == "NVIDIA H100 80GB HBM3":
            g["price"] = {"secure": usd, "community": usd}


def launch_nodes(capsys, tmp_path, name: str, *extra: str, nodes: int = 2, provider: str = "any"):
    return cli(capsys, "launch", "--provider", provider, "--profile", "h100", "--nodes", str(nodes), "--name", name,
               "--workdir", str(tmp_path / "pod" / name), *extra)


@pytest.mark.parametrize("fault", ["refused", "never-ready"])
def test_a_failed_runpod_cluster_is_deleted_and_a_vast_overlay_trains(fault, clouds, capsys, tmp_path, monkeypatch):
    rp, rpc, vast = clouds
    cheap_runpod_h100(rp, 1.50)  # 2 x $1.50/h: ranked before vast's pair on cluster 501 ($4.45/h)
    if fault == "refused":
        rpc.faults.add("no_capacity", "create_cluster", times=5)
    else:
        rpc.behaviours.extend([PodBehaviour(pending_polls=0), PodBehaviour(stuck=True)])
    vast.overlay_ifname = "lo"  # the pods share this machine's network: the overlay is its loopback here
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    monkeypatch.setenv("GPUCLI_PROVIDER_POLL_S", "0.1")
    name = f"fn-{fault}"  # its own rendezvous port: the two run side by side on this machine's loopback
    code, out, err = launch_nodes(capsys, tmp_path, name, "--code", str(own_script(tmp_path / "mine")),
                                  "--python", sys.executable, "--nccl-ifname", "lo", "--ready-timeout", "15",
                                  "--run", f"PATH={Path(sys.executable).parent}:$PATH {OWN_RUN}")
    assert code == 0, err
    record = runs.load(name)
    first, last = record.attempts[0], record.attempts[-1]
    assert first["provider"] == "runpod" and not first["ok"] and first["label"] == "Instant Cluster of 2 pods"
    assert last["ok"] and last["provider"] == "vast" and last["offer_id"] == "501" and len(record.attempts) == 2
    assert record.provider == "vast" and record.status == "running" and len(record.nodes) == 1
    assert "attempt on runpod Instant Cluster of 2 pods:" in err
    assert "attempt on vast overlay of 2 instances on cluster 501: running" in err
    if fault == "refused":
        assert "no capacity" in first["reason"] and first["cost_usd"] == 0 and not rpc.ledger.created()
    else:  # both pods were created, one never came up: the cluster was deleted whole, billed while it stood
        assert "1 of 2 pods ready" in first["reason"] and first["cost_usd"] > 0
        assert len(rpc.ledger.created()) == 2 and all(c.deleted for c in rpc.clusters.values())
        (cid,) = rpc.clusters
        calls = [(m, p) for m, p, _ in rpc.requests]
        deleted = calls.index(("DELETE", f"/v2/clusters/{cid}"))
        assert ("GET", f"/v2/clusters/{cid}/pods") in calls[deleted + 1:]  # gone by RunPod's word before vast
    assert not rpc.billing_pods()  # nothing left running or billing on RunPod
    (overlay,) = vast.overlays.values()
    assert vast.billing() == {record.instance_id, record.nodes[0].instance_id, f"overlay-{overlay.overlay_id}"}
    wait_for(lambda: step_of(capsys, name) >= 2, 180, "steps on the overlay")
    assert cli(capsys, "down", name)[0] == 0
    assert not vast.billing() and not vast.overlays
    wait_for(lambda: nothing_running(record), 60, "the run's processes to end")


def test_dry_run_ranks_each_providers_n_machines_on_the_whole_run(clouds, capsys, tmp_path):
    rp, rpc, vast = clouds
    code, out, err = launch_nodes(capsys, tmp_path, "fn-dry", "--dry-run", "--json")
    assert code == 0, err
    across = json.loads(out)["across"]
    offers = across["offers"]
    # vast: clusters 501 and 502 have two H100 machines each (503 has one); RunPod: one Instant Cluster
    assert [(o["provider"], o["offer"]) for o in offers] == [("vast", "501"), ("vast", "502"),
                                                             ("runpod", "NVIDIA H100 80GB HBM3 cluster")], offers
    assert all(o["nodes"] == 2 and o["gpus"] == 1 for o in offers)
    assert [o["run_usd"] for o in offers] == sorted(o["run_usd"] for o in offers)  # the order it would try
    assert offers[0]["usd_per_hour"] == pytest.approx(2.20 + 2.25, abs=0.05)  # both machines of cluster 501
    assert offers[2]["usd_per_hour"] >= 2 * 2.99  # two pods at RunPod's Secure Cloud H100 price
    hours = across["hours"]
    # the planned hours on every node (RunPod's cluster link is known; vast's is not: priced on RunPod's plan)
    assert hours and all(o["run_usd"] == pytest.approx(o["usd_per_hour"] * hours, rel=0.01) for o in offers)
    assert any(n.startswith("vast: its hours for 2 nodes are not planned") for n in across["notes"])
    code, out, err = launch_nodes(capsys, tmp_path, "fn-dry", "--dry-run", provider="runpod,vast")
    assert code == 0, err
    assert "1. 2 x 1x H100 SXM on vast (overlay of 2 instances on cluster 501)" in out
    assert "3. 2 x 1x NVIDIA H100 80GB HBM3 on runpod (Instant Cluster of 2 pods)" in out
    assert not rp.ledger.created() and not rpc.ledger.created() and not vast.ledger.created()
    assert not (runs.runs_dir() / "fn-dry.json").exists()


def test_a_provider_that_cannot_rent_n_machines_is_skipped_in_one_line(clouds, capsys, tmp_path):
    rp, rpc, vast = clouds
    code, out, err = launch_nodes(capsys, tmp_path, "fn3", "--dry-run", "--json", "--run", "true", nodes=3)
    assert code == 0, err
    across = json.loads(out)["across"]
    assert [o["provider"] for o in across["offers"]] == ["runpod"]
    assert any(n.startswith("vast: no vast.ai cluster has 3 machines of 1x H100 SXM") for n in across["notes"])
    assert not vast.ledger.created()


def test_no_provider_can_rent_n_machines_is_one_error(vast_cluster_emulator, capsys, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)  # vast alone: it has no cluster of three machines
    code, out, err = launch_nodes(capsys, tmp_path, "fn4", "--run", "true", nodes=3)
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert code != 0 and len(lines) == 1 and "no vast.ai cluster has 3 machines" in lines[0], err
    assert "Traceback" not in err + out
    assert not vast_cluster_emulator.ledger.created() and not vast_cluster_emulator.overlays
