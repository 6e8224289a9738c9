"""``gpucli exec RUN -- CMD`` on this machine and over a real sshd: the run's folder and environment (its
secret reaches the command, never a command line), stdout and stderr apart, the exit status as gpucli's
(128+N for a signal), Ctrl-C here ending the command there, and --detach read back with `gpucli logs`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.warm.conftest import SECRET
from tests.support.cli import cli, wait_for

REPO = Path(__file__).resolve().parents[3]
NO_SECRET_ON_ANY_COMMAND_LINE = (
    "import os\n"
    "s = os.environ['MY_SECRET']\n"
    "bad = [p for p in os.listdir('/proc') if p.isdigit() and os.path.exists(f'/proc/{p}/cmdline')\n"
    "       and s.encode() in open(f'/proc/{p}/cmdline', 'rb').read()]\n"
    "print('secret-on-cmdline' if bad else 'clean', len(s))\n")


@pytest.fixture(params=["local", "ssh"])
def run(request):
    return request.getfixturevalue("local_run" if request.param == "local" else "ssh_run")


def test_exec_runs_in_the_folder_with_the_environment(capsys, run, tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(NO_SECRET_ON_ANY_COMMAND_LINE)
    code, out, err = cli(capsys, "exec", run.name, "--", "pwd; echo run=$GPUCLI_RUN; echo oops >&2; exit 3")
    assert code == 3, err
    assert out.splitlines() == [f"{run.workdir}/code", f"run={run.name}"]
    assert "oops" in err and "oops" not in out
    code, out, err = cli(capsys, "exec", run.name, "--", sys.executable, str(script))
    assert code == 0, err
    assert out.strip() == f"clean {len(SECRET)}"  # the secret reached the process, and no command line
    assert SECRET not in out + err
    for f in (Path(run.workdir) / "exec").iterdir():  # nor any file gpucli wrote
        assert SECRET not in f.read_text(errors="replace")


def test_exit_status_of_a_signal_is_128_plus_n(capsys, run):
    code, out, err = cli(capsys, "exec", run.name, "--", "sh", "-c", "kill -TERM $$")
    assert code == 128 + signal.SIGTERM, err
    code, out, err = cli(capsys, "exec", run.name, "--", "sh -c 'kill -KILL $$'")
    assert code == 128 + signal.SIGKILL, err
    code, out, err = cli(capsys, "exec", run.name, "--", "true")
    assert code == 0 and out == ""


def test_a_missing_command_is_one_line(capsys, run):
    code, out, err = cli(capsys, "exec", run.name)
    assert code != 0 and "needs a command" in err and "Traceback" not in err


def _alive(marker: str) -> bool:
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and marker.encode() in Path(f"/proc/{p}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def test_ctrl_c_here_ends_the_command_there(run, isolated_home, tmp_path):
    marker = f"{os.getpid() % 1000 + 300}.{time.time_ns() % 997}"  # a unique sleep to find
    env = {**os.environ, "GPUCLI_HOME": str(isolated_home), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "gpucli", "exec", run.name, "--", f"echo up; sleep {marker}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline() == b"up\n"
        wait_for(lambda: _alive(f"sleep\x00{marker}") or _alive(f"sleep {marker}"), 60, "the remote sleep")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) in (128 + signal.SIGINT, 128 + signal.SIGTERM)
    finally:
        proc.kill()
    wait_for(lambda: not _alive(f"sleep\x00{marker}"), 30, "the remote sleep to end")


def test_detach_and_read_it_back_with_logs(capsys, run):
    import json

    code, out, err = cli(capsys, "exec", run.name, "--detach", "--json", "--", "echo one; echo two >&2; echo three")
    assert code == 0, err
    started = json.loads(out)
    assert started["run"] == run.name
    rc = Path(run.workdir) / "exec" / f"{started['exec_id']}.rc"
    wait_for(rc.exists, 60, "the detached command to end")
    assert rc.read_text().strip() == "0"
    code, out, err = cli(capsys, "logs", run.name, "--exec", started["exec_id"])
    assert code == 0, err
    assert out.splitlines() == ["one", "two", "three"]
    code, out, err = cli(capsys, "logs", run.name, "--exec", started["exec_id"], "-f", "--poll", "0.1")
    assert code == 0 and out.splitlines() == ["one", "two", "three"]  # -f ends: the command has
    code, out, err = cli(capsys, "logs", run.name, "--exec", "../../etc")
    assert code != 0 and "not an exec id" in err
