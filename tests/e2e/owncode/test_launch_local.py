"""Own code through `gpucli launch --provider local`: the test suite's scripts in each console format, as a
user runs them (whole CLI, real processes: jobrun.py, the watchdog, the script)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from tests.e2e.owncode.helpers import (
    code_dir,
    fetch_best,
    finished_rows,
    launch_own,
    status_json,
    train_losses,
)
from tests.support.cli import cli, rows_of, wait_for


@pytest.fixture(autouse=True)
def quick_watchdog(monkeypatch):
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "0.25")
    monkeypatch.setenv("GPUCLI_WATCHDOG_GRACE_S", "15")


# kind -> (the checkpoint fetch-best must bring back, the files in it)
EXPECTED = {
    "nanogpt": ("ckpt.pt", ["ckpt.pt"]),  # one file, overwritten when the val loss improves
    "nanochat": ("step_10", ["meta_000010.json", "model_000010.pt"]),  # val bpb 0.80; optim_ with --with-optimizer
    "hf": ("checkpoint-20", ["checkpoint-20/model.safetensors", "checkpoint-20/trainer_state.json"]),  # eval 1.9
    "lightning": ("epoch=1-step=20.ckpt", ["epoch=1-step=20.ckpt"]),  # val_loss 1.2 < 1.5
}


@pytest.mark.parametrize("kind", ["nanogpt", "nanochat", "hf", "lightning"])
def test_formats_tail_status_and_fetch_best(capsys, tmp_path, kind):
    name = f"own-{kind}"
    code, out, err = launch_own(capsys, tmp_path, kind, name, "--provider", "local", "--profile", "cpu")
    assert code == 0, err
    rows = finished_rows(capsys, name)
    losses = train_losses(rows)
    steps = [s for s, _ in losses]
    assert len(losses) >= 4 and steps == sorted(steps) and len(set(steps)) == len(steps), losses
    assert all(isinstance(v, float) and 0 < v < 10 for _, v in losses)
    finished = [r for r in rows if r.get("event") == "finished"][-1]
    assert finished["reason"] == "exit 0"

    st = status_json(capsys, name)
    assert st["state"] == "finished" and st["step"] is not None
    assert runs.load(name).status == "finished"

    want, files = EXPECTED[kind]
    got = fetch_best(capsys, name, tmp_path / "fetched")
    assert got["checkpoint"] == want and sorted(got["files"]) == files
    dest = Path(got["dest"])
    ck_root = Path(runs.load(name).workdir) / "code" / "checkpoints"
    for rel in files:
        assert (dest / rel).read_bytes() == (ck_root / rel).read_bytes()
    if kind == "nanochat":  # the optimizer state only when asked for (a resume needs it, using the model not)
        code, out, err = cli(capsys, "fetch-best", name, "--dest", str(tmp_path / "with"), "--json", "--with-optimizer")
        assert code == 0, err
        assert sorted(json.loads(out)["files"]) == sorted([*files, "optim_000010_rank0.pt"])

    code, out, err = cli(capsys, "tail", name, "--no-follow")
    assert code == 0 and f"loss {losses[-1][1]:.4f}"[:9] in out, out


def test_json_rows_from_gpucli_metrics_and_no_checkpoint(capsys, tmp_path):
    code, out, err = launch_own(capsys, tmp_path, "jsonfile", "own-json", "--provider", "local")
    assert code == 0, err
    rows = finished_rows(capsys, "own-json")
    assert train_losses(rows) == [(s, 2.0 / s) for s in range(1, 6)]
    assert [r["val_loss"] for r in rows if r.get("kind") == "val"] == [0.7]
    code, out, err = cli(capsys, "fetch-best", "own-json", "--dest", str(tmp_path / "f"))
    assert code != 0 and "no checkpoint" in err and "Traceback" not in err


def test_failing_command_is_failed_with_its_last_lines(capsys, tmp_path):
    code, out, err = launch_own(capsys, tmp_path, "failing", "own-fail", "--provider", "local")
    assert code == 0, err  # the command fails after the launch returned
    finished_rows(capsys, "own-fail")
    st = status_json(capsys, "own-fail")
    assert st["state"] == "failed" and st["story"] == "failed (exit 1: RuntimeError: CUDA out of memory (pretend))"
    assert any("CUDA out of memory (pretend)" in line for line in st["log_tail"])
    assert runs.load("own-fail").status == "failed"
    code, out, err = cli(capsys, "status", "own-fail")
    assert "CUDA out of memory (pretend)" in out


def test_failing_setup_ends_the_launch_with_its_last_lines(capsys, tmp_path):
    code, out, err = launch_own(capsys, tmp_path, "nanochat", "own-setup", "--provider", "local",
                                "--setup", "echo fetching wheels; echo 'No matching distribution for torch==9' >&2; exit 4")
    assert code != 0
    assert "setup failed (exit 4)" in err and "No matching distribution for torch==9" in err and "Traceback" not in err
    record = runs.load("own-setup")
    assert record.status == "failed"
    # the job never ran, and nothing of it is left running
    wd = Path(record.workdir)
    assert not any((wd / "code" / "checkpoints").iterdir())
    assert wait_for(lambda: not _alive(record.pid) and not _alive(record.watchdog_pid), 20, "processes to end")


def test_setup_runs_once_then_the_command(capsys, tmp_path):
    code, out, err = launch_own(capsys, tmp_path, "nanochat", "own-setup-ok", "--provider", "local",
                                "--setup", "echo setup-ran >> setup.log")
    assert code == 0, err
    rows = finished_rows(capsys, "own-setup-ok")
    assert any(r.get("event") == "setup_done" for r in rows)
    wd = Path(runs.load("own-setup-ok").workdir)
    assert (wd / "code" / "setup.log").read_text() == "setup-ran\n"
    assert "[gpucli] setup: echo setup-ran" in (wd / "train.log").read_text()  # its output is in the run's log


def test_task_file_with_cli_override_and_dry_run(capsys, tmp_path):
    code, cmd = code_dir(tmp_path, "nanochat")
    (code / "task.yaml").write_text(f"run: {cmd}\nname: from-file\ncheckpoints: out/\nenv: {{MY_SETTING: 7}}\n"
                                    "limits: {hours: 2}\n")
    code_rc, out, err = cli(capsys, "launch", str(code / "task.yaml"), "--name", "from-cli", "--dry-run")
    assert code_rc == 0, err
    assert "from-cli" in out and "checkpoints: out/" in out and "MY_SETTING" in out and "Dry run" in out
    assert "run.yaml" not in out and "model tiny" not in out and "steps of" not in out  # the trainer's, not this
    assert not (runs.runs_dir() / "from-cli.json").exists()
    code_rc, out, err = cli(capsys, "launch", str(code / "task.yaml"), "--name", "from-cli")
    assert code_rc == 0, err
    finished_rows(capsys, "from-cli")
    record = runs.load("from-cli")
    wd = Path(record.workdir)
    assert sorted(p.name for p in (wd / "code" / "out").iterdir())[:2] == ["meta_000005.json", "meta_000010.json"]
    assert "MY_SETTING=7" in (wd / "env").read_text()  # the task's env reaches the job through the env file
    assert record.limits.max_hours == 2 and record.launch["own"]["run"] == cmd
    assert fetch_best(capsys, "from-cli", tmp_path / "f")["checkpoint"] == "step_10"


@pytest.mark.parametrize("args, needle", [
    (["--code", "."], "--code needs --run"),
    (["--setup", "x", "--profile", "cpu"], "go with --run"),
    (["--run", "true", "--budget", "nan"], "--budget"),
    (["--run", "true", "--code", "git+https://user:pw@github.com/o/r"], "no credentials"),
    (["--run", "true", "--code", "/no/such/dir"], "not a folder"),
    (["--run", "true", "--grace", "500"], "below the watchdog"),
])
def test_bad_input_is_one_line(capsys, args, needle):
    code, out, err = cli(capsys, "launch", *args, "--dry-run")
    assert code != 0 and needle in err and "Traceback" not in err, err


def _alive(pid: int | None) -> bool:
    import os

    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return json.dumps(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != '"Z"'
    except OSError:
        return False


def test_rows_of_own_run_are_plain_json(capsys, tmp_path):
    code, out, err = launch_own(capsys, tmp_path, "nanochat", "own-rows", "--provider", "local")
    assert code == 0, err
    rows = finished_rows(capsys, "own-rows")
    vals = [r for r in rows if r.get("kind") == "val"]
    assert [(r["step"], r["val_bpb"]) for r in vals] == [(5, 1.1), (10, 0.8), (15, 0.9), (20, 0.95)]
    st = status_json(capsys, "own-rows")
    assert st["val_loss"] == 0.95 and st["best_val_loss"] == 0.8  # bpb shown where no loss is logged
    assert rows_of(capsys, "own-rows") == rows


def test_telegram_from_the_pod(capsys, tmp_path, telegram_emulator):
    emu = telegram_emulator
    code, out, err = launch_own(capsys, tmp_path, "failing", "own-tg", "--provider", "local")
    assert code == 0, err
    finished_rows(capsys, "own-tg")
    assert emu.wait_for(lambda e: len(e.messages) >= 2, timeout=20)
    texts = emu.texts()
    assert any("own-tg" in t and "started" in t for t in texts)
    assert any("exit 1: RuntimeError: CUDA out of memory (pretend)" in t for t in texts), texts
    record_text = (runs.runs_dir() / "own-tg.json").read_text()
    assert "placeholder-bot-token" not in record_text
    assert "placeholder-bot-token" not in (Path(runs.load("own-tg").workdir) / "console.log").read_text()


def test_watch_ends_on_a_failed_job_instead_of_resuming_it(capsys, tmp_path):
    from gpucli.plan.catalog import load_catalog
    from gpucli.run.life import lifecycle

    code, out, err = launch_own(capsys, tmp_path, "failing", "own-watch", "--provider", "local")
    assert code == 0, err
    finished_rows(capsys, "own-watch")
    how = lifecycle.watch("own-watch", load_catalog(), mirror=True, recover=True, poll_s=0.2, sleep=lambda s: None)
    assert how == "ended" and runs.load("own-watch").status == "failed"
    assert runs.load("own-watch").end_reason == "exit 1: RuntimeError: CUDA out of memory (pretend)"


def test_down_says_stopped_by_you_and_no_emergency_checkpoint(capsys, tmp_path):
    code, out, err = launch_own(capsys, tmp_path, "graceful", "own-down", "--provider", "local")
    assert code == 0, err
    wait_for(lambda: len(train_losses(rows_of(capsys, "own-down"))) >= 3, 60, "rows")
    code, out, err = cli(capsys, "down", "own-down")
    assert code == 0, err
    assert "job stopped" in out + err and "emergency checkpoint" not in out + err  # the trainer's words
    finished_rows(capsys, "own-down")
    assert status_json(capsys, "own-down")["story"] == "stopped by you"


def test_the_job_runs_in_a_venv_of_its_own_reused_by_its_code_folder(capsys, tmp_path):
    import sys

    code = tmp_path / "venvcode"
    code.mkdir()
    probe = "import os, sys; print(sys.prefix, os.environ.get('VIRTUAL_ENV'), flush=True)"
    prefixes = []
    for name in ("own-venv-1", "own-venv-2"):
        rc, out, err = cli(capsys, "launch", "--code", str(code), "--run", f"python -c \"{probe}\"", "--name", name,
                           "--provider", "local")
        assert rc == 0, err
        finished_rows(capsys, name)
        log = (Path(runs.load(name).workdir) / "train.log").read_text()
        prefix, venv = log.strip().splitlines()[-1].split()
        prefixes.append(prefix)
        assert prefix == venv and Path(prefix).parent.name == ".venvs" and prefix != sys.prefix
    assert prefixes[0] == prefixes[1]  # one per code folder, reused
