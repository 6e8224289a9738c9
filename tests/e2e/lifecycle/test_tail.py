"""`gpucli tail` ends with the run: a trainer that died shows its failure and the console's last lines
instead of `step 0/1000` forever; before the first step it shows what the run is doing.

Real processes and files on this machine (``LocalHost``, the very host code a pod run goes through),
and the real trainer for the end-to-end case.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucli.providers.local.target import LocalHost
from gpucli.run.host import procs
from gpucli.run.watch.follow import FIRST_STEP, STARTING, follow_run, snapshot
from gpucli.runs import records as runs
from gpucli.runs.limits import Limits
from gpucli.runs.records import RunRecord
from tests.support.cli import FAST_TRAINER, cli


def _start(tmp_path: Path, script: str) -> RunRecord:
    """A run record for a real detached process (its own session, output in the run's console.log)."""
    workdir = tmp_path / "run"
    (workdir / "code").mkdir(parents=True)
    host = LocalHost()
    pid = host.start_detached(script, cwd=str(workdir / "code"), log_path=str(workdir / "console.log"))
    return RunRecord(name="t", provider="local", created_at=runs.now_iso(), profile="cpu", phase="fast",
                     model="tiny", n_gpus=1, gpu=None, workdir=str(workdir), status="running", pid=pid,
                     pid_ident=procs.identify(host, sys.executable, pid), python=sys.executable,
                     started_at=runs.now_iso(), limits=Limits(max_steps=1000))


def _append(path: Path, *lines: str) -> None:
    with open(path, "a") as f:
        f.writelines(line + "\n" for line in lines)


def test_before_the_first_step_tail_says_what_the_run_is_doing(tmp_path):
    record = _start(tmp_path, "sleep 60")
    workdir = Path(record.workdir)
    host = LocalHost()
    try:
        assert snapshot(host, record).activity == STARTING
        # Preparing data: the progress rows (trainer/data/progress.py's) win over the same news in the log.
        _append(workdir / "prepare.jsonl", json.dumps(
            {"kind": "prepare", "bytes_read": 2_000_000, "bytes_total": 8_000_000, "tokens": 1234, "eta_s": 3.2}))
        _append(workdir / "train.log", "prepare: 2.0/8.0 MB read, 1,234 tokens, 1.0 MB/s, ETA 3s")
        now = snapshot(host, record)
        assert now.activity == "preparing data: 2.0/8.0 MB read, 1,234 tokens, ETA 3s" and now.end is None
        # Then whatever the trainer logs last (building the model, resuming, compiling).
        _append(workdir / "train.log", "model 0.11M params (0.10M in matmuls), adamw, single x1 on cpu")
        assert snapshot(host, record).activity.startswith("model 0.11M params")
        _append(workdir / "metrics.jsonl", json.dumps({"kind": "event", "event": "started", "step": 0}))
        assert snapshot(host, record).activity == FIRST_STEP
        _append(workdir / "metrics.jsonl", json.dumps({"kind": "train", "step": 1, "loss": 5.5}))
        now = snapshot(host, record)
        assert now.activity is None and now.end is None and len(now.rows) == 2
    finally:
        os.killpg(record.pid, signal.SIGKILL)


def test_follow_ends_when_the_trainer_dies_without_finishing(tmp_path):
    record = _start(tmp_path, "sleep 1; echo 'Traceback (most recent call last):'; "
                              "echo 'RuntimeError: out of memory at step 3' >&2; exit 1")
    _append(Path(record.workdir) / "metrics.jsonl", json.dumps({"kind": "event", "event": "started", "step": 0}),
            json.dumps({"kind": "train", "step": 3, "loss": 4.0}))
    updates = []
    deadline = time.monotonic() + 60
    for update in follow_run(LocalHost, record, poll_s=0.1, check_every_s=0.2):
        updates.append(update)
        assert time.monotonic() < deadline, "tail kept following a dead run"
    end = updates[-1].end
    assert end is not None and end.state == "failed" and end.step == 3
    assert "RuntimeError: out of memory at step 3" in end.log_tail
    assert sum(len(u.rows) for u in updates) == 2  # every row once


def test_follow_ends_at_the_finished_event_and_refuses_a_bad_poll(capsys, tmp_path):
    from gpucli.errors import UsageError

    record = _start(tmp_path, "sleep 60")
    runs.save(record)
    try:
        _append(Path(record.workdir) / "metrics.jsonl",
                json.dumps({"kind": "event", "event": "finished", "reason": "max_steps", "step": 5}))
        (update,) = list(follow_run(LocalHost, record, poll_s=0.1))
        assert update.end is not None and update.end.state == "finished" and update.end.finished_reason == "max_steps"
        for bad in (-1.0, 0.0, float("nan"), float("inf")):
            with pytest.raises(UsageError, match="--poll"):
                follow_run(LocalHost, record, poll_s=bad)
        code, _, err = cli(capsys, "tail", "t", "--poll", "-1")
        assert code == 2 and "--poll must be a number of seconds" in err and "internal error" not in err
    finally:
        os.killpg(record.pid, signal.SIGKILL)


def test_tail_of_a_run_that_failed_ends_with_the_failure(capsys, tmp_path):
    """The whole path: a real local run whose trainer raises at step 2; `gpucli tail` (a separate
    process, as a user runs it) ends by itself with the error, the console's last lines, exit status 1."""
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--phase", "fast", "--name", "crash",
                         "--provider", "local", *FAST_TRAINER, "--set", "data.max_bytes=100000",
                         "--set", "faults.raise_at_step=2")
    assert code == 0, err
    proc = subprocess.run([sys.executable, "-m", "gpucli.cli.app", "tail", "crash", "--poll", "0.2"],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 1, proc.stderr
    assert "run crash failed at step 2: RuntimeError: fault injected by faults.raise_at_step at step 2" in proc.stderr
    assert "last lines of console.log:" in proc.stdout and "Traceback" in proc.stdout
    assert "step 2" in proc.stdout  # the rows it had written
    # --no-follow shows the same end, with exit status 0 (it reports, like status).
    code, out, _ = cli(capsys, "tail", "crash", "--no-follow")
    assert code == 0 and "run crash failed at step 2" in out.replace("\n", " ")
