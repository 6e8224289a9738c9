"""``gpucli launch --on RUN``: two runs in a row on one machine (this one, and a real sshd), the second
reusing what the first left there (the code copied so only changes are synced, the prepared data by its
settings or content hash), its own record and watchdog; a machine busy with a running job or gone is
refused in one line, and nothing is recorded for it."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from gpucli.runs.podfiles import trainer_package_dir
from tests.support.cli import FAST_TRAINER, cli, wait_for

FAST = ["--set", "data.max_bytes=200000", *FAST_TRAINER]


def _steps(n: int) -> list[str]:
    return [*FAST[:-2], "--steps", str(n)]


def _ended(capsys, name: str) -> bool:
    """Over, and its processes gone (the trainer exits a moment after it writes that it finished)."""
    code, out, _ = cli(capsys, "status", name, "--json")
    if not (code == 0 and json.loads(out).get("state") in ("finished", "failed", "stopped")):
        return False
    try:
        os.killpg(runs.load(name).pid, 0)  # local and the test sshd: both this machine
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(autouse=True)
def _quiet_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(params=["local", "ssh"])
def where(request, tmp_path):
    if request.param == "local":
        return ["--provider", "local", "--workdir", str(tmp_path / "machine" / "first")]
    sshd, key = request.getfixturevalue("sshd"), request.getfixturevalue("client_key")
    return ["--provider", "ssh", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "--identity", str(key[0]),
            "--python", sys.executable, "--workdir", str(tmp_path / "machine" / "first")]


def test_two_runs_in_a_row_on_one_machine(capsys, tmp_path, where):
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--name", "first", *where, *_steps(6))
    assert code == 0, err
    wait_for(lambda: _ended(capsys, "first"), 240, "the first run to end")
    first = runs.load("first")

    code, out, err = cli(capsys, "launch", "--on", "first", "--name", "second", *_steps(400))
    assert code == 0, err
    said = out + err
    assert "code: copied first's" in said and "prepared demo corpus reused" in said
    if first.provider == "ssh":  # a host gpucli sets up: the pinned environment found there, never built again
        assert "trainer environment (" in said and "built a venv" not in said
    second = runs.load("second")
    assert second.provider == first.provider and second.workdir == str(tmp_path / "machine" / "second")
    assert second.launch["on"] == {"machine": "first", "after": "first"}
    assert second.pid and second.watchdog_pid and second.watchdog_pid != first.watchdog_pid  # its own watchdog
    one = Path(first.workdir) / "data" / "prepared" / "meta.json"
    two = Path(second.workdir) / "data" / "prepared" / "meta.json"
    assert two.exists() and os.stat(two).st_ino == os.stat(one).st_ino  # the same tokens, not prepared again
    # Its code is the first run's copy, synced: the same files, not re-sent by the copy.
    assert (Path(second.workdir) / "code" / "trainer" / "train.py").read_bytes() == \
        (Path(first.workdir) / "code" / "trainer" / "train.py").read_bytes()

    # While the second trains, the machine is busy: a third is refused in one line, nothing recorded.
    code, out, err = cli(capsys, "launch", "--on", "first", "--name", "third", *_steps(6))
    assert code != 0 and "busy: run second is still running there" in err and "Traceback" not in err
    assert not (runs.runs_dir() / "third.json").exists()
    code, out, err = cli(capsys, "down", "second")
    assert code == 0, err


def test_a_gone_machine_is_refused_in_one_line(capsys, tmp_path, sshd, client_key):
    where = ["--provider", "ssh", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "--identity", str(client_key[0]),
             "--python", sys.executable, "--workdir", str(tmp_path / "m" / "gone1")]
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--name", "gone1", *where, *_steps(4))
    assert code == 0, err
    wait_for(lambda: _ended(capsys, "gone1"), 240, "the run to end")
    sshd.stop()
    code, out, err = cli(capsys, "launch", "--on", "gone1", "--name", "after", *_steps(4))
    assert code != 0 and "the machine of gone1 cannot be reached" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2  # the line and its hint
    assert not (runs.runs_dir() / "after.json").exists()


def test_on_a_run_that_does_not_exist(capsys):
    code, out, err = cli(capsys, "launch", "--on", "nosuch", "--steps", "4")
    assert code != 0 and "nosuch" in err and "Traceback" not in err


def test_prepared_data_is_reused_by_content_hash(capsys, tmp_path):
    data = tmp_path / "corpus"
    data.mkdir()
    (data / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 4000)
    where = ["--provider", "local", "--workdir", str(tmp_path / "m" / "d1"), "--data", str(data)]
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--name", "d1", *where, *_steps(4))
    assert code == 0, err
    wait_for(lambda: _ended(capsys, "d1"), 240, "the first run to end")
    code, out, err = cli(capsys, "launch", "--on", "d1", "--name", "d2", "--data", str(data), *_steps(4))
    assert code == 0, err
    assert "d1's prepared data kept in the" in out + err  # (the status line wraps the rest)
    wait_for(lambda: _ended(capsys, "d2"), 240, "the second run to end")
    prepared = Path(runs.load("d2").workdir) / "data" / "prepared"
    assert prepared.is_symlink() and prepared.resolve().parent.name == ".gpucli-data"
    assert "reusing prepared data" in (Path(runs.load("d2").workdir) / "console.log").read_text()
    # Changed inputs hash otherwise: prepared afresh, never the stale tokens.
    (data / "a.txt").write_text("a different corpus altogether\n" * 4000)
    code, out, err = cli(capsys, "launch", "--on", "d2", "--name", "d3", "--data", str(data), *_steps(4))
    assert code == 0, err
    wait_for(lambda: _ended(capsys, "d3"), 240, "the third run to end")
    third = (Path(runs.load("d3").workdir) / "data" / "prepared").resolve()
    assert third != prepared.resolve() and (third / "meta.json").exists()


def test_a_warm_launch_over_ssh_sends_only_the_changed_line_and_prepares_nothing(capsys, tmp_path, sshd, client_key):
    """What a user iterating on a kept SSH machine pays for: one changed file sent, the --data folder and
    its prepared tokens found there (content hash), the environment found, not built."""
    data = tmp_path / "corpus"
    data.mkdir()
    (data / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 4000)
    (data / "b.txt").write_text("pack my box with five dozen liquor jugs\n" * 4000)
    where = ["--provider", "ssh", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "--identity", str(client_key[0]),
             "--python", sys.executable, "--workdir", str(tmp_path / "m" / "w1"), "--data", str(data)]
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--name", "w1", *where, *_steps(4))
    assert code == 0, err
    cold = " ".join((out + err).split())
    sent = re.search(r"trainer code: (\d+) files sent", cold)
    assert "data: 2 files sent, 0 unchanged" in cold and sent and int(sent.group(1)) > 10  # the whole trainer
    wait_for(lambda: _ended(capsys, "w1"), 240, "the first run to end")
    # The trainer's copy on the machine now differs from this one's by one line in one file (as when a line
    # was changed here): the next run must send that file, and only it.
    there = Path(runs.load("w1").workdir) / "code" / "trainer" / "train.py"
    there.write_text(there.read_text() + "# a line that is not in this machine's copy\n")

    code, out, err = cli(capsys, "launch", "--on", "w1", "--name", "w2", "--data", str(data), *_steps(4))
    assert code == 0, err
    warm = " ".join((out + err).split())  # (status lines wrap)
    assert "trainer code: 1 files sent" in warm
    assert "data: 0 files sent, 2 unchanged" in warm
    assert "w1's prepared data kept in the machine's cache" in warm
    assert "trainer environment (" in warm and "built a venv" not in warm
    wait_for(lambda: _ended(capsys, "w2"), 240, "the second run to end")
    second = Path(runs.load("w2").workdir)
    assert "reusing prepared data" in (second / "console.log").read_text()  # not prepared again
    # the file sent is this machine's: the line that was only there is gone
    assert (second / "code" / "trainer" / "train.py").read_bytes() == (trainer_package_dir() / "train.py").read_bytes()
