"""jobrun.py run for real (a subprocess, bash, the scripts of scripts.py) on this machine."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from tests.gpucli.pod.conftest import WATCHDOG
from tests.support.jobscripts import local_text, write_script


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:  # a zombie not yet reaped counts as gone
        return fh.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_nanogpt_format_trains_on_local_text_and_keeps_the_overwritten_ckpt(job):
    (job.code / "input.txt").write_text(local_text())
    script = write_script(job.code, "nanogpt")
    res = job.run(f"python {script} input.txt")
    assert res.returncode == 0, res.stdout + res.stderr
    train = job.kind("train")
    assert [r["step"] for r in train] == list(range(60))
    assert train[-1]["loss"] < train[0]["loss"]  # it really trains
    assert "mfu" not in train[0] and train[10]["mfu"] == 0.0123  # -100.00% is no measurement
    vals = job.kind("val")
    assert [r["step"] for r in vals] == [0, 20, 40, 60]
    assert all(isinstance(r["val_loss"], float) for r in vals)
    assert (job.code / "checkpoints" / "ckpt.pt").exists()
    finished = job.events("finished")[-1]
    assert finished["reason"] == "exit 0" and finished["step"] == 60
    assert job.status()["state"] == "finished"
    log = (job.run_dir / "train.log").read_text()
    assert "iter 59: loss" in log and "step 60: train loss" in log
    assert "iter 59: loss" in res.stdout  # tee'd to its stdout too (the run's console.log)


def test_nanochat_format_rows_carry_tok_per_s_and_mfu(job):
    script = write_script(job.code, "nanochat")
    assert job.run(f"python {script}").returncode == 0
    train = job.kind("train")
    assert [r["step"] for r in train] == list(range(20))
    assert train[3]["tok_per_s"] == 524288 and abs(train[3]["mfu"] - 0.415) < 1e-9 and train[3]["lrm"] == 1.0
    assert [(r["step"], r["val_bpb"]) for r in job.kind("val")] == [(5, 1.1), (10, 0.8), (15, 0.9), (20, 0.95)]
    assert (job.code / "checkpoints" / "model_000010.pt").exists()


def test_hf_trainer_steps_come_from_the_training_bar_not_the_eval_bar(job):
    script = write_script(job.code, "hf")
    assert job.run(f"python {script}").returncode == 0
    train = job.kind("train")
    assert [r["step"] for r in train] == [10, 20, 30, 40]
    assert train[0]["loss"] == 2.5 and train[0]["lr"] > 0 and train[0]["grad_norm"] == 1.25
    assert [(r["step"], r["val_loss"]) for r in job.kind("val")] == [(20, 1.9), (40, 2.1)]
    assert sorted(p.name for p in (job.code / "checkpoints").iterdir()) == ["checkpoint-20", "checkpoint-40"]


def test_lightning_progress_lines_become_one_row_per_batch_and_a_val_row_per_validation(job):
    script = write_script(job.code, "lightning")
    assert job.run(f"python {script}").returncode == 0
    train = job.kind("train")
    assert [r["step"] for r in train] == list(range(1, 21))  # epoch 1 continues after epoch 0's 10 batches
    assert abs(train[-1]["loss"] - 1.0) < 1e-9
    assert [(r["step"], r["val_loss"]) for r in job.kind("val")] == [(10, 1.5), (20, 1.2)]


def test_rows_the_job_appends_to_gpucli_metrics_are_copied(job):
    script = write_script(job.code, "jsonfile")
    assert job.run(f"python {script}").returncode == 0
    assert [(r["step"], r["loss"]) for r in job.kind("train")] == [(s, 2.0 / s) for s in range(1, 6)]
    assert job.kind("train")[0]["tok_per_s"] == 1000.0
    assert [(r["step"], r["val_loss"]) for r in job.kind("val")] == [(5, 0.7)]


def test_the_job_environment(job):
    (job.run_dir / "envfile").write_text("EXTRA_VAR='from the env file'\n")
    cmd = ("echo RUN=$GPUCLI_RUN; echo DIR=$GPUCLI_RUN_DIR; echo DATA=$GPUCLI_DATA; echo CK=$GPUCLI_CHECKPOINTS; "
           "echo M=$GPUCLI_METRICS; echo G=$GPUCLI_GPUS; echo U=$PYTHONUNBUFFERED; echo X=$EXTRA_VAR; pwd; "
           "ps -o pgid= -p $$")
    res = job.run(cmd, "--name", "my-run", "--checkpoints", "out/ck", "--env-file", str(job.run_dir / "envfile"))
    out = res.stdout
    assert "RUN=my-run" in out and f"DIR={job.run_dir}" in out and f"DATA={job.run_dir}/data/src" in out
    assert f"CK={job.code}/out/ck" in out and (job.code / "out" / "ck").is_dir()
    assert f"M={job.run_dir}/job_metrics.jsonl" in out and "G=0" in out and "U=1" in out
    assert "X=from the env file" in out and str(job.code) in out.splitlines()
    pgid = int(out.strip().splitlines()[-1])
    assert pgid != os.getpgrp()  # the job runs in a process group of its own


def test_setup_runs_once_per_run_folder_and_its_output_is_in_the_log(job):
    setup = "echo installing >> setup_count; echo 'Successfully installed tiny-1.0'"
    for _ in range(2):
        res = job.run("echo 'iter 1: loss 1.0000, time 1.00ms, mfu 2.00%'", "--setup", setup)
        assert res.returncode == 0
    assert (job.code / "setup_count").read_text().count("installing") == 1
    assert "Successfully installed tiny-1.0" in (job.run_dir / "train.log").read_text()
    # A changed setup command runs again.
    assert job.run("true", "--setup", setup + "; echo v2").returncode == 0
    assert (job.code / "setup_count").read_text().count("installing") == 2


def test_a_failing_setup_ends_with_its_last_lines_and_never_runs_the_command(job):
    res = job.run("touch ran", "--setup", "echo collecting torch; echo 'ERROR: No matching distribution'; exit 3")
    assert res.returncode == 3
    status = job.status()
    assert status["state"] == "failed" and status["reason"] == "setup exit 3"
    assert status["story"] == "failed (setup exit 3)"
    assert status["log_tail"][-1] == "ERROR: No matching distribution"
    assert job.events("finished")[-1]["log_tail"][-1] == "ERROR: No matching distribution"
    assert not (job.code / "ran").exists()


def test_a_failing_command_is_failed_with_its_last_lines(job):
    script = write_script(job.code, "failing")
    res = job.run(f"python {script}")
    assert res.returncode == 1
    status = job.status()
    assert status["state"] == "failed" and status["reason"] == "exit 1: RuntimeError: CUDA out of memory (pretend)"
    assert status["story"] == "failed (exit 1: RuntimeError: CUDA out of memory (pretend))"
    assert status["log_tail"][-1] == "RuntimeError: CUDA out of memory (pretend)"
    assert "loading shard 7" in status["log_tail"]
    assert job.kind("train")[0]["loss"] == 5.0  # what it logged before failing is kept


def test_sigterm_is_forwarded_and_the_job_gets_its_grace_period(job):
    script = write_script(job.code, "graceful")
    proc = job.start(f"python {script}", "--grace-s", "20")
    deadline = time.monotonic() + 30
    while len(job.kind("train")) < 3:
        assert time.monotonic() < deadline, "no rows"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)  # what the watchdog and `gpucli down` send
    assert proc.wait(timeout=30) == 0
    saved = list((job.code / "checkpoints").glob("emergency_step_*.pt"))
    assert saved, "the job had no time for its checkpoint"
    finished = job.events("finished")[-1]
    assert finished["reason"] == "signal" and job.status()["state"] == "finished"


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_period(job):
    script = write_script(job.code, "stubborn")
    proc = job.start(f"python {script}", "--grace-s", "1")
    deadline = time.monotonic() + 30
    while not job.kind("train"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    pid = int((job.run_dir / "job.pid").read_text())
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=20)  # the runner ended: it did not wait on the job that ignores SIGTERM
    assert _gone(pid)  # the job was killed after its grace
    assert job.events("finished")[-1]["reason"] == "signal"


def test_a_loss_spike_is_an_event(job):
    lines = [f"iter {i}: loss 1.0000, time 1.00ms, mfu 1.00%" for i in range(8)]
    lines.append("iter 8: loss 9.0000, time 1.00ms, mfu 1.00%")
    (job.code / "log.txt").write_text("\n".join(lines) + "\n")
    assert job.run("cat log.txt").returncode == 0
    spikes = job.events("loss_spike")
    assert len(spikes) == 1 and spikes[0]["step"] == 8 and spikes[0]["rolling_mean_loss"] == 1.0


def test_a_user_regex_reads_an_unknown_format(job):
    (job.code / "log.txt").write_text("it=3 l=2.5\nit=4 l=2.25 vl=2.4\n")
    res = job.run("cat log.txt", "--metrics-regex", r"it=(?P<step>\d+) l=(?P<loss>[\d.]+)(?: vl=(?P<val_loss>[\d.]+))?")
    assert res.returncode == 0
    assert [(r["step"], r["loss"]) for r in job.kind("train")] == [(3, 2.5), (4, 2.25)]
    assert [(r["step"], r["val_loss"]) for r in job.kind("val")] == [(4, 2.4)]


def test_a_bad_regex_is_one_line_and_runs_nothing(job):
    res = job.run("touch ran", "--metrics-regex", r"(?P<step>\d+)")
    assert res.returncode == 2 and "loss" in res.stderr and "Traceback" not in res.stderr
    assert not (job.code / "ran").exists()


def test_output_keeps_the_watchdog_from_calling_a_talkative_job_stalled(job):
    script = "for i in 1 2 3 4 5 6 7; do echo 'downloading...'; sleep 1; done"
    proc = job.start(script)
    time.sleep(1.5)
    first = (job.run_dir / "metrics.jsonl").stat().st_mtime
    time.sleep(5.0)
    assert proc.poll() is None  # still running: only the heartbeat can have moved the mtime
    assert (job.run_dir / "metrics.jsonl").stat().st_mtime > first
    assert not job.kind("train")  # no metrics row at all, yet the watchdog sees progress
    proc.wait(timeout=30)


def test_the_watchdog_hours_cap_stops_the_job_through_jobrun(job):
    script = write_script(job.code, "graceful")
    proc = job.start(f"python {script}", "--grace-s", "10")
    dog = subprocess.run([sys.executable, str(WATCHDOG), "--run-dir", str(job.run_dir), "--pgid", str(proc.pid),
                          "--provider", "local", "--max-hours", str(3 / 3600), "--poll-s", "0.2",
                          "--grace-s", "20"], capture_output=True, text=True, timeout=60)
    assert dog.returncode == 0, dog.stderr
    assert proc.wait(timeout=5) == 0
    assert "limit reached" in (job.run_dir / "watchdog.json").read_text()
    assert list((job.code / "checkpoints").glob("emergency_step_*.pt"))
    # the watchdog said why before it signalled: the runner's end story names the cap
    assert re.fullmatch(r"stopped by cap: max_hours 0\.000833333 h at [3-8] s", job.events("finished")[-1]["reason"])


def test_setup_installs_into_the_jobs_venv_never_into_this_python(job, tmp_path):
    import sys

    venv = tmp_path / "venvs" / "abc"
    res = job.run("python -c 'import sys; print(\"prefix\", sys.prefix)'", "--venv", str(venv),
                  "--setup", "pip --version; python -m pip --version")
    assert res.returncode == 0, res.stdout + res.stderr
    log = (job.run_dir / "train.log").read_text()
    pips = [line for line in log.splitlines() if line.startswith("pip ")]
    assert len(pips) == 2 and all(str(venv) in line for line in pips), pips  # pip of the venv, both ways
    assert f"prefix {venv}" in log and sys.prefix != str(venv)
