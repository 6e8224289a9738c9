"""The bundled trainer over two nodes, each its own run folder (no shared disk), as gpucli starts it:
``torchrun --nnodes 2 --node-rank r --rdzv-backend c10d`` with GPUCLI_NODES/GPUCLI_NODE_RANK, on
gloo over loopback. Two nodes x one process must train exactly as one node x two processes."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from tests.trainer.conftest import REPO, read_rows, run_trainer, tiny_args, train_losses, trainer_env

STEPS = {"training.max_steps": 6, "training.val_interval": 3, "training.checkpoint_interval": 3}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_nodes(roots: list[Path], data0: Path, rdzv_id: str) -> None:
    """Node 0 has the prepared data; node 1 has none (it gets node 0's over the process group)."""
    port = free_port()
    procs = []
    for rank, root in enumerate(roots):
        root.mkdir(parents=True, exist_ok=True)
        data = data0 if rank == 0 else root / "data"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={rank}",
               "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               f"--rdzv-id={rdzv_id}", "--max-restarts=0", "-m", "trainer.train",
               *tiny_args(data, root, **STEPS), "--resume=auto"]
        env = trainer_env(GPUCLI_NODES="2", GPUCLI_NODE_RANK=str(rank))
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]


def test_two_nodes_match_one_node_and_resume_on_either(data_dir, tmp_path):
    data0 = tmp_path / "n0-data"
    shutil.copytree(data_dir, data0)
    nodes = [tmp_path / "a" / "n0", tmp_path / "a" / "n1"]
    run_two_nodes(nodes, data0, "a")
    two = train_losses(nodes[0])
    assert sorted(two) == list(range(1, 7))
    # Only rank 0 (on node 0, whatever order the c10d rendezvous gave the nodes) writes the run's files.
    assert not (nodes[1] / "metrics.jsonl").exists() and not (nodes[1] / "status.json").exists()
    assert json.loads((nodes[0] / "status.json").read_text())["reason"] == "max_steps"
    # Node 1 got node 0's prepared data over the group, byte for byte.
    assert (nodes[1] / "data" / "meta.json").read_bytes() == (data0 / "meta.json").read_bytes()

    # Sharded: each node holds its own rank's part; only node 0 the DCP metadata and model.pt.
    c0, c1 = (n / "checkpoints" / "step_000003" for n in nodes)
    assert (c0 / "dcp" / ".metadata").exists() and not (c1 / "dcp" / ".metadata").exists()
    assert {p.name for p in (c1 / "dcp").iterdir()} == {"__1_0.distcp"}
    assert (c0 / "model.pt").exists() and not (c1 / "model.pt").exists()
    meta0, meta1 = (json.loads((c / "meta.json").read_text()) for c in (c0, c1))
    assert meta0["format"] == meta1["format"] == "dcp" and meta0["world_size"] == 2
    assert set(meta0["nodes"]) == {"0", "1"} and "rank1.pt" in meta0["nodes"]["1"]

    # One node x two processes on the same data and global batch: the same losses, bit for bit.
    one = tmp_path / "one"
    r = run_trainer(tiny_args(data0, one, **STEPS), nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert train_losses(one) == two

    # Resume on 2 nodes from step 3: same step, same data order, same losses.
    again = [tmp_path / "b" / "n0", tmp_path / "b" / "n1"]
    for src, dst in zip(nodes, again, strict=True):
        shutil.copytree(src, dst)
        shutil.rmtree(dst / "checkpoints" / "step_000006")
    (again[0] / "metrics.jsonl").unlink()
    run_two_nodes(again, data0, "b")
    resumed = train_losses(again[0])
    assert sorted(resumed) == [4, 5, 6] and all(resumed[s] == two[s] for s in resumed)
    assert any(row.get("event") == "resumed" and row["step"] == 3 for row in read_rows(again[0]))

    # Resume on 1 node from the 2-node checkpoint: the nodes' folders of step 3 put together.
    solo = tmp_path / "solo"
    (solo / "checkpoints").mkdir(parents=True)
    shutil.copytree(c0, solo / "checkpoints" / c0.name)
    shutil.copytree(c1, solo / "checkpoints" / c0.name, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("meta.json"))
    r = run_trainer([*tiny_args(data0, solo, **STEPS), "--resume=auto"], nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    alone = train_losses(solo)
    assert sorted(alone) == [4, 5, 6] and all(alone[s] == two[s] for s in alone)
