"""``gpucli launch --on RUN`` for a run that had several machines: the next job runs on every node of it
(two real sshd hosts on loopback), ranks as before, each node's folder beside the base run's there, node 0
seeded as one machine is; nothing rented, the machines counted once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpucli.runs import records as runs
from gpucli.runs.machines import machine_root
from tests.e2e.lifecycle.test_nodes import nothing_running
from tests.support.cli import FAST_TRAINER, cli, wait_for

FAST = ["--set", "data.max_bytes=200000", *FAST_TRAINER[:-2]]


def test_launch_on_a_two_node_run_runs_on_both_nodes(capsys, tmp_path, client_key, tmp_path_factory):
    from tests.support.sshd import SshServer

    servers = [SshServer.start(tmp_path_factory.mktemp(f"sshd{i}"), authorized_keys=[client_key[1]]) for i in (0, 1)]
    try:
        hosts = tmp_path / "hosts"
        hosts.write_text("".join(f"{s.user}@127.0.0.1:{s.port}\n" for s in servers))
        code, out, err = cli(capsys, "launch", "--provider", "ssh", "--hosts-file", str(hosts), "--profile", "cpu",
                             "--identity", str(client_key[0]), "--python", sys.executable, "--name", "pair",
                             "--workdir", str(tmp_path / "m" / "pair"), *FAST, "--steps", "5")
        assert code == 0, err
        base = runs.load("pair")

        def over(name: str) -> bool:
            code, out, _ = cli(capsys, "status", name, "--json")
            return code == 0 and json.loads(out).get("state") == "finished" and nothing_running(runs.load(name))

        wait_for(lambda: over("pair"), 300, "the first run on both hosts")

        code, out, err = cli(capsys, "launch", "--on", "pair", "--name", "again", *FAST, "--steps", "6")
        assert code == 0, err
        assert "code: copied pair's" in out + err and "node 1: code copied from pair's folder there" in out + err
        again = runs.load("again")
        assert len(again.nodes) == 1 and again.provider == "ssh"
        assert again.ssh.port == servers[0].port and again.nodes[0].ssh.port == servers[1].port
        assert Path(again.workdir).parent == Path(base.workdir).parent
        assert again.nodes[0].workdir == again.workdir + "-node1"
        assert machine_root(again) == "pair" and (again.launch or {})["on"]["after"] == "pair"

        wait_for(lambda: over("again"), 300, "the second run on both hosts")
        rows = [json.loads(x) for x in (Path(again.workdir) / "metrics.jsonl").read_text().splitlines()]
        assert any(r.get("event") == "started" and r["world_size"] == 2 for r in rows)
        meta = json.loads((Path(again.workdir) / "checkpoints" / "step_000006" / "meta.json").read_text())
        assert set(meta["nodes"]) == {"0", "1"}
        assert (Path(again.nodes[0].workdir) / "checkpoints" / "step_000006" / "rank1.pt").exists()

        code, out, err = cli(capsys, "launch", "--on", "pair", "--name", "three", "--nodes", "3", *FAST)
        assert code != 0 and "another --nodes" in err and "Traceback" not in err
    finally:
        for s in servers:
            s.stop()
