"""vast.ai clusters against the emulator (tests/support/emulators/vastcluster.py): N instances of one
physical cluster on an overlay network, rented and ended as one; seeded faulty launches leave no
instance or overlay billing that no run owns."""

from __future__ import annotations

import getpass
import os
import random

import pytest

from gpucli.errors import GpucliError
from gpucli.providers.api import LaunchSpec
from gpucli.providers.vast.api import VastProvider
from gpucli.providers.vast.cluster import VastOverlays, choose_cluster, end_overlay, rent_overlay
from tests.support.emulators.common import PodBehaviour
from tests.support.emulators.vastcluster import CLUSTER_OFFERS, VastClusterEmulator

# 100 in a long run (GPUCLI_FAULTY_LAUNCHES=100); a few here, each seed its own mix of faults.
LAUNCHES = int(os.environ.get("GPUCLI_FAULTY_LAUNCHES", "12"))
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDummyKeyForTheEmulatorOnly gpucli"


@pytest.fixture
def vast_cluster_emulator(tmp_path_factory, monkeypatch):
    emu = VastClusterEmulator(tmp_path_factory.mktemp("vast_cluster_emu"))
    emu.start()
    monkeypatch.setenv("VAST_URL", emu.url)
    monkeypatch.setenv("VAST_API_KEY", emu.api_key)
    monkeypatch.setenv("GPUCLI_POD_SSH_USER", getpass.getuser())
    monkeypatch.setenv("GPUCLI_HTTP_BACKOFF_S", "0.001")
    try:
        yield emu
    finally:
        emu.stop()


def offers_of(emu, cluster_id):
    from gpucli.providers.vast.api import parse_offer

    return [parse_offer(o) for o in emu.offers if o.get("cluster_id") == cluster_id]


def rent(client, name, offers, *, timeout=3.0, owned=None):
    owned = owned if owned is not None else {}

    def spec(rank, offer):
        return LaunchSpec(name=f"{name}-n{rank}", gpu_name=offer.gpu_name, gpu_count=1, image="img", disk_gb=20,
                          ssh_public_key=KEY, offer_id=offer.offer_id)

    return rent_overlay(client, VastOverlays(client), name=f"gpucli-{name}", cluster_id="501", offers=offers,
                        spec=spec, ready_timeout_s=timeout, poll_s=0.02,
                        on_overlay=lambda o: owned.setdefault("overlay", o),
                        on_instance=lambda r, i: owned.setdefault("instances", set()).add(i),
                        on_event=lambda m: None)


def test_two_instances_on_one_overlay_and_they_end_as_one(vast_cluster_emulator):
    emu = vast_cluster_emulator
    client = VastProvider()
    owned: dict = {}
    overlay_id, nodes = rent(client, "ov1", offers_of(emu, 501), owned=owned)
    assert owned["overlay"] == overlay_id and [n.rank for n in nodes] == [0, 1]
    listed = VastOverlays(client).list()
    assert [o.instances for o in listed] == [tuple(n.instance_id for n in nodes)] and listed[0].cluster_id == "501"
    assert emu.billing() == owned["instances"] | {f"overlay-{overlay_id}"}
    end_overlay(client, VastOverlays(client), [n.instance_id for n in nodes], overlay_id)
    assert not emu.billing()


def test_the_emulator_is_as_strict_as_the_sources(vast_cluster_emulator):
    emu = vast_cluster_emulator
    http = VastProvider().http
    bad = [({"cluster_id": 999, "name": "x"}, "no physical cluster"), ({"cluster_id": 501, "name": "Bad_Name"},
                                                                        "invalid overlay name"),
           ({"cluster_id": 501, "name": "x", "extra": 1}, "takes cluster_id and name")]
    for body, needle in bad:
        resp = http.request("POST", "/api/v0/overlay/", json_body=body)
        assert resp.status == 400 and needle in resp.body["msg"]
    assert http.request("POST", "/api/v0/overlay/", json_body={"cluster_id": 501, "name": "ok"}).ok
    # an instance on a machine outside the overlay's cluster cannot join it
    client = VastProvider()
    other = next(o for o in offers_of(emu, 502))
    inst = client.create(LaunchSpec(name="outside", gpu_name=other.gpu_name, gpu_count=1, image="img", disk_gb=20,
                                    ssh_public_key=KEY, offer_id=other.offer_id))
    resp = http.request("PUT", "/api/v0/overlay/", json_body={"name": "ok", "instance_id": int(inst.instance_id)})
    assert resp.status == 400 and "not on a machine of cluster 501" in resp.body["msg"]
    # deleting an overlay does not end its instances: they still bill
    ov = VastOverlays(client).find("ok")
    VastOverlays(client).delete(ov.overlay_id)
    assert emu.billing() == {inst.instance_id}
    client.terminate(inst.instance_id)


def test_an_overlay_not_whole_in_time_is_ended_whole(vast_cluster_emulator):
    emu = vast_cluster_emulator
    emu.behaviours.extend([PodBehaviour(pending_polls=0), PodBehaviour(stuck=True)])
    with pytest.raises(GpucliError, match="1 of 2 instances ready on it"):
        rent(VastProvider(), "ov2", offers_of(emu, 501), timeout=0.5)
    assert len([e for e in emu.ledger.created() if not e.pod_id.startswith("overlay")]) == 2
    assert not emu.billing() and not emu.overlays


def test_no_cluster_with_enough_machines_is_one_line():
    from gpucli.providers.vast.api import parse_offer

    by_cluster: dict = {}
    for o in CLUSTER_OFFERS:
        by_cluster.setdefault(str(o["cluster_id"]), []).append(parse_offer(o))
    with pytest.raises(GpucliError, match="no vast.ai cluster has 3 machines of 1x H100 SXM .the most in one cluster: 2"):
        choose_cluster(by_cluster, 3, "1x H100 SXM")
    assert choose_cluster(by_cluster, 2, "x")[0] == "501"  # the cheapest pair


FAULTS = [("rate_limit", "create_overlay"), ("server_error", "create_overlay"), ("lose_answer", "create_overlay"),
          ("server_error", "create"), ("lose_answer", "create"), ("no_capacity", "create"),
          ("server_error", "join_overlay"), ("lose_answer", "join_overlay"), ("server_error", "get"),
          ("rate_limit", "get"), ("server_error", "terminate"), ("server_error", "delete_overlay"),
          ("rate_limit", "show_overlays")]


def test_seeded_faulty_overlay_launches_leave_nothing_billing(vast_cluster_emulator):
    emu = vast_cluster_emulator
    client = VastProvider()
    outcomes = {"up": 0, "failed": 0}
    for seed in range(LAUNCHES):
        rng = random.Random(seed)
        for kind, endpoint in rng.sample(FAULTS, rng.randint(0, 3)):
            emu.faults.add(kind, endpoint)
        emu.behaviours.extend(PodBehaviour(pending_polls=rng.randint(0, 3), stuck=rng.random() < 0.15,
                                           exit_after_polls=1 if rng.random() < 0.1 else None)
                              for _ in range(2))
        emu.join_requires_running = rng.random() < 0.5  # a join before the instance runs: refused, retried
        owned: dict = {}
        try:
            overlay_id, nodes = rent(client, f"seed{seed}", offers_of(emu, 501), timeout=0.6, owned=owned)
        except GpucliError:
            outcomes["failed"] += 1
        else:
            outcomes["up"] += 1
            # both instances and the overlay bill under this run, and nothing else does
            assert emu.billing() == {n.instance_id for n in nodes} | {f"overlay-{overlay_id}"}
            end_overlay(client, VastOverlays(client), [n.instance_id for n in nodes], overlay_id)  # down
        emu.behaviours.clear()
        emu.faults.clear()
        assert not emu.billing(), f"seed {seed}: left billing: {emu.billing()}"
    assert outcomes["up"] and outcomes["failed"], outcomes


def test_own_code_on_two_vast_instances_on_one_overlay_and_down_ends_all(capsys, vast_cluster_emulator, tmp_path,
                                                                         monkeypatch):
    import json
    import sys
    from pathlib import Path

    from gpucli.runs import records as runs
    from tests.e2e.lifecycle.test_nodes import OWN_RUN, nothing_running, own_script, step_of
    from tests.support.cli import cli, wait_for

    emu = vast_cluster_emulator
    # The pods' processes share this machine's network: the overlay's interface is its loopback here
    # (eth0 on vast, the default), so gloo and the rendezvous really run over it.
    emu.overlay_ifname = "lo"
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    code_dir = own_script(tmp_path / "mine")
    code, out, err = cli(capsys, "launch", "--provider", "vast", "--profile", "h100", "--nodes", "2",
                         "--name", "vc2", "--code", str(code_dir), "--python", sys.executable, "--nccl-ifname", "lo",
                         "--workdir", str(tmp_path / "pod" / "vc2"),
                         "--run", f"PATH={Path(sys.executable).parent}:$PATH {OWN_RUN}")
    assert code == 0, err
    record = runs.load("vc2")
    (overlay,) = emu.overlays.values()
    assert record.launch["overlay_id"] == str(overlay.overlay_id) and overlay.cluster_id == 501
    assert [record.instance_id, record.nodes[0].instance_id] == overlay.members  # rank 0 joined first
    # the price (caps, budget, cost) is what the two machines bill together
    billed = {o["id"]: o["dph_total"] for o in CLUSTER_OFFERS}
    assert record.limits.price_per_hour_usd == pytest.approx(emu.pods[record.instance_id].price_per_hour
                                                             + emu.pods[record.nodes[0].instance_id].price_per_hour, rel=0.05)
    assert record.limits.price_per_hour_usd > billed[3001] and record.nodes[0].ssh.port != record.ssh.port
    wait_for(lambda: step_of(capsys, "vc2") >= 3, 180, "steps on the overlay")
    env0 = (Path(record.workdir) / "env").read_text()
    env1 = (Path(record.nodes[0].workdir) / "env").read_text()
    master = f"127.0.{overlay.overlay_id % 250}.1"  # rank 0's overlay address, read over SSH
    for rank, env in enumerate((env0, env1)):
        assert f"GPUCLI_NODE_RANK={rank}" in env and f"GPUCLI_MASTER_ADDR={master}" in env
        assert "NCCL_SOCKET_IFNAME=lo" in env and "GLOO_SOCKET_IFNAME=lo" in env and "GPUCLI_NODES=2" in env
    assert "ranks 0 2 0 2" in (Path(record.workdir) / "console.log").read_text()  # one all-reduce, both nodes
    assert "ranks 1 2 1 2" in (Path(record.nodes[0].workdir) / "console.log").read_text()
    code, out, err = cli(capsys, "status", "vc2", "--json")
    assert [n["state"] for n in json.loads(out)["nodes"]] == ["running", "running"]
    live = emu.billing()
    code, out, err = cli(capsys, "down", "--strays", "--yes")  # a live run's instances and overlay are its own
    assert code == 0, err + out
    assert emu.billing() == live == {record.instance_id, record.nodes[0].instance_id, f"overlay-{overlay.overlay_id}"}
    code, out, err = cli(capsys, "down", "vc2")
    assert code == 0, err
    assert not emu.billing() and not emu.overlays
    wait_for(lambda: nothing_running(record), 60, "the run's processes to end")
    # an overlay no run owns, with a gpucli instance on it, is found and ended by down --strays
    emu.behaviours.extend([PodBehaviour(pending_polls=0), PodBehaviour(pending_polls=0)])
    rent(VastProvider(), "orphan", offers_of(emu, 501))
    code, out, err = cli(capsys, "down", "--strays", "--yes")
    assert code == 0, err + out
    assert not emu.billing(), emu.billing()


def test_more_nodes_than_any_cluster_has_is_one_line_and_rents_nothing(capsys, vast_cluster_emulator):
    from gpucli.runs import records as runs
    from tests.support.cli import cli

    code, out, err = cli(capsys, "launch", "--provider", "vast", "--profile", "h100", "--nodes", "3",
                         "--name", "vc3", "--run", "true")
    assert code != 0 and "no vast.ai cluster has 3 machines" in err and "Traceback" not in err + out
    assert len([line for line in err.splitlines() if line.strip()]) <= 2, err
    assert not vast_cluster_emulator.ledger.created() and not vast_cluster_emulator.overlays
    assert not list(runs.runs_dir().glob("*.json"))  # nothing recorded either


def test_watch_ends_every_instance_and_the_overlay_of_a_run_that_is_over(vast_cluster_emulator):
    """The node-lost path: the watchdogs end the run on every node; `watch` then ends its billing."""
    from gpucli.plan.catalog import load_catalog
    from gpucli.run.life import lifecycle
    from gpucli.runs import records as runs

    emu = vast_cluster_emulator
    overlay_id, nodes = rent(VastProvider(), "over", offers_of(emu, 501))
    record = runs.RunRecord(name="over", provider="vast", created_at=runs.now_iso(), profile="h100", phase="fast",
                            model="124m", n_gpus=1, gpu="h100-sxm", workdir="w", status="failed",
                            instance_id=nodes[0].instance_id,
                            launch={"request": {"profile": "h100"}, "overlay_id": overlay_id, "overlay_name": "gpucli-over"},
                            nodes=(runs.NodeRecord(rank=1, workdir="w-node1", instance_id=nodes[1].instance_id),))
    runs.save(record)
    notices = []
    assert lifecycle.watch("over", load_catalog(), mirror=False, recover=False, on_notice=notices.append) == "ended"
    assert not emu.billing() and not emu.overlays
    assert any(f"vast.ai overlay {overlay_id}" in n.text for n in notices)


def test_a_lost_node_0_ends_every_instance_and_the_overlay(capsys, vast_cluster_emulator, tmp_path, monkeypatch):
    """Node 0's machine goes away mid-run: `watch` ends the other node's instance and the overlay."""
    import sys
    from pathlib import Path

    from gpucli.plan.catalog import load_catalog
    from gpucli.run.life import lifecycle
    from gpucli.runs import records as runs
    from tests.e2e.lifecycle.test_nodes import OWN_RUN, nothing_running, own_script, step_of
    from tests.support.cli import cli, wait_for

    emu = vast_cluster_emulator
    emu.overlay_ifname = "lo"
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    monkeypatch.setenv("GPUCLI_WATCH_POLL_S", "0.2")
    code, out, err = cli(capsys, "launch", "--provider", "vast", "--profile", "h100", "--nodes", "2",
                         "--name", "vl2", "--code", str(own_script(tmp_path / "mine")), "--python", sys.executable,
                         "--nccl-ifname", "lo", "--workdir", str(tmp_path / "pod" / "vl2"),
                         "--run", f"PATH={Path(sys.executable).parent}:$PATH {OWN_RUN}")
    assert code == 0, err
    record = runs.load("vl2")
    wait_for(lambda: step_of(capsys, "vl2") >= 2, 180, "steps on the overlay")
    emu.end_pod(record.instance_id, "terminated", "host lost")  # node 0's machine is gone
    notices = []
    assert lifecycle.watch("vl2", load_catalog(), mirror=False, recover=False, on_notice=notices.append) == "ended"
    assert not emu.billing() and not emu.overlays, emu.billing()
    wait_for(lambda: nothing_running(record), 60, "node 1's processes to end")


def test_each_instance_ends_itself_when_the_run_is_over_with_nothing_running_here(capsys, vast_cluster_emulator,
                                                                                 tmp_path, monkeypatch):
    """An instance on an overlay is a vast instance like any other: with this machine's side gone (the
    launch's watcher killed, no gpucli command run), each node's watchdog ends its own instance when the
    run is over; only the overlay is left for this machine to delete."""
    import re
    import signal
    import sys
    from pathlib import Path

    from gpucli.runs import records as runs
    from tests.e2e.lifecycle.test_nodes import OWN_RUN, own_script
    from tests.support.cli import cli, wait_for

    emu = vast_cluster_emulator
    emu.overlay_ifname = "lo"
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    code, out, err = cli(capsys, "launch", "--provider", "vast", "--profile", "h100", "--nodes", "2",
                         "--name", "vself", "--code", str(own_script(tmp_path / "mine")), "--python", sys.executable,
                         "--nccl-ifname", "lo", "--workdir", str(tmp_path / "pod" / "vself"), "--on-end", "terminate",
                         "--run", f"STEPS=8 PATH={Path(sys.executable).parent}:$PATH {OWN_RUN}")
    assert code == 0, err
    said = out + err
    m = re.search(r"a watcher here \(pid (\d+),", said)
    assert m and "each instance's watchdog ends its own instance" in said, said
    os.kill(int(m.group(1)), signal.SIGKILL)  # this machine's side is gone
    record = runs.load("vself")
    (overlay,) = emu.overlays.values()
    overlay_left = {f"overlay-{overlay.overlay_id}"}
    wait_for(lambda: emu.billing() == overlay_left, 240, "both instances to end themselves")
    assert record.instance_id not in emu.billing() and record.nodes[0].instance_id not in emu.billing()
    code, out, err = cli(capsys, "down", "vself")
    assert code == 0, err
    assert not emu.billing() and not emu.overlays, emu.billing()
