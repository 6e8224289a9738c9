"""RunPod Instant Clusters against the emulator (strict routes of the v2 spec): the cluster is rented
and ended as one, and seeded faulty launches leave no member pod billing that no run owns."""

from __future__ import annotations

import os
import random

import pytest

from gpucli.errors import GpucliError
from gpucli.providers.runpod.clusterrent import ClusterNotReady, cluster_strays, end_cluster, rent_cluster
from gpucli.providers.runpod.clusters import RunPodClusters
from tests.support.emulators.common import PodBehaviour

# 100 in a long run (GPUCLI_FAULTY_LAUNCHES=100); a few here, each seed its own mix of faults.
LAUNCHES = int(os.environ.get("GPUCLI_FAULTY_LAUNCHES", "12"))
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDummyKeyForTheEmulatorOnly gpucli"


def rent(client, name, nodes=2, timeout=3.0, owned=None, **kw):
    ids: list[str] = []
    return rent_cluster(client, name=name, gpu_type="NVIDIA H100 80GB HBM3", gpus_per_pod=8, nodes=nodes,
                        image="img", disk_gb=50, public_key=KEY, ready_timeout_s=timeout, poll_s=0.02,
                        on_cluster=(owned.add if owned is not None else ids.append), on_pods=lambda p: None,
                        on_event=lambda m: None, **kw)


def test_a_cluster_comes_up_whole_and_goes_as_one(cluster_emulator):
    client = RunPodClusters(cluster_emulator.api_key)
    owned: set[str] = set()
    cid, nodes = rent(client, "gpucli-c1", nodes=3, owned=owned)
    assert owned == {cid} and [n.rank for n in nodes] == [0, 1, 2]
    assert all(n.ssh_port and n.ip for n in nodes)
    body = next(b for m, p, b in cluster_emulator.requests if m == "POST")
    assert body["type"] == "TRAINING" and body["compute"] == {"gpuTypeId": "NVIDIA H100 80GB HBM3",
                                                              "gpuCountPerPod": 8, "podCount": 3}
    assert body["startSsh"] is True and body["env"]["PUBLIC_KEY"] == KEY
    assert len(cluster_emulator.billing_pods()) == 3
    assert cluster_strays(client, owned=set()) and not cluster_strays(client, owned={cid})
    end_cluster(client, cid, lambda m: None)
    assert not cluster_emulator.billing_pods()


def test_the_emulator_is_as_strict_as_the_spec(cluster_emulator):
    client = RunPodClusters(cluster_emulator.api_key)
    for body, needle in (({"name": "x", "type": "TRAINING", "compute": {"gpuTypeId": "NVIDIA H200",
                                                                           "gpuCountPerPod": 1, "podCount": 1}},
                          "podCount"),
                         ({"name": "x", "type": "TRAINING", "gpuCount": 2,
                           "compute": {"gpuTypeId": "NVIDIA H200", "gpuCountPerPod": 1, "podCount": 2}},
                          "unknown field")):
        resp = client.http.request("POST", "/v2/clusters", json_body=body)
        assert resp.status == 400 and needle in resp.body["detail"]
    assert not cluster_emulator.ledger.created()


def test_a_cluster_not_whole_in_time_is_deleted(cluster_emulator):
    cluster_emulator.behaviours.extend([PodBehaviour(pending_polls=0), PodBehaviour(stuck=True)])
    client = RunPodClusters(cluster_emulator.api_key)
    with pytest.raises(ClusterNotReady, match="1 of 2 pods ready"):
        rent(client, "gpucli-c2", timeout=0.5)
    assert len(cluster_emulator.ledger.created()) == 2 and not cluster_emulator.billing_pods()


FAULTS = [("rate_limit", "create_cluster"), ("server_error", "create_cluster"), ("lose_answer", "create_cluster"),
          ("no_capacity", "create_cluster"), ("server_error", "cluster_pods"), ("rate_limit", "cluster_pods"),
          ("server_error", "delete_cluster"), ("rate_limit", "list_clusters")]


def test_seeded_faulty_multi_node_launches_leave_nothing_billing(cluster_emulator):
    client = RunPodClusters(cluster_emulator.api_key)
    outcomes = {"up": 0, "failed": 0}
    for seed in range(LAUNCHES):
        rng = random.Random(seed)
        for kind, endpoint in rng.sample(FAULTS, rng.randint(0, 3)):
            cluster_emulator.faults.add(kind, endpoint)
        nodes = rng.choice([2, 3])
        behaviours = [PodBehaviour(pending_polls=rng.randint(0, 3),
                                   stuck=rng.random() < 0.15,
                                   exit_after_polls=1 if rng.random() < 0.1 else None, bad_state="ERROR")
                      for _ in range(nodes)]
        cluster_emulator.behaviours.extend(behaviours)
        owned: set[str] = set()
        try:
            cid, _ = rent(client, f"gpucli-seed{seed}", nodes=nodes, timeout=0.6, owned=owned)
        except GpucliError:
            outcomes["failed"] += 1
        else:
            outcomes["up"] += 1
            # every member pod bills under this run's cluster, and nothing else does
            members = set(cluster_emulator.clusters[cid].members)
            assert cluster_emulator.billing_pods() == members
            end_cluster(client, cid, lambda m: None)  # the run ends: down deletes the cluster
        cluster_emulator.behaviours.clear()
        cluster_emulator.faults.clear()
        assert not cluster_emulator.billing_pods(), f"seed {seed}: pods left billing"
    assert outcomes["up"] and outcomes["failed"], outcomes


@pytest.mark.parametrize("primary_only", [False, True], ids=["every-node-ssh", "ssh-via-primary"])
def test_own_code_on_a_runpod_cluster_and_down_deletes_it(capsys, runpod_emulator, cluster_emulator, tmp_path,
                                                          monkeypatch, primary_only):
    import json
    import sys
    from pathlib import Path

    from gpucli.runs import records as runs
    from tests.e2e.lifecycle.test_nodes import OWN_RUN, nothing_running, own_script, step_of
    from tests.support.cli import cli, wait_for

    name = "rc2p" if primary_only else "rc2"  # the rendezvous port comes from the name (nodes.ports_for)
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    monkeypatch.setenv("GPUCLI_PROVIDER_POLL_S", "0.1")
    if primary_only:  # as the docs give it: an SSH endpoint for the primary only, workers reached through it
        cluster_emulator.primary_ssh_only = True
        monkeypatch.setenv("GPUCLI_CLUSTER_SSH_PORT", str(cluster_emulator.cluster_ssh_port))
    # the network volume the launch creates is mounted on every node: here its folder is the mount
    runpod_emulator.volume_ids.append(f"vol-{name}")
    store = runpod_emulator.volume_dir(f"vol-{name}")
    monkeypatch.setenv("GPUCLI_VOLUME_MOUNT", str(store))
    code_dir = own_script(tmp_path / "mine")
    code, out, err = cli(capsys, "launch", "--provider", "runpod", "--profile", "h100", "--nodes", "2",
                         "--name", name, "--code", str(code_dir), "--python", sys.executable,
                         "--run", f"PATH={Path(sys.executable).parent}:$PATH {OWN_RUN}")
    assert code == 0, err
    record = runs.load(name)
    cid = record.launch["cluster_id"]
    # created before the cluster, in the data centre the cluster is then placed in, and sent at create
    volume = record.launch["volume"]
    assert volume["id"] == f"vol-{name}" and volume["created"] and volume["size_gb"]
    body = next(b for m, p, b in cluster_emulator.requests if m == "POST" and p == "/v2/clusters")
    assert body["mounts"] == {"network": [{"volumeId": f"vol-{name}", "path": str(store)}]}
    assert body["dataCenterIds"] == [runpod_emulator.volumes[f"vol-{name}"]["dataCenter"]]
    assert f"network volume gpucli-{name} (vol-{name}" in " ".join(err.split()) and "/month" in err
    # every node's run folder is on the volume
    assert Path(record.workdir).is_relative_to(store) and Path(record.nodes[0].workdir).is_relative_to(store)
    members = cluster_emulator.clusters[cid].members
    assert record.instance_id == members[0] and record.nodes[0].instance_id == members[1]
    assert record.limits.price_per_hour_usd and record.nodes[0].ssh.port != record.ssh.port
    if primary_only:  # the worker through a direct-tcpip hop from the primary, whose key is pinned
        worker = record.nodes[0].ssh
        assert worker.host == "127.0.0.2" and worker.port == cluster_emulator.cluster_ssh_port
        assert worker.via == record.ssh and record.ssh.host_key
    else:
        assert record.nodes[0].ssh.via is None
    wait_for(lambda: step_of(capsys, name) >= 3, 180, "steps on the cluster")
    env0 = (Path(record.workdir) / "env").read_text()
    assert "NCCL_SOCKET_IFNAME=ens1" in env0 and "GPUCLI_NODES=2" in env0
    # the rendezvous is the PRIMARY_ADDR the nodes' own environment gives, never the API's overlay ip
    env1 = (Path(record.nodes[0].workdir) / "env").read_text()
    for env in (env0, env1):
        assert "GPUCLI_MASTER_ADDR=127.0.0.1" in env.replace("'", "") and "10.65." not in env
    assert "NCCL_SOCKET_IFNAME=ens1" in env1 and "GPUCLI_NODE_RANK=1" in env1.replace("'", "")
    code, out, err = cli(capsys, "status", name, "--json")
    assert [n["state"] for n in json.loads(out)["nodes"]] == ["running", "running"]
    code, out, err = cli(capsys, "down", name)
    assert code == 0, err
    assert not cluster_emulator.billing_pods()
    wait_for(lambda: nothing_running(record), 60, "the run's processes to end")
    # the volume outlives the cluster with the nodes' folders, and status says what it still bills
    assert f"vol-{name}" in runpod_emulator.volumes and (Path(record.workdir) / "env").exists()
    code, out, err = cli(capsys, "status", name)
    assert code == 0, err
    said = " ".join(out.split())
    assert "still billing" in said and f"network volume gpucli-{name} (vol-{name})" in said, out
    # a cluster no run owns is found and ended by down --strays
    client = RunPodClusters(cluster_emulator.api_key)
    cluster_emulator.behaviours.extend([PodBehaviour(pending_polls=0), PodBehaviour(pending_polls=0)])
    rent(client, "gpucli-orphan")
    code, out, err = cli(capsys, "down", "--strays", "--yes")
    assert code == 0, err + out
    assert not cluster_emulator.billing_pods()


def test_watch_deletes_the_cluster_of_a_run_that_is_over(cluster_emulator):
    from gpucli.plan.catalog import load_catalog
    from gpucli.run.life import lifecycle
    from gpucli.runs import records as runs

    client = RunPodClusters(cluster_emulator.api_key)
    cid, nodes = rent(client, "gpucli-over")
    record = runs.RunRecord(name="over", provider="runpod", created_at=runs.now_iso(), profile="8xH100",
                            phase="fast", model="124m", n_gpus=8, gpu="h100-sxm", workdir="w", status="failed",
                            launch={"request": {"profile": "8xH100"}, "cluster_id": cid},
                            nodes=(runs.NodeRecord(rank=1, workdir="w-node1", instance_id=nodes[1].pod_id),))
    runs.save(record)
    assert runs.load("over").nodes[0].instance_id == nodes[1].pod_id  # the record keeps its nodes
    notices = []
    assert lifecycle.watch("over", load_catalog(), mirror=False, recover=False, on_notice=notices.append) == "ended"
    assert not cluster_emulator.billing_pods()
    assert any(f"deleted its cluster {cid}" in n.text for n in notices)



@pytest.mark.parametrize("pod_key_may", [True, False])
def test_rank_0s_watchdog_deletes_its_cluster_with_its_pod_key(pod_key_may, cluster_emulator, tmp_path, monkeypatch):
    """Issue 41 rule 3: with the cluster's id in its env file, rank 0's watchdog ends the run with
    DELETE /v2/clusters/{id} and its pod key; where the key may not (no source says it may), it says so and
    the cluster is left to the laptop (watch, ls, status, down); the path is in watchdog.json's terms."""
    from gpucli.pod import watchdog

    cluster_emulator.pod_key_deletes_cluster = pod_key_may
    cid, nodes = rent(RunPodClusters(cluster_emulator.api_key), "gpucli-rank0")
    pod = nodes[0].pod_id
    key = cluster_emulator.pod_key_of(pod)
    environ = tmp_path / "environ"
    environ.write_bytes(f"RUNPOD_POD_ID={pod}\0RUNPOD_API_KEY={key}\0".encode())
    monkeypatch.setenv("GPUCLI_POD_ENVIRON", str(environ))
    monkeypatch.setenv("GPUCLI_RUNPOD_API_BASE_URL", cluster_emulator.url)
    monkeypatch.setenv("GPUCLI_RUNPOD_CLUSTER_ID", cid)
    monkeypatch.setenv("GPUCLI_WATCHDOG_END_CAP_S", "1")
    path = watchdog.end_pod("runpod", "stop", tmp_path)
    log = (tmp_path / "watchdog.log").read_text()
    if pod_key_may:
        assert path == "REST v2 cluster" and not cluster_emulator.billing_pods()
        assert all(e.by == "pod-key" for n in nodes for e in cluster_emulator.ledger.ended(n.pod_id))
    else:
        assert path is None and "REST v2 cluster" in log and "HTTP 403" in log
        assert len(cluster_emulator.billing_pods()) == 2
        end_cluster(RunPodClusters(cluster_emulator.api_key), cid, lambda m: None)
    assert key not in log


def test_a_bare_404_is_never_a_gone_cluster(cluster_emulator):
    """A 404 without v2's problem body (a wrong URL, a proxy) says nothing about the cluster (openapi
    ErrorResponse); only the problem 404 is "gone"."""
    client = RunPodClusters(cluster_emulator.api_key)
    cid, _ = rent(client, "gpucli-bare")
    cluster_emulator.faults.add("server_error", "cluster_pods", status=404)  # an HTML 404, no problem body
    cluster_emulator.faults.add("server_error", "delete_cluster", status=404)
    with pytest.raises(GpucliError):
        client.pods(cid)
    with pytest.raises(GpucliError):
        client.delete(cid)
    assert len(cluster_emulator.billing_pods()) == 2
    end_cluster(client, cid, lambda m: None)
    assert client.pods(cid) is None and client.delete(cid) is False


def test_a_cluster_mounts_only_a_volume_of_its_data_centre(runpod_emulator, cluster_emulator):
    from gpucli.errors import ProviderError
    from gpucli.providers.runpod.api import RunPodProvider

    vol = RunPodProvider().create_volume("gpucli-vol", 20,
                                     runpod_emulator.data_centers[0]["id"])
    client = RunPodClusters(cluster_emulator.api_key)
    args = dict(name="gpucli-mnt", gpu_type_id="NVIDIA H100 80GB HBM3", gpus_per_pod=8, pods=2, image="img",
                disk_gb=50, public_key=KEY)
    for volume_id, dcs, needle in (("vol-none", (vol.data_center_id,), "404"),
                                   (vol.volume_id, ("XX-NOWHERE-1",), "400")):
        with pytest.raises(ProviderError, match=needle):
            client.create(**args, volume_id=volume_id, data_centers=dcs)
    assert not cluster_emulator.ledger.created()
    cid = client.create(**args, volume_id=vol.volume_id, data_centers=(vol.data_center_id,))
    assert cluster_emulator.clusters[cid].volume_id == vol.volume_id
    end_cluster(client, cid, lambda m: None)
    assert vol.volume_id in runpod_emulator.volumes  # the volume outlives its cluster


def test_volume_with_several_nodes_is_refused_off_runpod():
    from gpucli.errors import UsageError
    from gpucli.run.host.nodes import check_request
    from gpucli.run.inputs.launch import LaunchRequest

    with pytest.raises(UsageError, match="RunPod only"):
        check_request(LaunchRequest(profile="h100", provider="vast", nodes=2, volume="v"))
    check_request(LaunchRequest(profile="h100", provider="runpod", nodes=2, volume="v"))


def test_a_failed_cluster_launch_keeps_the_volume_it_created_and_says_so(capsys, runpod_emulator, cluster_emulator,
                                                                         tmp_path, monkeypatch):
    """No capacity for the cluster after its network volume was made: nothing bills by the hour, the volume
    is kept (a volume is never deleted by gpucli: it may hold a user's data), and the error line says
    what it bills per month and the command that deletes it."""
    import sys

    from gpucli.runs import records as runs
    from tests.e2e.lifecycle.test_nodes import OWN_RUN, own_script
    from tests.support.cli import cli

    name = "rcfail"
    runpod_emulator.volume_ids.append(f"vol-{name}")
    monkeypatch.setenv("GPUCLI_VOLUME_MOUNT", str(runpod_emulator.volume_dir(f"vol-{name}")))
    cluster_emulator.faults.add("no_capacity", "create_cluster")
    code, out, err = cli(capsys, "launch", "--provider", "runpod", "--profile", "h100", "--nodes", "2",
                         "--name", name, "--code", str(own_script(tmp_path / "mine")), "--python", sys.executable,
                         "--run", OWN_RUN)
    said = " ".join(err.split())
    assert code != 0 and "Traceback" not in err
    assert "no capacity" in said and f"network volume gpucli-{name} (vol-{name}" in said, err
    assert "is kept and bills $" in said and f"network-volumes/vol-{name}" in said, err
    assert "$RUNPOD_API_KEY" in said and cluster_emulator.api_key not in err  # the command, never the key
    assert f"vol-{name}" in runpod_emulator.volumes and not cluster_emulator.billing_pods()
    assert runs.load(name).launch["volume"]["id"] == f"vol-{name}"  # the record still knows it


def test_a_cluster_node_below_the_health_bars_ends_the_launch_and_the_cluster(capsys, runpod_emulator,
                                                                             cluster_emulator, tmp_path,
                                                                             monkeypatch):
    """Each node of a run over several machines is held to nvidia-smi's bars before the run starts: a
    member with uncorrected ECC errors ends the launch in one line naming that node, the cluster is
    deleted whole, and the kept volume is said (issue 42: bad hosts found before the run)."""
    import sys

    from tests.e2e.cloud.test_cloud_launch import TINY
    from tests.support.cli import cli

    name = "rcsick"
    gpu = "NVIDIA H100 80GB HBM3"
    runpod_emulator.volume_ids.append(f"vol-{name}")
    monkeypatch.setenv("GPUCLI_VOLUME_MOUNT", str(runpod_emulator.volume_dir(f"vol-{name}")))
    cluster_emulator.behaviours.extend([PodBehaviour(pending_polls=0, nvidia_smi=f"{gpu}, 0, Not Active\n"),
                                        PodBehaviour(pending_polls=0, nvidia_smi=f"{gpu}, 3, Not Active\n")])
    code, out, err = cli(capsys, "launch", "--provider", "runpod", "--profile", "h100", "--nodes", "2",
                         "--name", name, "--python", sys.executable, "--ready-timeout", "20", *TINY)
    said = " ".join(err.split())
    assert code != 0 and "Traceback" not in err, err
    assert "preflight failed (smi)" in said and "node 127.0.0.1:" in said and "ECC" in said, err
    assert not cluster_emulator.billing_pods() and all(c.deleted for c in cluster_emulator.clusters.values())
    assert f"vol-{name}" in runpod_emulator.volumes  # the checkpoints' volume is never deleted by a failure
