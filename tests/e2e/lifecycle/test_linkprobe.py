"""The nodes' link measured at launch (``--provider ssh --nodes 2`` without ``--link-gbps``) over two
real sshd hosts: the probe runs rank 0's listener and node 1's sender (gpucli/pod/linkprobe.py), the
figure is positive, shown and kept in the record; a port rank 0 cannot use is one warning line (the run
starts with the link unknown), or, with ``--probe-link``, the launch's one-line error with nothing
started."""

from __future__ import annotations

import json
import socket
import sys

import pytest

from gpucli.runs import records as runs
from tests.e2e.lifecycle.test_nodes import nothing_running, quick_watchdogs  # noqa: F401 - the autouse fixture
from tests.support.cli import cli, wait_for


@pytest.fixture
def two_hosts(tmp_path_factory, client_key):
    from tests.support.sshd import SshServer

    servers = [SshServer.start(tmp_path_factory.mktemp(f"sshd{i}"), authorized_keys=[client_key[1]]) for i in (0, 1)]
    yield servers
    for s in servers:
        s.stop()


def launch_args(servers, client_key, tmp_path, name: str) -> list[str]:
    code_dir = tmp_path / "mine"
    code_dir.mkdir(exist_ok=True)
    (code_dir / "job.sh").write_text("sleep 1\n")
    return ["launch", "--provider", "ssh", "--identity", str(client_key[0]), "--python", sys.executable,
            *[a for s in servers for a in ("--host", f"{s.user}@127.0.0.1:{s.port}")],
            "--name", name, "--workdir", str(tmp_path / "pod" / name), "--code", str(code_dir), "--run", "sh job.sh"]


def ended(capsys, name: str) -> None:
    record = runs.load(name)
    if record.active:
        cli(capsys, "down", name)
    wait_for(lambda: nothing_running(runs.load(name)), 90, "every node to stop")


def test_the_link_is_measured_shown_and_recorded(capsys, tmp_path, client_key, two_hosts):
    code, out, err = cli(capsys, *launch_args(two_hosts, client_key, tmp_path, "probed"))
    try:
        assert code == 0, err
        link = runs.load("probed").link
        assert link is not None and link.gbps > 0 and [p.rank for p in link.pairs] == [1]
        assert link.pairs[0].bytes == 64 * 1024 * 1024 and link.pairs[0].gbps == link.gbps
        assert "measured at launch" in link.source
        shown = [line for line in (out + err).splitlines() if "link measured" in line]
        assert len(shown) == 1 and f"node 1 -> rank 0 {link.gbps:g} Gbps" in shown[0]
        code, out, err = cli(capsys, "status", "probed", "--json")
        assert code == 0 and json.loads(out)["link"]["gbps"] == link.gbps
        code, out, err = cli(capsys, "status", "probed")
        assert code == 0 and f"link {link.gbps:g} Gbps measured at launch" in " ".join(out.split())
    finally:
        ended(capsys, "probed")


def test_dry_run_says_the_link_will_be_measured(capsys, tmp_path, client_key, two_hosts):
    code, out, err = cli(capsys, *launch_args(two_hosts, client_key, tmp_path, "dry"), "--dry-run", "--json")
    assert code == 0, err
    nodes = json.loads(out)["nodes"]
    assert nodes["link_probed"] is True and nodes["link_gbps"] is None
    code, out, err = cli(capsys, *launch_args(two_hosts, client_key, tmp_path, "dry"), "--dry-run")
    assert code == 0, err
    assert "to be measured" in out and "64 MB from each node to rank 0" in out
    assert not list(runs.runs_dir().glob("*.json"))  # a dry run starts nothing


def test_a_port_rank_0_cannot_use_is_one_warning_or_with_probe_link_the_error(capsys, tmp_path, client_key,
                                                                            two_hosts, monkeypatch):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)  # never accepts: the port the probe is told to use is taken
    monkeypatch.setenv("GPUCLI_LINK_PROBE_PORT", str(held.getsockname()[1]))
    try:
        code, out, err = cli(capsys, *launch_args(two_hosts, client_key, tmp_path, "blocked"))
        try:
            assert code == 0, err
            warned = [line for line in err.splitlines() if "could not be measured" in line]
            assert len(warned) == 1 and "cannot listen on port" in warned[0], err
            assert "Traceback" not in err
            record = runs.load("blocked")
            assert record.link is None and record.pid  # started with the link unknown
        finally:
            ended(capsys, "blocked")
        code, out, err = cli(capsys, *launch_args(two_hosts, client_key, tmp_path, "strict"), "--probe-link")
        assert code != 0 and "cannot listen on port" in err and "Traceback" not in err
        said = [line for line in err.splitlines() if "Error" in line or "cannot listen" in line]
        assert len(said) == 1 and said[0].rstrip().endswith("Address already in use"), err
        record = runs.load("strict")
        assert record.status == "failed" and record.pid is None and all(n.pid is None for n in record.nodes)
    finally:
        held.close()


@pytest.mark.parametrize("args", [
    ["--provider", "local", "--nodes", "2", "--probe-link"],
    ["--provider", "ssh", "--host", "u@a", "--host", "u@b", "--link-gbps", "10", "--probe-link"],
    ["--provider", "ssh", "--host", "u@a", "--probe-link"],
])
def test_probe_link_where_there_is_nothing_to_measure_is_one_line(capsys, args):
    code, out, err = cli(capsys, "launch", "--profile", "cpu", *args)
    assert code != 0 and "--probe-link" in err and "Traceback" not in err
    assert not list(runs.runs_dir().glob("*.json"))  # nothing recorded, so nothing started
