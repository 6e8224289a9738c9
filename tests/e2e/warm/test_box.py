"""``gpucli up``: a dev box with the environment ready and no job, that ends itself after its idle window with
no gpucli process alive here (its idle watch on the machine), runs jobs with ``launch --on BOX`` (their own
watchdogs leave the machine to the box), counts the machine's money once, and ``gpucli down BOX`` ends it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpucli.pod.procid import group_alive
from gpucli.runs import records as runs
from tests.support.cli import FAST_TRAINER, cli, wait_for

FAST = ["--set", "data.max_bytes=200000", *FAST_TRAINER[:-2]]
REPO = Path(__file__).resolve().parents[3]
TINY = ["--model", "tiny", "--set", "hardware.device=cpu", "--set", "hardware.compile=false",
        "--set", "hardware.mixed_precision=false", *FAST]


@pytest.fixture(autouse=True)
def _quiet_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("GPUCLI_PROVIDER_POLL_S", "0.05")


def gpucli(*args: str) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "gpucli", *args], capture_output=True, text=True, env=env,
                          timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


def _state(workdir: str) -> dict:
    try:
        return json.loads((Path(workdir) / "watchdog.json").read_text())
    except (OSError, ValueError):
        return {}


def _gone(pid: int) -> bool:
    """No live process of the group left (a detached start of this process may leave a zombie behind)."""
    return not group_alive(pid)


def test_a_local_box_runs_a_job_counts_money_once_and_ends_when_idle(capsys, tmp_path):
    code, out, err = cli(capsys, "up", "--provider", "local", "--profile", "cpu", "--idle-stop", "4s",
                         "--price", "3.6", "--workdir", str(tmp_path / "m" / "box1"), "--name", "box1")
    assert code == 0, err
    box = runs.load("box1")
    assert box.status == "running" and box.pid is None and box.watchdog_pid  # no job, its idle watch
    assert (Path(box.workdir) / "code" / "trainer" / "train.py").is_file()  # the environment is ready
    assert (Path(box.workdir) / "env").stat().st_mode & 0o777 == 0o600

    code, out, err = cli(capsys, "launch", "--on", "box1", "--name", "job1", *FAST, "--steps", "400")
    assert code == 0, err
    job = runs.load("job1")
    assert job.workdir == str(tmp_path / "m" / "job1") and job.launch["on"]["machine"] == "box1"
    wait_for(lambda: _state(box.workdir).get("jobs") == ["job1"], 60, "the idle watch to see the job")
    code, out, err = cli(capsys, "ls")
    assert code == 0, err
    assert "one machine (box box1): box1, job1" in out and "counted once" in out
    rows = {r["run"]: r for r in json.loads(cli(capsys, "ls", "--json")[1])}
    total = float(re.search(r"today's runs: \$([0-9.,]+)", out)[1].replace(",", ""))
    assert rows["job1"]["machine"] == "box1" and rows["job1"]["cost_usd"] is not None
    # The job's cost is a share of the box's: the day counts the box alone.
    assert total == pytest.approx(rows["box1"]["cost_usd"], abs=0.02)
    assert total < rows["box1"]["cost_usd"] + rows["job1"]["cost_usd"] - 0.001 or rows["job1"]["cost_usd"] < 0.01
    code, out, err = cli(capsys, "down", "job1")
    assert code == 0, err
    # No job, no session: the box ends itself, with no gpucli process alive here.
    wait_for(lambda: _state(box.workdir).get("state") == "done", 120, "the box to end itself when idle")
    assert _state(box.workdir)["verdict"].startswith("idle for")
    wait_for(lambda: _gone(box.watchdog_pid), 30, "the idle watch to exit")


def test_bad_idle_window_is_one_line(capsys):
    code, out, err = cli(capsys, "up", "--provider", "local", "--profile", "cpu", "--idle-stop", "soon")
    assert code != 0 and "--idle-stop 'soon'" in err and "Traceback" not in err


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_a_cloud_box_stops_itself_when_idle(provider, request, capsys, tmp_path):
    emu = request.getfixturevalue(f"{provider}_emulator")
    if provider == "vast":  # a verified 1x RTX 4090, as vast's default filters want (tests/e2e/cloud)
        from tests.support.emulators.vast import _offer

        emu.offers.append(_offer(1011, "RTX 4090", 1, 24564, 0.45, 0.22, 0.99, 900.0, "Lyon, FR", 29.0))
    # Each command a process of its own that exits, as a user runs them: nothing of gpucli is alive here after.
    code, out, err = gpucli("up", "--provider", provider, "--profile", "rtx4090", "--idle-stop", "25s",
                            "--name", "cbox", "--workdir", str(tmp_path / "pod" / "cbox"), "--python", sys.executable,
                            "--ready-timeout", "20")
    assert code == 0, err
    box = runs.load("cbox")
    created = emu.ledger.created()
    assert len(created) == 1 and box.instance_id == created[0].pod_id
    # A job on the box: no new pod, and its end does not end the box (its watchdog keeps the machine).
    code, out, err = gpucli("launch", "--on", "cbox", "--name", "cjob", *TINY, "--steps", "6")
    assert code == 0, err
    assert len(emu.ledger.created()) == 1
    code, out, err = gpucli("exec", "cjob", "--", "echo on-the-box")
    assert code == 0 and out == "on-the-box\n", err
    assert gpucli("exec", "cbox", "--", "exit 7")[0] == 7  # the box itself: its folder and environment
    assert gpucli("exec", "cjob", "--", "sh -c 'kill -TERM $$'")[0] == 128 + 15
    job = runs.load("cjob")
    wait_for(lambda: _gone(job.pid), 240, "the job to end")
    # The pod stopped through the provider's API, by the watch on it (stopping takes the watch along, as a
    # stopped container takes its processes: the provider's word and the watch's log say it).
    try:
        ended = wait_for(lambda: emu.ledger.ended(box.instance_id), 180, "the provider to say the box's pod is stopped")
    except AssertionError as exc:
        log = Path(box.workdir) / "watchdog.log"
        raise AssertionError(f"{exc}: {_state(box.workdir)} {log.read_text() if log.exists() else ''}") from None
    assert ended[0].event == "stopped"  # the chosen end action (stop: its disk stays)
    assert "box over: idle for" in (Path(box.workdir) / "watchdog.log").read_text()
    job_verdict = json.loads((Path(job.workdir) / "watchdog.json").read_text())
    assert not job_verdict.get("pod_ended")  # the job's watchdog left the machine to the box
