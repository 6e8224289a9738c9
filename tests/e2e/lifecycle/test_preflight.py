"""The preflight through `gpucli launch --provider local`: the real trainer's preflight (trainer/preflight.py)
on this machine's CPU before the run is detached, your own --preflight command, and their failures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from gpucli.runs import records as runs
from gpucli.settings import home
from tests.support.cli import FAST_TRAINER, cli, rows_of, wait_for

FAST = ["--set", "data.max_bytes=200000", *FAST_TRAINER]


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("Error:")]


def test_preflight_passes_and_its_figures_land_in_record_status_and_calibration(capsys):
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--name", "pf-ok", *FAST)
    assert code == 0, err
    assert "preflight passed: no GPU (CPU)" in err + out
    pf = runs.load("pf-ok").preflight
    assert pf is not None and pf.ok and pf.device == "cpu" and pf.arch is None  # no GPU: no arch to hold it to
    assert pf.steps == 3 and pf.tokens_per_s and pf.tokens_per_s > 0 and pf.peak_mem_gib and pf.peak_mem_gib > 0
    assert pf.micro_batch == 4 and pf.seq_len == 64 and pf.disk_write_mb_s and pf.matmul_dtype == "float32"
    assert pf.peak_tflops is None and pf.matmul_share is None  # a CPU is measured, not held to a GPU's peak
    # The preflight's folder is its own: the run's checkpoints are only the run's.
    workdir = Path(runs.load("pf-ok").workdir).expanduser()
    assert (workdir / "preflight" / "result_rank0.json").is_file()
    assert not (workdir / "preflight" / "checkpoints").exists() or not any((workdir / "preflight" / "checkpoints").iterdir())

    code, out, _ = cli(capsys, "status", "pf-ok", "--json")
    assert code == 0
    shown = json.loads(out)["preflight"]
    assert shown["ok"] is True and shown["tokens_per_s"] == pf.tokens_per_s and shown["peak_mem_gib"] == pf.peak_mem_gib
    code, out, _ = cli(capsys, "status", "pf-ok")
    assert code == 0 and "preflight" in out and "tok/s over 3 steps" in out

    entries = yaml.safe_load((home() / "calibration.yaml").read_text())
    assert entries[-1]["gpu"] == "cpu" and entries[-1]["tokens_per_s"] == pf.tokens_per_s
    assert entries[-1]["peak_mem_gib"] == pf.peak_mem_gib and entries[-1]["model"]["d_model"] == 64
    from gpucli.plan.catalog import clear_cache, load_catalog

    clear_cache()
    load_catalog()  # the appended entry leaves the planner's file readable

    # The run itself starts from step 0 (the preflight's steps are not its steps) and trains.
    rows = wait_for(lambda: (lambda r: r if sum(x.get("kind") == "train" for x in r) >= 2 else None)(
        rows_of(capsys, "pf-ok")), 150, "training rows")
    assert [r for r in rows if r.get("event") == "started"][0]["step"] == 0
    assert cli(capsys, "down", "pf-ok")[0] == 0


def test_a_configuration_that_cannot_run_fails_in_one_line_before_the_run(capsys):
    # FP8 on a machine without it: gpucli's checks before renting cannot know the machine; the preflight does.
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--name", "pf-bad", *FAST, "--set", "hardware.fp8=true")
    assert code == 1
    lines = error_lines(err)
    assert len(lines) == 1 and "preflight failed" in lines[0] and "fp8" in lines[0], err
    assert "Traceback" not in err + out
    record = runs.load("pf-bad")
    assert record.status == "failed" and record.pid is None  # never detached
    assert record.preflight is not None and not record.preflight.ok and record.preflight.stage == "steps"


def test_no_preflight_skips_it(capsys):
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--name", "pf-skip", "--no-preflight", *FAST)
    assert code == 0, err
    assert "preflight skipped" in err + out and runs.load("pf-skip").preflight is None
    assert cli(capsys, "down", "pf-skip")[0] == 0


def test_own_preflight_command(capsys, tmp_path):
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "train.py").write_text("print('step 1 loss 2.5', flush=True)\n")
    run = f"{sys.executable} train.py"
    code, out, err = cli(capsys, "launch", "--code", str(code_dir), "--run", run, "--name", "own-pf",
                         "--provider", "local", "--preflight", "echo checked > preflight-ran")
    assert code == 0, err
    pf = runs.load("own-pf").preflight
    assert pf is not None and pf.ok and pf.command == "echo checked > preflight-ran" and pf.exit_code == 0
    assert (Path(runs.load("own-pf").workdir).expanduser() / "code" / "preflight-ran").is_file()

    code, out, err = cli(capsys, "launch", "--code", str(code_dir), "--run", run, "--name", "own-pf-bad",
                         "--provider", "local", "--preflight", "exit 3")
    assert code == 1
    lines = error_lines(err)
    assert len(lines) == 1 and "preflight failed" in lines[0] and "`exit 3` exit 3" in lines[0], err
    record = runs.load("own-pf-bad")
    assert record.status == "failed" and record.preflight is not None and record.preflight.exit_code == 3
    # The job never ran its --run.
    rows = [json.loads(line) for line in (Path(record.workdir).expanduser() / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    assert not any(r.get("kind") == "train" for r in rows)


def test_preflight_flags_are_checked(capsys):
    code, _, err = cli(capsys, "launch", "--profile", "cpu", "--preflight", "true")
    assert code == 2 and "--preflight CMD goes with --run" in err
    code, _, err = cli(capsys, "launch", "--code", ".", "--run", "true", "--preflight", "true", "--no-preflight")
    assert code == 2 and "contradict" in err


def fake_nvidia_smi(tmp_path: Path, monkeypatch, answer: str) -> None:
    """This machine's nvidia-smi: one RTX 4090 (``-L``) whose ``--query-gpu`` answer is ``answer``."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "answer.csv").write_text(answer)
    script = tools / "nvidia-smi"
    script.write_text(f'#!/bin/sh\ncase "$*" in *--query-gpu=*) cat "{tools}/answer.csv";; '
                      '-L) echo "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-0)";; *) exit 9;; esac\n')
    script.chmod(0o755)
    import os

    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")


def test_a_machine_below_the_bars_is_refused_here_unless_forced(capsys, tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA GeForce RTX 4090, 4, Not Active\n")
    cpu = ["--set", "hardware.device=cpu", "--set", "hardware.compile=false", "--set", "hardware.mixed_precision=false"]
    code, out, err = cli(capsys, "launch", "--provider", "local", "--profile", "rtx4090", "--model", "tiny",
                         "--name", "pf-sick", *FAST, *cpu)
    assert code == 1
    lines = error_lines(err)
    assert len(lines) == 1 and "preflight failed (smi): 4 uncorrected ECC errors" in lines[0], err
    record = runs.load("pf-sick")
    assert record.status == "failed" and record.preflight is not None and record.preflight.ecc_uncorrected == 4

    code, out, err = cli(capsys, "launch", "--provider", "local", "--profile", "rtx4090", "--model", "tiny",
                         "--name", "pf-sick-forced", "--force", *FAST, *cpu)
    assert code == 0, err
    assert "below the health bars (smi: 4 uncorrected ECC errors (the bar: 0)); running anyway (--force)" in " ".join((err + out).split())
    pf = runs.load("pf-sick-forced").preflight
    assert pf is not None and pf.ok and pf.ecc_uncorrected == 4 and pf.smi_gpus == 1
    assert cli(capsys, "down", "pf-sick-forced")[0] == 0
