"""``gpucli logs`` over a real sshd: the console as it is (control sequences stripped), the end of a
big log only, --since by the lines' timestamps, and -f following across dropped connections from the
byte it reached (no line lost or repeated) until the job ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpucli.runs import records as runs
from tests.support.cli import cli

REPO = Path(__file__).resolve().parents[3]


def test_logs_prints_the_console_clean(capsys, ssh_run):
    log = Path(ssh_run.workdir) / "console.log"
    log.write_bytes(b"hello\n\x1b[2J\x1b]0;evil title\x07step 1 \x1b[31mred\x1b[0m\nno newline yet")
    code, out, err = cli(capsys, "logs", "r1")
    assert code == 0, err
    assert out == "hello\nstep 1 red\n"  # the unfinished line waits for its newline
    assert "console.log on 127.0.0.1" in err and "pod clock 20" in err and "UTC" in err


def test_logs_of_a_big_file_show_its_end(capsys, ssh_run):
    log = Path(ssh_run.workdir) / "console.log"
    log.write_text("".join(f"line {i:06d} " + "x" * 50 + "\n" for i in range(20_000)))  # 1.2 MB
    code, out, err = cli(capsys, "logs", "r1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[-1].startswith("line 019999") and 500 < len(lines) < 2000
    assert all(line.startswith("line ") and len(line) == 62 for line in lines)  # whole lines only


def test_since_keeps_lines_from_that_time(capsys, ssh_run):
    log = Path(ssh_run.workdir) / "console.log"
    log.write_text("2026-01-01 10:00:00 early\nTraceback of early\n2026-01-01 10:29:59 still early\n"
                   "2026-01-01 10:30:00 on time\n  continued\n2026-01-01T11:00:00Z late\n")
    code, out, err = cli(capsys, "logs", "r1", "--since", "2026-01-01T10:30")
    assert code == 0, err
    assert out == "2026-01-01 10:30:00 on time\n  continued\n2026-01-01T11:00:00Z late\n"
    code, out, err = cli(capsys, "logs", "r1", "--since", "10m")  # by the pod's clock: all of it is older
    assert code == 0 and out == ""
    log.write_text("no stamps\nat all\n")
    code, out, err = cli(capsys, "logs", "r1", "--since", "1h")
    assert code == 0 and out == "no stamps\nat all\n" and "could not filter" in err
    code, out, err = cli(capsys, "logs", "r1", "--since", "yesterday")
    assert code != 0 and "--since 'yesterday'" in err


def test_node_of_a_one_machine_run(capsys, ssh_run):
    code, out, err = cli(capsys, "logs", "r1", "--node", "1")
    assert code != 0 and "has no node 1" in err and "Traceback" not in err


def test_follow_resumes_after_dropped_connections_and_ends_with_the_job(sshd, ssh_run, isolated_home):
    job = subprocess.Popen(["sleep", "120"], start_new_session=True)
    runs.save(ssh_run.with_(pid=job.pid))
    log = Path(ssh_run.workdir) / "console.log"
    log.write_text("line 0\n")
    env = {**os.environ, "GPUCLI_HOME": str(isolated_home), "PYTHONPATH": str(REPO)}
    follower = subprocess.Popen([sys.executable, "-m", "gpucli", "logs", "r1", "-f", "--poll", "0.1", "-t"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = follower.stdout.readline()  # following now
        assert first.endswith(" | line 0\n"), first + follower.stderr.read()
        with log.open("a") as fh:
            for i in range(1, 61):
                fh.write(f"line {i}\n")
                fh.flush()
                if i % 20 == 0:
                    sshd.kill_sessions()  # the connection drops mid-follow
                time.sleep(0.05)
            fh.write("partial ")
            fh.flush()
            time.sleep(0.5)
            fh.write("line end\n")
        time.sleep(1)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=10)
        out, err = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert follower.returncode == 0, err
    out = first + out
    got = [line.split(" | ", 1)[1] for line in out.splitlines()]
    assert got == [f"line {i}" for i in range(61)] + ["partial line end"]  # none lost, none twice
    assert all(line[2] == ":" and line[5] == ":" for line in out.splitlines())  # the pod's clock, HH:MM:SS
