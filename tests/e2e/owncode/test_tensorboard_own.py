"""`gpucli tensorboard RUN` for your own code: TensorBoard serves the event files your code's loggers wrote
under its code folder (Lightning's lightning_logs/version_0, here written by the real SummaryWriter), on
this machine and on an SSH host through the tunnel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from gpucli.ssh.remote import SshTarget
from tests.support.sshd import free_port

tb = pytest.importorskip("torch.utils.tensorboard")
pytest.importorskip("tensorboard")
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("provider", ["local", "ssh"])
def test_tensorboard_finds_the_event_files_under_the_code_folder(provider, tmp_path, sshd, client_key,
                                                                 isolated_home):
    workdir = tmp_path / "run"
    w = tb.SummaryWriter(str(workdir / "code" / "tb_logs" / "lightning_logs" / "version_0"))
    w.add_scalar("train_loss", 2.5, 1)
    w.close()
    ssh = (SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))
           if provider == "ssh" else None)
    runs.save(runs.RunRecord(name="tbown", provider=provider, created_at=runs.now_iso(), profile="cpu",
                             phase="own-code", model="own-code", n_gpus=1, gpu=None, workdir=str(workdir),
                             status="running", ssh=ssh, python=sys.executable, launch={"own": {"run": "x"}}))
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), GPUCLI_HOME=str(isolated_home))
    proc = subprocess.Popen([sys.executable, "-m", "gpucli.cli.entry", "tensorboard", "tbown", "--port", str(port)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}/", proc.stderr.read() if proc.poll() is not None else url
        deadline = time.monotonic() + 180  # a busy two-core machine: TensorBoard's first answers can be slow
        found: list[str] = []
        while True:  # TensorBoard lists a run once it has loaded its events
            try:
                with urllib.request.urlopen(url + "data/runs", timeout=30) as r:
                    found = json.loads(r.read())
            except (TimeoutError, OSError):  # no answer yet through the tunnel: ask again until the deadline
                found = []
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert found == ["tb_logs/lightning_logs/version_0"], found
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)  # a deadline: a loaded machine can take long to end a server
        state = workdir / ".tensorboard"
        if state.exists():
            os.killpg(int(state.read_text().split()[0]), signal.SIGTERM)


def test_no_event_files_is_one_line(capsys, tmp_path, isolated_home):
    from tests.support.cli import cli

    (tmp_path / "run" / "code").mkdir(parents=True)
    runs.save(runs.RunRecord(name="tbnone", provider="local", created_at=runs.now_iso(), profile="cpu",
                             phase="own-code", model="own-code", n_gpus=1, gpu=None, workdir=str(tmp_path / "run"),
                             status="finished", python=sys.executable, launch={"own": {"run": "x"}}))
    code, out, err = cli(capsys, "tensorboard", "tbnone", "--port", "0")
    assert code != 0 and "no TensorBoard events" in err and "Traceback" not in err
