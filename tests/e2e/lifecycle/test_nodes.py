"""One run over several machines, end to end: ``--provider local --nodes 2`` (two node agents on this
machine, rendezvous on loopback) and ``--provider ssh`` with two real sshd hosts. The trainer and the
watchdogs are the real ones; the losses of 2 nodes x 1 process against 1 node x 2 are compared bit for
bit in tests/trainer/test_multinode.py."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from tests.support.cli import FAST_TRAINER, cli, wait_for

FAST = ["--set", "data.max_bytes=300000", *FAST_TRAINER]


@pytest.fixture(autouse=True)
def quick_watchdogs(monkeypatch):
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    monkeypatch.setenv("GPUCLI_WATCHDOG_GRACE_S", "20")
    yield
    for record in runs.list_runs():  # a failed test leaves nothing running
        for g in run_groups(record):
            if group(g):
                os.killpg(g, signal.SIGKILL)


def group(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry))
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def run_groups(record: runs.RunRecord) -> list[int]:
    """Every trainer and watchdog process group of every node of the run."""
    ids = [record.pid, record.watchdog_pid] + [p for n in record.nodes for p in (n.pid, n.watchdog_pid)]
    return [i for i in ids if i]


def nothing_running(record: runs.RunRecord) -> bool:
    return not any(group(g) for g in run_groups(record))


def step_of(capsys, name: str) -> int:
    code, out, _ = cli(capsys, "status", name, "--json")
    return (json.loads(out).get("step") or 0) if code == 0 else 0


def test_local_two_nodes_train_and_a_killed_node_ends_every_node(capsys):
    code, out, err = cli(capsys, "launch", "--provider", "local", "--profile", "cpu", "--nodes", "2", "--name", "two",
                         "--stall-minutes", "1", *FAST)
    assert code == 0, err
    record = runs.load("two")
    assert len(record.nodes) == 1 and record.nodes[0].pid and record.nodes[0].watchdog_pid
    node1 = Path(record.nodes[0].workdir)
    assert node1 == Path(record.workdir + "-node1")
    env1 = (node1 / "env").read_text()
    assert "GPUCLI_NODE_RANK=1" in env1 and "GPUCLI_NODES=2" in env1 and "DSTACK_NODE_RANK=1" in env1
    assert (node1 / "env").stat().st_mode & 0o777 == 0o600
    wait_for(lambda: step_of(capsys, "two") >= 5, 240, "step 5 on two nodes")

    # Only rank 0 writes the run's files; node 1 got the prepared data from node 0.
    assert (Path(record.workdir) / "metrics.jsonl").exists() and not (node1 / "metrics.jsonl").exists()
    assert (node1 / "data" / "prepared" / "meta.json").exists()
    started = [json.loads(line) for line in (Path(record.workdir) / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("event") == "started" and r["world_size"] == 2 for r in started)
    code, out, _ = cli(capsys, "status", "two", "--json")
    nodes = json.loads(out)["nodes"]
    assert [n["rank"] for n in nodes] == [0, 1] and all(n["state"] == "running" for n in nodes)
    assert all(n["heartbeat_age_s"] is not None and n["heartbeat_age_s"] < 30 for n in nodes)

    # kill -9 of node 1's torchrun agent: every node of the run ends, nothing is left running.
    agent = next(p for p in group(record.nodes[0].pid) if "torch.distributed.run" in cmdline(p))
    os.kill(agent, signal.SIGKILL)
    wait_for(lambda: nothing_running(record), 120, "every node of the run to end")
    verdicts = {}
    for folder in (Path(record.workdir), node1):
        verdicts[folder.name] = json.loads((folder / "watchdog.json").read_text())["verdict"]
    assert "torchrun agent is gone" in verdicts[node1.name], verdicts
    # Node 1's orphaned worker got SIGTERM: every rank agreed to stop on one step (an emergency checkpoint),
    # or rank 0 saw its peer go (its collectives fail, or its watchdog ends it).
    rank0 = verdicts[Path(record.workdir).name]
    assert rank0 in ("crashed", "finished (signal)") or "node 1" in rank0, verdicts


def own_script(folder: Path) -> Path:
    """A user's own multi-node script: torchrun from the GPUCLI_* variables, a gloo all-reduce a step."""
    folder.mkdir()
    (folder / "train.py").write_text(textwrap.dedent("""
        import os, time
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        r, w = dist.get_rank(), dist.get_world_size()
        print("ranks", r, w, os.environ["GPUCLI_NODE_RANK"], os.environ["SKYPILOT_NUM_NODES"], flush=True)
        for step in range(1, 100000):
            t = torch.tensor([float(r + 1)])
            dist.all_reduce(t)
            print(f"iter {step}: loss {1.0 / step + t.item():.4f}, time 1.0ms", flush=True)
            if step >= int(os.environ.get("STEPS", "100000")):
                break
            time.sleep(0.2)
        dist.barrier()  # every rank done before any tears gloo down
        dist.destroy_process_group()
        """))
    return folder


OWN_RUN = ("torchrun --nnodes=$GPUCLI_NODES --node-rank=$GPUCLI_NODE_RANK --nproc-per-node=1 "
           "--master-addr=$GPUCLI_MASTER_ADDR --master-port=$GPUCLI_MASTER_PORT train.py")


def test_own_code_on_two_local_nodes_and_down_ends_every_node(capsys, tmp_path):
    code_dir = own_script(tmp_path / "mine")
    code, out, err = cli(capsys, "launch", "--provider", "local", "--nodes", "2", "--name", "own2",
                         "--code", str(code_dir), "--run", f"PATH={Path(sys.executable).parent}:$PATH {OWN_RUN}")
    assert code == 0, err
    record = runs.load("own2")
    wait_for(lambda: step_of(capsys, "own2") >= 3, 180, "the own script's steps")
    log0 = (Path(record.workdir) / "console.log").read_text()
    assert "ranks 0 2 0 2" in log0  # the all-reduce spans both nodes: 1 + 2
    assert "loss 3." in log0 or "loss 4." in log0
    assert "ranks 1 2 1 2" in (Path(record.nodes[0].workdir) / "console.log").read_text()
    code, out, err = cli(capsys, "down", "own2")
    assert code == 0, err
    wait_for(lambda: nothing_running(record), 90, "every node to stop")
    assert runs.load("own2").status == "stopped"


def test_ssh_two_hosts_train_the_bundled_model(capsys, tmp_path, client_key, tmp_path_factory):
    from tests.support.sshd import SshServer

    servers = [SshServer.start(tmp_path_factory.mktemp(f"sshd{i}"), authorized_keys=[client_key[1]]) for i in (0, 1)]
    try:
        hosts = tmp_path / "hosts"
        hosts.write_text("".join(f"{s.user}@127.0.0.1:{s.port}  # node {i}\n" for i, s in enumerate(servers)))
        code, out, err = cli(capsys, "launch", "--provider", "ssh", "--hosts-file", str(hosts), "--profile", "cpu",
                             "--identity", str(client_key[0]), "--python", sys.executable, "--name", "ssh2",
                             "--workdir", str(tmp_path / "pod" / "run"), *FAST[:-2], "--steps", "10")
        assert code == 0, err
        record = runs.load("ssh2")
        assert record.ssh.port == servers[0].port and record.nodes[0].ssh.port == servers[1].port
        assert record.ssh.host_key and record.nodes[0].ssh.host_key and record.ssh.host_key != record.nodes[0].ssh.host_key

        def done():
            code, out, _ = cli(capsys, "status", "ssh2", "--json")
            return code == 0 and json.loads(out).get("state") == "finished"

        wait_for(done, 300, "the run to finish on both hosts")
        wait_for(lambda: nothing_running(record), 90, "both hosts to be idle")
        root = Path(record.workdir)
        last = root / "checkpoints" / "step_000010"
        meta = json.loads((last / "meta.json").read_text())
        assert meta["format"] == "dcp" and set(meta["nodes"]) == {"0", "1"} and meta["consolidated"]
        other = Path(record.nodes[0].workdir) / "checkpoints" / "step_000010"
        assert (other / "rank1.pt").exists() and not (other / "model.pt").exists()
        dest = tmp_path / "best"
        code, out, err = cli(capsys, "fetch-best", "ssh2", "--dest", str(dest), "--json")
        assert code == 0, err
    finally:
        for s in servers:
            s.stop()


@pytest.mark.parametrize("args,needle", [
    (["--provider", "local", "--nodes", "0"], "--nodes must be a whole number of at least 1"),
    (["--provider", "vast", "--profile", "h100", "--nodes", "2", "--spot"], "rented on demand"),
    (["--provider", "runpod", "--profile", "h100", "--nodes", "2", "--spot"], "rented on demand"),
    (["--provider", "runpod", "--profile", "h100", "--nodes", "251"], "2 to 250"),
    (["--provider", "ssh", "--host", "u@a:2222", "--host", "u@a:2222"], "is the same machine as"),
    (["--provider", "ssh", "--host", "u@a", "--host", "u@b", "--nodes", "3"], "--nodes 3 needs 3 hosts"),
    (["--provider", "local", "--nodes", "9"], "at most 8 node agents"),
])
def test_bad_node_requests_are_one_line(capsys, args, needle):
    argv = ["launch", *args] if "--profile" in args else ["launch", "--profile", "cpu", *args]
    code, out, err = cli(capsys, *argv)
    assert code != 0 and needle in err and "Traceback" not in err
    assert not list(runs.runs_dir().glob("*.json"))  # nothing recorded, so nothing rented or started


def test_missing_interface_or_gpus_start_nothing(capsys, tmp_path, client_key, tmp_path_factory):
    from tests.support.sshd import SshServer

    servers = [SshServer.start(tmp_path_factory.mktemp(f"sshd{i}"), authorized_keys=[client_key[1]]) for i in (0, 1)]
    try:
        base = ["launch", "--provider", "ssh", "--identity", str(client_key[0]), "--python", sys.executable,
                *[a for s in servers for a in ("--host", f"{s.user}@127.0.0.1:{s.port}")]]
        code, _, err = cli(capsys, *base, "--profile", "cpu", "--name", "noif", "--nccl-ifname", "nosuch0")
        assert code != 0 and "has no network interface nosuch0" in err
        code, _, err = cli(capsys, *base, "--profile", "h100", "--name", "nogpu")
        assert code != 0 and "need 1 GPUs each" in err
        for name in ("noif", "nogpu"):
            rec = runs.load(name)
            assert rec.status == "failed" and rec.pid is None and all(n.pid is None for n in rec.nodes)
    finally:
        for s in servers:
            s.stop()


def test_down_writes_a_sharded_checkpoint_on_every_node_and_resume_continues_there(capsys):
    code, out, err = cli(capsys, "launch", "--provider", "local", "--profile", "cpu", "--nodes", "2",
                         "--name", "again", *FAST)
    assert code == 0, err
    record = runs.load("again")
    wait_for(lambda: step_of(capsys, "again") >= 6, 240, "step 6 on two nodes")
    code, out, err = cli(capsys, "down", "again")
    assert code == 0, err
    wait_for(lambda: nothing_running(record), 90, "every node to stop")
    rows = [json.loads(line) for line in (Path(record.workdir) / "metrics.jsonl").read_text().splitlines()]
    stop = [r for r in rows if r.get("event") == "finished"][-1]
    assert stop["reason"] == "signal"
    name = f"step_{stop['step']:06d}"
    for folder in (Path(record.workdir), Path(record.nodes[0].workdir)):
        meta = json.loads((folder / "checkpoints" / name / "meta.json").read_text())
        assert meta["format"] == "dcp" and meta["kind"] in ("emergency", "regular")

    code, out, err = cli(capsys, "resume", "again")
    assert code == 0, err
    again = runs.load("again")
    assert again.status == "running" and again.nodes[0].pid and again.nodes[0].workdir == record.nodes[0].workdir

    def resumed():
        text = (Path(record.workdir) / "metrics.jsonl").read_text()
        rows = [json.loads(line) for line in text.splitlines()]
        back = [r for r in rows if r.get("event") == "resumed"]
        return back and any(r.get("kind") == "train" and r["step"] > stop["step"] for r in rows) and back
    back = wait_for(resumed, 240, "training past the checkpoint after the resume")
    assert back[-1]["step"] == stop["step"]
    code, out, err = cli(capsys, "down", "again")
    assert code == 0, err
    wait_for(lambda: nothing_running(runs.load("again")), 90, "every node to stop")

    # On one node now: node 1's shards are brought to node 0 and the trainer reshards.
    rows = [json.loads(line) for line in (Path(record.workdir) / "metrics.jsonl").read_text().splitlines()]
    stop = [r for r in rows if r.get("event") == "finished"][-1]
    code, out, err = cli(capsys, "resume", "again", "--nodes", "1")
    assert code == 0, err
    solo = runs.load("again")
    assert solo.nodes == () and solo.status == "running"
    shard = Path(record.workdir) / "checkpoints" / f"step_{stop['step']:06d}" / "dcp" / "__1_0.distcp"
    assert shard.exists()

    def resumed_alone():
        rows = [json.loads(line) for line in (Path(record.workdir) / "metrics.jsonl").read_text().splitlines()]
        back = [r for r in rows if r.get("event") == "resumed"]
        starts = [r for r in rows if r.get("event") == "started"]
        return len(back) >= 2 and starts[-1]["world_size"] == 1 and \
            any(r.get("kind") == "train" and r["step"] > stop["step"] for r in rows) and back
    back = wait_for(resumed_alone, 240, "training on one node after the resume")
    assert back[-1]["step"] == stop["step"]
    code, out, err = cli(capsys, "down", "again")
    assert code == 0, err
    wait_for(lambda: nothing_running(runs.load("again")), 90, "the node to stop")
