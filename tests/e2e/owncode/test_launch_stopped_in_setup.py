"""A launch stopped (SIGTERM) during ``--setup`` (issue 41 point 11), over a real sshd: every process
the launch started is in the run record before it waits, so the failed record still names the job
and the watchdog, and ``gpucli down`` stops them ("job was not running" before)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from gpucli.runs import records as runs
from tests.support.cli import cli, wait_for


def test_sigterm_during_setup_records_the_pids_and_down_stops_the_job(capsys, tmp_path, sshd, client_key):
    name = "setupterm"
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "job.py").write_text("import time\ntime.sleep(600)\n")
    launch = subprocess.Popen(
        [sys.executable, "-m", "gpucli", "launch", "--code", str(code_dir), "--run", f"{sys.executable} job.py",
         "--setup", "sleep 600", "--name", name, "--provider", "ssh", "--host",
         f"{sshd.user}@127.0.0.1:{sshd.port}", "--identity", str(client_key[0]), "--python", sys.executable,
         "--workdir", str(tmp_path / "pod" / name)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        def job_started():
            path = runs.runs_dir() / f"{name}.json"
            return path.exists() and runs.load(name).pid
        wait_for(job_started, 120, "the job's pid recorded")
        time.sleep(1.0)  # the launch is waiting on --setup now
        launch.send_signal(signal.SIGTERM)
        launch.communicate(timeout=120)
    finally:
        if launch.poll() is None:
            launch.kill()
    record = runs.load(name)
    assert record.status == "failed"
    assert record.pid and record.watchdog_pid  # recorded before the wait: nothing started is unknown
    code, out, err = cli(capsys, "down", name)
    assert code == 0, err
    assert "job stopped" in out and "was not running" not in out
