"""CPU smoke tests of scripts/bench_trainer.py (the GPU figures are measured on an H100, not here)."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from tests.trainer.conftest import REPO, trainer_env

BENCH = str(REPO / "scripts" / "bench_trainer.py")


def test_bench_tiny_on_cpu_runs_both_architectures_and_appends_calibration(tmp_path):
    cal = tmp_path / "calibration.yaml"
    cmd = [sys.executable, BENCH, "--shape", "tiny", "--device", "cpu", "--warmup", "1", "--steps", "2", "--json",
           "--write-calibration", str(cal)]
    for _ in range(2):
        r = subprocess.run(cmd, cwd=tmp_path, env=trainer_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["arch"], x["optimizer"]) for x in rows] == [("gpt2", "adamw"), ("modern", "muon")]
    assert all(x["shape"] == "tiny" and x["tokens_per_s"] > 0 and x["ms_per_step"] > 0 for x in rows)
    assert rows[0]["mfu"] is None  # CPU: no peak, so no MFU guess
    entries = yaml.safe_load(cal.read_text())
    assert len(entries) == 4
    e, m = entries[0], entries[1]
    assert e["gpu"] == "cpu" and e["gpu_count"] == 1 and e["model"]["n_layers"] == 2 and e["seq_len"] == 64
    assert m["model"]["name"] == "tiny-modern" and m["model"]["pos_embedding"] == "rope" and m["optimizer"] == "muon"
    assert {"micro_batch", "precision", "compile", "tokens_per_s", "mfu", "peak_mem_gib", "date",
            "trainer_version", "source"} <= set(e)
    r = subprocess.run([*cmd[:-2], "--fp8"], cwd=tmp_path, env=trainer_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: hardware.fp8 needs a CUDA GPU") and r.stdout == ""


def test_bench_tokens_to_quality_writes_both_curves(tmp_path, data_dir):
    curves, md = tmp_path / "q.json", tmp_path / "q.md"
    r = subprocess.run([sys.executable, BENCH, "--quality", "--shape", "tiny", "--device", "cpu", "--tokens", "5120",
                        "--eval-every", "10", "--eval-batches", "2", "--data-dir", str(data_dir),
                        "--curves", str(curves), "--markdown", str(md)],
                       cwd=tmp_path, env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    result = json.loads(curves.read_text())
    base, new = result["curves"]
    assert (base["arch"], base["optimizer"], new["arch"], new["optimizer"]) == ("gpt2", "adamw", "modern", "muon")
    assert [p["tokens"] for p in base["points"]] == [p["tokens"] for p in new["points"]] == [0, 2560, 5120]
    assert all(c["points"][-1]["val_loss"] < c["points"][0]["val_loss"] for c in (base, new))
    s = result["summary"]
    assert s["gpt2_final_val_loss"] == base["points"][-1]["val_loss"] and json.loads(r.stdout) == s
    assert "| tokens | GPT-2 + AdamW val loss | modern + muon val loss |" in md.read_text()
