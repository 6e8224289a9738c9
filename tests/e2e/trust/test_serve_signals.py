"""`gpucli serve` never leaves its trainer.serve child behind, whatever signal ends it, and refuses a
busy port in one line instead of taking another server's answers for its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.sshd import free_port

REPO = Path(__file__).resolve().parents[3]


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tests.trainer.conftest import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_serve_ends_its_child_on_every_signal(sig, checkpoint, isolated_home):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "gpucli.cli.entry", "serve", str(checkpoint), "--port", str(port)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.endswith(f":{port}/v1"), proc.stderr.read() if proc.poll() is not None else url
        (child,) = children(proc.pid)
        proc.send_signal(sig)
        proc.wait(120)  # a deadline: a loaded machine can take long to end a server
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 60
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(child), f"trainer.serve (pid {child}) outlived gpucli serve ended by {signal.Signals(sig).name}"
    if sig != signal.SIGKILL:
        err = proc.stderr.read()
        assert "Traceback" not in err, err


def test_a_busy_port_is_one_line(checkpoint, isolated_home):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "gpucli.cli.entry", "serve", str(checkpoint), "--port", str(port)],
                           cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
                           timeout=120)
    assert r.returncode != 0 and "serving" not in r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and f"port {port} on 127.0.0.1 is in use" in lines[0], r.stderr
