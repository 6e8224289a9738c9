"""`gpucli tensorboard RUN` end to end, the real console entry and real TensorBoard: for a run on an SSH
host (the sshd fixture) it starts TensorBoard there bound to 127.0.0.1 and tunnels it over the run's
SSH connection; for a local run it serves the run's tb/ here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from gpucli.ssh.remote import SshTarget
from tests.support.sshd import free_port

pytest.importorskip("tensorboard")
REPO = Path(__file__).resolve().parents[3]


def _record(tmp_path: Path, provider: str, ssh: SshTarget | None) -> runs.RunRecord:
    workdir = tmp_path / "run"
    (workdir / "tb").mkdir(parents=True)
    return runs.RunRecord(name="tbrun", provider=provider, created_at=runs.now_iso(), profile="cpu", phase="fast",
                          model="tiny", n_gpus=1, gpu=None, workdir=str(workdir), status="running", ssh=ssh,
                          python=sys.executable)


@pytest.mark.parametrize("provider", ["ssh", "local"])
def test_tensorboard_reachable_on_a_local_port(provider, tmp_path, sshd, client_key, isolated_home):
    ssh = (SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))
           if provider == "ssh" else None)
    record = _record(tmp_path, provider, ssh)
    runs.save(record)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), GPUCLI_HOME=str(isolated_home))
    proc = subprocess.Popen([sys.executable, "-m", "gpucli.cli.entry", "tensorboard", "tbrun", "--port", str(port)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}/", proc.stderr.read() if proc.poll() is not None else url
        with urllib.request.urlopen(url, timeout=30) as r:
            assert b"TensorBoard" in r.read() or r.status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)  # a deadline: a loaded machine can take long to end a server
        state = Path(record.workdir) / ".tensorboard"
        if state.exists():  # the host's TensorBoard outlives the tunnel, as on a pod: end it here
            os.killpg(int(state.read_text().split()[0]), signal.SIGTERM)
    if provider == "ssh":
        assert state.exists() and int(state.read_text().split()[1]) > 0
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)
