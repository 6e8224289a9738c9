"""scripts/bench_sync.py --small runs end to end (its numbers are for BENCHMARKS.md, not asserted)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_sync.py"


@pytest.mark.skipif(shutil.which("rsync") is None or shutil.which("scp") is None, reason="needs rsync and scp")
def test_bench_sync_small_smoke(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--small", "--runs", "1", "--scratch", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    table = out.stdout
    for case in ("64 MiB file up", "64 MiB file down", "1000 files up", "no-op re-sync of 1000 files"):
        assert f"| {case}" in table
    assert "| gpucli |" in table and "| rsync |" in table and "| scp |" in table


@pytest.mark.skipif(shutil.which("rsync") is None or shutil.which("scp") is None, reason="needs rsync and scp")
def test_bench_sync_wan_mode_smoke(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--rtt-ms", "20", "--rate-mbs", "100", "--big-mib", "4",
                          "--files", "30", "--runs", "1", "--only", "up,down", "--scratch", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| 20 ms |")]
    assert len(rows) == 6, out.stdout  # up and down, three tools each
    assert all(line.split("|")[7].strip().endswith("%") for line in rows)  # share of the link
