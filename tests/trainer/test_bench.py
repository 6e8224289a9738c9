"""CPU smoke test of scripts/bench_trainer.py (the GPU figures are measured on an H100, not here)."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from tests.trainer.conftest import REPO, trainer_env


def test_bench_tiny_on_cpu_prints_and_appends_calibration(tmp_path):
    cal = tmp_path / "calibration.yaml"
    cmd = [sys.executable, str(REPO / "scripts" / "bench_trainer.py"), "--shape", "tiny", "--device", "cpu",
           "--warmup", "1", "--steps", "2", "--json", "--write-calibration", str(cal)]
    for _ in range(2):
        r = subprocess.run(cmd, cwd=tmp_path, env=trainer_env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout.splitlines()[-1])
    assert row["shape"] == "tiny" and row["tokens_per_s"] > 0 and row["ms_per_step"] > 0
    assert row["mfu"] is None  # CPU: no peak, so no MFU guess
    entries = yaml.safe_load(cal.read_text())
    assert len(entries) == 2
    e = entries[0]
    assert e["gpu"] == "cpu" and e["gpu_count"] == 1 and e["model"]["n_layers"] == 2 and e["seq_len"] == 64
    assert {"micro_batch", "precision", "compile", "tokens_per_s", "mfu", "peak_mem_gib", "date",
            "trainer_version", "source"} <= set(e)
