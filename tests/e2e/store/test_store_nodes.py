"""A run over two machines with a checkpoint store, end to end: ``--provider ssh`` with two real sshd hosts
on loopback, the real trainer writing sharded checkpoints on both, each node's uploader sending its part
to a real S3 server (moto). Node 1's uploader killed mid-run: the checkpoints after it are not whole in
the store; ``resume --provider local --nodes 1`` takes the newest whole one (every node's part) and the
trainer reshards it onto one machine."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from gpucli.runs import records as runs
from tests.e2e.lifecycle.test_nodes import nothing_running
from tests.e2e.store.test_store_runs import TINY, cmdlines, stored
from tests.support.cli import cli, rows_of, wait_for
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, s3_server  # noqa: F401


def test_every_node_sends_its_part_and_a_resume_takes_the_newest_whole(capsys, tmp_path, monkeypatch, client_key,
                                                                       tmp_path_factory, s3_server):  # noqa: F811
    from tests.support.sshd import SshServer

    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    monkeypatch.setenv("GPUCLI_STORE_POLL_S", "1")
    monkeypatch.setenv("GPUCLI_STORE_FLUSH_S", "15")
    servers = [SshServer.start(tmp_path_factory.mktemp(f"sshd{i}"), authorized_keys=[client_key[1]]) for i in (0, 1)]
    name = "shards"
    try:
        hosts = tmp_path / "hosts"
        hosts.write_text("".join(f"{s.user}@127.0.0.1:{s.port}\n" for s in servers))
        code, out, err = cli(capsys, "launch", "--provider", "ssh", "--hosts-file", str(hosts), "--profile", "cpu",
                             "--identity", str(client_key[0]), "--python", sys.executable, "--name", name,
                             "--workdir", str(tmp_path / "pod" / "run"), "--store", "s3://runs/e2e", "--steps", "400",
                             *TINY)
        assert code == 0, err
        assert "node 1's part of each" in err + out
        record = runs.load(name)
        node1 = Path(record.nodes[0].workdir)
        wait_for(lambda: len([c for c in stored(name).values() if c.kind == "regular"]) >= 2, 300,
                 "two whole sharded checkpoints in the store")
        first = max((c for c in stored(name).values() if c.kind == "regular"), key=lambda c: c.step or 0)
        assert any(n.startswith("dcp/__1_") for n in first.files) and "rank1.pt" in first.files  # node 1's part
        assert any(n.startswith("dcp/__0_") for n in first.files) and "dcp/.metadata" in first.files

        # node 1's uploader dies; the trainer goes on writing checkpoints on both nodes
        state = json.loads((node1 / "storesync.json").read_text())
        os.killpg(state["pgid"], signal.SIGKILL)
        whole_then = max(c.step or 0 for c in stored(name).values() if c.kind == "regular")
        wait_for(lambda: "waiting for the part of node 1" in (Path(record.workdir) / "storesync.log").read_text(),
                 240, "node 0 to wait for node 1's part of a newer checkpoint")
        assert SECRET_KEY not in cmdlines() and ACCESS_KEY not in cmdlines()
        code, out, err = cli(capsys, "down", name)
        assert code == 0, err
        wait_for(lambda: nothing_running(record), 120, "both nodes to stop")

        # the store: nothing past the kill is whole (node 0's files of them may be there, no manifest)
        newest_local = max(int(p.name[5:]) for p in (Path(record.workdir) / "checkpoints").glob("step_*"))
        cks = stored(name)
        newest = max((c for c in cks.values() if c.kind == "regular"), key=lambda c: c.step or 0)
        assert newest.step is not None and whole_then <= newest.step < newest_local
        assert f"step_{newest_local:06d}" not in cks
        for folder in (Path(record.workdir), node1):
            assert (folder / "env").stat().st_mode & 0o777 == 0o600 and SECRET_KEY in (folder / "env").read_text()
            texts = [p.read_text(errors="replace") for p in folder.iterdir() if p.is_file() and p.name != "env"]
            assert not [t for t in texts if SECRET_KEY in t or ACCESS_KEY in t]
    finally:
        for s in servers:
            s.stop()

    # both machines gone: the run continues on this one from the store's newest whole checkpoint
    code, out, err = cli(capsys, "resume", name, "--provider", "local", "--nodes", "1")
    assert code == 0, err[-3000:]
    assert f"taking {newest.name} (step {newest.step}) from the checkpoint store" in err
    moved = runs.load(name)
    assert moved.provider == "local" and moved.nodes == ()

    def resumed():
        rows = rows_of(capsys, name)
        back = [r for r in rows if r.get("event") == "resumed"]
        starts = [r for r in rows if r.get("event") == "started"]
        return back if back and starts[-1]["world_size"] == 1 and \
            any(r.get("kind") == "train" and r["step"] > back[-1]["step"] for r in rows) else None

    back = wait_for(resumed, 240, "training on one machine from the store's checkpoint")
    assert back[-1]["step"] == newest.step
    code, out, err = cli(capsys, "down", name)
    assert code == 0, err
    wait_for(lambda: nothing_running(runs.load(name)), 120, "the run to stop")
