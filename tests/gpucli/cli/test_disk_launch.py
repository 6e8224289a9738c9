"""launch --dry-run's checkpoint and disk lines: the run's own config through gpucli.plan.disk, and a
disk too small refused before anything is searched or rented."""

from __future__ import annotations

import json

import pytest

from gpucli.plan.disk import checkpoint_disk
from tests.support.cli import cli
from trainer.spec.resolve import resolve_shape

# The demo corpus is read with the byte tokenizer (257 ids): the trainer sizes the preset's embedding
# and head for it (trainer.spec.resolve), and the launch plans that model.
BYTE_1B = resolve_shape("1b", data_vocab_size=257)


def _dry(capsys, *args: str) -> tuple[int, dict, str]:
    code, out, err = cli(capsys, "launch", "--dry-run", "--json", *args)
    return code, (json.loads(out) if code == 0 else {}), err


def test_dry_run_states_the_checkpoints_of_the_runs_own_config(capsys):
    # 8x A100 with Muon, keep_last 1: the numbers are checkpoint_disk's for that very config.
    code, data, err = _dry(capsys, "--provider", "runpod", "--profile", "8xA100", "--model", "1b", "--disk", "200",
                           "--set", "training.keep_last=1", "--set", "training.optimizer=muon",
                           "--set", "hardware.fsdp=on")
    assert code == 0, err
    want = checkpoint_disk(BYTE_1B, keep_last=1, optimizer="muon", n_gpus=8, sharded=True)
    d = data["disk"]
    assert d["weights_gb"] == pytest.approx(want.weights_gb) and d["optimizer_gb"] == pytest.approx(want.optimizer_gb)
    assert d["per_rank_optimizer_gb"] == pytest.approx(want.optimizer_gb / 8)
    assert d["checkpoints_at_once"] == 3 and d["checkpoints_gb"] == pytest.approx(want.disk_gb)
    assert d["have_gb"] == 200 and d["where"] == "--disk 200 GB" and d["fits"] is True
    assert d["need_gb"] == pytest.approx(want.disk_gb + d["data_gb"] + d["headroom_gb"])

    # The text lines say the same.
    code, out, _ = cli(capsys, "launch", "--dry-run", "--provider", "runpod", "--profile", "8xA100", "--model", "1b",
                       "--disk", "200", "--set", "training.keep_last=1")
    adam = checkpoint_disk(BYTE_1B, keep_last=1, n_gpus=8)
    assert code == 0
    assert f"checkpoints: {adam.checkpoint_gb:.1f} GB each (weights {adam.weights_gb:.1f} GB + optimizer " \
           f"{adam.optimizer_gb:.1f} GB" in out
    assert f"= 3 at once = {adam.disk_gb:.1f} GB" in out and "--disk 200 GB: fits" in out


def test_a_disk_too_small_is_one_line_with_the_fix(capsys):
    # Each checkpoint holds the weights twice (model.pt and model.safetensors): 19.4 GB for 1.31b.
    code, _, err = cli(capsys, "launch", "--dry-run", "--provider", "runpod", "--profile", "h100", "--model", "1.31b",
                       "--disk", "80")
    assert code == 2 and "Traceback" not in err
    assert "--disk 80 GB cannot hold this run: 5 checkpoints of 19.4 GB" in err
    assert "pass --disk 104" in err and "--set training.keep_last=1 fits" in err
    # the fix it names works
    code, _, err = cli(capsys, "launch", "--dry-run", "--provider", "runpod", "--profile", "h100", "--model", "1.31b",
                       "--disk", "80", "--set", "training.keep_last=1")
    assert code == 0, err


def test_local_runs_check_this_machines_free_space(capsys, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**12, 10**12 - 200_000_000, 200_000_000))
    code, _, err = cli(capsys, "launch", "--dry-run", "--provider", "local", "--profile", "cpu",
                       "--workdir", str(tmp_path / "runs" / "x"))
    assert code == 2 and f"free space on {tmp_path}" in err and "cannot hold this run" in err


def test_own_code_has_no_checkpoint_model(capsys, tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    code, out, err = cli(capsys, "launch", "--dry-run", "--provider", "runpod", "--profile", "h100", "--disk", "1",
                         "--code", str(tmp_path), "--run", "python train.py")
    assert code == 0, err
    # No checkpoint size model without a size (--model or --params); the task's own line that says where its
    # checkpoints go ("checkpoints: checkpoints/") is not one.
    assert "each (weights" not in out and "keep_last" not in out and "disk:" not in out
    assert "checkpoints: checkpoints/" in out


def test_dry_run_with_on_end_stop_says_what_can_lose_the_kept_disk(capsys):
    code, data, err = _dry(capsys, "--provider", "runpod", "--profile", "rtx4090", "--on-end", "stop")
    assert code == 0, err
    (note,) = data["on_end_notes"]
    assert data["on_end"] == "stop" and "host-local" in note and "$0 account balance" in note and "fetch-best" in note
    code, data, err = _dry(capsys, "--provider", "vast", "--profile", "rtx4090", "--on-end", "stop")
    assert code == 0, err
    assert "for deletion" in data["on_end_notes"][0]
    code, data, err = _dry(capsys, "--provider", "runpod", "--profile", "rtx4090", "--on-end", "terminate")
    assert code == 0, err
    assert data["on_end_notes"] == []
