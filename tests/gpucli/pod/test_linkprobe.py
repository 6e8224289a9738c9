"""gpucli/pod/linkprobe.py as it runs on the nodes: a real sink and sender over loopback; a sender whose
bytes are never read gives up at its deadline; a connection without the probe's tag is not heard."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import gpucli.pod.linkprobe as probe_script

SCRIPT = Path(probe_script.__file__)


def start_sink(tmp_path: Path, tag: str, deadline_s: float = 30) -> tuple[subprocess.Popen, Path, int]:
    state = tmp_path / "state.json"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "sink", "--deadline-s", str(deadline_s), "--tag", tag,
                             "--state", str(state)])
    end = time.monotonic() + 30
    while not state.exists():
        assert time.monotonic() < end and proc.poll() is None, "the sink never listened"
        time.sleep(0.05)
    return proc, state, json.loads(state.read_text())["port"]


def send(port: int, tag: str, nbytes: int, deadline_s: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "send", "--to", f"127.0.0.1:{port}", "--bytes", str(nbytes),
                           "--deadline-s", str(deadline_s), "--tag", tag], capture_output=True, text=True, timeout=120)


def test_the_bytes_are_timed_where_they_arrive(tmp_path):
    proc, state, port = start_sink(tmp_path, "t0")
    with socket.create_connection(("127.0.0.1", port)) as stray:  # no tag: closed unheard
        stray.sendall(b"xx")  # as long as the tag, not it
        stray.shutdown(socket.SHUT_WR)
        assert stray.recv(16) == b""
    res = send(port, "t0", 8 * 1024 * 1024)
    assert res.returncode == 0, res.stderr
    assert proc.wait(timeout=30) == 0
    got = json.loads(state.read_text())
    assert got["bytes"] == 8 * 1024 * 1024 and got["seconds"] > 0 and got["port"] == port


def test_a_sender_nobody_reads_gives_up_at_its_deadline():
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(1)  # accepts into the backlog, never reads: the bytes stall once the buffers are full
        res = send(hole.getsockname()[1], "t1", 256 * 1024 * 1024, deadline_s=1)
    assert res.returncode == 2 and "broke off" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_nobody_connecting_ends_the_sink_at_its_deadline(tmp_path):
    proc, state, port = start_sink(tmp_path, "t2", deadline_s=1)
    assert proc.wait(timeout=60) == 2
    assert "no node connected within 1 s" in json.loads(state.read_text())["error"]


def test_a_refused_connection_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        res = send(port, "t3", 1024, deadline_s=5)
    assert res.returncode == 2 and res.stderr.startswith("cannot connect to 127.0.0.1:") and "Connection refused" in res.stderr
