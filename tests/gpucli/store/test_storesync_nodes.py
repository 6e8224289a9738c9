"""A run over several nodes with a store: one uploader per node (gpucli/store/storesync.py, real processes)
against a real S3 server on loopback. Each node sends its files of every sharded checkpoint; node 0's
manifest, written last, makes a checkpoint whole only once every node's part is there: a node whose
uploader died leaves the checkpoints it did not send without a manifest, and the newest whole one is
what a resume from the store takes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpucli.run.files.store import download
from gpucli.store import objstore
from tests.gpucli.store.test_storesync import STORESYNC, store_names, wait_for
from tests.support.s3server import s3_server  # noqa: F401

URL = "s3://runs/multi"


def write_sharded(nodes: list[Path], step: int) -> None:
    """A sharded checkpoint as trainer/loop/sharded.py leaves it on two nodes: each node's folder holds its
    ranks' files; each meta.json lists the node's own files and, under ``nodes``, every node's."""
    mine: dict[str, dict[str, str]] = {}
    for rank, root in enumerate(nodes):
        tmp = root / f".tmp_step_{step:06d}"
        (tmp / "dcp").mkdir(parents=True)
        names = ([f"dcp/__{rank}_0.distcp", f"rank{rank}.pt"] + (["dcp/.metadata", "model.pt"] if rank == 0 else []))
        mine[str(rank)] = {}
        for name in names:
            data = os.urandom(3000 + step + rank)
            (tmp / name).write_bytes(data)
            mine[str(rank)][name] = hashlib.sha256(data).hexdigest()
    for rank, root in enumerate(nodes):
        tmp = root / f".tmp_step_{step:06d}"
        meta = {"step": step, "train_loss": 3.0 - step / 100, "val_loss": None, "format": "dcp", "world_size": 2,
                "nodes": mine, "files": mine[str(rank)], "sha256": mine["0"]["model.pt"]}
        (tmp / "meta.json").write_text(json.dumps(meta))
        tmp.rename(root / f"step_{step:06d}")


def start(run_dir: Path, rank: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(STORESYNC), "--run-dir", str(run_dir), "--run", "r2", "--store", URL,
                             "--keep-last", "3", "--poll-s", "0.3", "--node-rank", str(rank), "--flush-s", "3"],
                            env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def test_every_nodes_part_makes_a_checkpoint_whole_and_a_dead_uploader_leaves_it_not_whole(tmp_path, s3_server):  # noqa: F811
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    roots = [d / "checkpoints" for d in dirs]
    for r in roots:
        r.mkdir(parents=True)
    write_sharded(roots, 10)
    procs = [start(d, rank) for rank, d in enumerate(dirs)]
    try:
        wait_for(lambda: "step_000010" in store_names(URL, "r2"), what="the first sharded checkpoint whole")
        got = store_names(URL, "r2")["step_000010"]
        meta0 = json.loads((roots[0] / "step_000010" / "meta.json").read_text())
        # every node's files, one folder: what a resume on one node reads (the trainer reshards)
        assert {n: sha for n, (sha, _) in got.files.items() if n != "meta.json"} == {**meta0["nodes"]["0"],
                                                                                       **meta0["nodes"]["1"]}
        write_sharded(roots, 20)
        wait_for(lambda: "step_000020" in store_names(URL, "r2"), what="the second")

        # node 1's uploader dies: from now on no checkpoint is whole, though node 0 sends its own files
        os.killpg(procs[1].pid, signal.SIGKILL)
        procs[1].wait(timeout=30)
        write_sharded(roots, 30)
        wait_for(lambda: "multi/r2/checkpoints/step_000030/model.pt" in s3_server.keys(), what="node 0's part of 30")
        wait_for(lambda: "waiting for the part of node 1" in (dirs[0] / "storesync.log").read_text(), what="the wait")
        assert "step_000030" not in store_names(URL, "r2")
        assert not [k for k in s3_server.keys() if "step_000030/" in k and ("manifest" in k or "part-node1" in k)]

        # the job is over: node 0 gives up on what node 1 never sent, and says so
        (dirs[0] / "storesync.flush").write_text("now\n")
        assert procs[0].wait(timeout=60) == 1
        state = json.loads((dirs[0] / "storesync.json").read_text())
        assert state["state"] == "flushed" and state["left"] == ["step_000030"]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)

    # the newest whole checkpoint is the one before the uploader died, and it comes back whole
    whole = objstore.whole_checkpoints(objstore.open_store(URL), objstore.parse_url(URL), "r2")
    newest = objstore.newest_resumable(whole)
    assert [c.name for c in whole] == ["step_000010", "step_000020"] and newest.name == "step_000020"
    pulled = download(objstore.open_store(URL), newest, tmp_path / "back" / newest.name)
    for rank, root in enumerate(roots):
        for name in json.loads((root / "step_000020" / "meta.json").read_text())["files"]:
            assert (pulled.dest / name).read_bytes() == (root / "step_000020" / name).read_bytes(), (rank, name)
    assert json.loads((pulled.dest / "meta.json").read_text())["files"] == meta0_files(roots[0])


def meta0_files(root: Path) -> dict[str, str]:
    return json.loads((root / "step_000020" / "meta.json").read_text())["files"]
