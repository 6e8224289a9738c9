"""GPU use from nvidia-smi: the pod-side sampler parsing the outputs of several GPU models, its rows
shown by ``gpucli status`` over a real sshd, and the idle warning (by the pod's clock)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from gpucli.pod import gpustats
from gpucli.run.watch.gpuwatch import IDLE_WINDOW_S, parse_rows, report
from tests.support.cli import cli

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"


def _parse(name: str) -> list[dict]:
    return gpustats.parse_csv((FIXTURES / name).read_text())


def test_parse_h100_8x():
    gpus = _parse("h100_8x.csv")
    assert [g["index"] for g in gpus] == list(range(8))
    g = gpus[0]
    assert g == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "util": 98.0, "mem_used_mib": 71234.0,
                 "mem_total_mib": 81559.0, "power_w": 652.31, "power_limit_w": 700.0, "temp_c": 67.0}


@pytest.mark.parametrize("name, n, first", [
    ("a100_sxm4_80gb_idle.csv", 2, {"name": "NVIDIA A100-SXM4-80GB", "util": 0.0, "mem_total_mib": 81920.0,
                                    "power_w": 61.27, "power_limit_w": 400.0}),
    ("rtx4090_na_power.csv", 1, {"name": "NVIDIA GeForce RTX 4090", "util": 100.0, "power_w": None,
                                 "power_limit_w": None, "mem_total_mib": 24564.0}),
    ("l40s.csv", 2, {"name": "NVIDIA L40S", "util": 87.0, "mem_used_mib": 40122.0, "power_w": 301.44}),
    ("h100_mig_not_supported.csv", 1, {"util": None, "mem_used_mib": 13.0, "power_w": 72.18}),
])
def test_parse_models_and_missing_fields(name, n, first):
    gpus = _parse(name)
    assert len(gpus) == n
    assert {k: gpus[0][k] for k in first} == first


def test_noheader_nounits_and_garbage():
    text = "0, NVIDIA H100 80GB HBM3, 55, 1000, 81559, 300.5, 700.00, 40\nnot a line\n1, x, inf, nan, , , , \n"
    gpus = gpustats.parse_csv(text)
    assert gpus[0]["util"] == 55.0 and gpus[0]["power_w"] == 300.5
    assert gpus[1]["util"] is None and gpus[1]["mem_used_mib"] is None


def _fake_smi(tmp_path: Path, fixture: str) -> Path:
    exe = tmp_path / "bin" / "nvidia-smi"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text(f"#!/bin/sh\ncat {FIXTURES / fixture}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_sampler_rows_shown_by_status(capsys, tmp_path, ssh_run):
    wd = Path(ssh_run.workdir)
    out = wd / "gpu.jsonl"
    rc = gpustats.main(["--out", str(out), "--pid", str(os.getpid()), "--interval", "0.05", "--max-samples", "2",
                        "--nvidia-smi", str(_fake_smi(tmp_path, "h100_8x.csv"))])
    assert rc == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and len(rows[-1]["gpus"]) == 8
    code, text, err = cli(capsys, "status", "r1")
    assert code == 0, err
    assert "GPU 0 NVIDIA H100 80GB HBM3: util 98%, mem 69.6/80 GiB, power 652/700 W, 67 C" in text
    assert "GPU 7 " in text and "its clock" in text
    assert "idle" not in (text + err).lower()
    code, text, err = cli(capsys, "status", "r1", "--json")
    data = json.loads(text)
    assert data["gpus"]["gpus"][2]["util"] == 99.0 and data["gpus"]["idle_s"] is None


def test_idle_gpus_warn_in_status(capsys, tmp_path, ssh_run):
    idle = gpustats.parse_csv((FIXTURES / "a100_sxm4_80gb_idle.csv").read_text())
    t0 = 1_700_000_000.0  # the pod's clock: only differences between its own samples count
    rows = [{"t": t0 + 10 * i, "gpus": idle} for i in range(37)]  # six minutes under 20 %
    (Path(ssh_run.workdir) / "gpu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, text, err = cli(capsys, "status", "r1")
    assert code == 0, err
    assert "GPUs idle: under 20% for 6 min" in err


def test_idle_needs_five_minutes_all_under_the_threshold():
    idle = gpustats.parse_csv((FIXTURES / "a100_sxm4_80gb_idle.csv").read_text())
    busy = gpustats.parse_csv((FIXTURES / "l40s.csv").read_text())
    rows = [{"t": float(10 * i), "gpus": idle} for i in range(40)]
    assert report(rows).idle_warning is not None and report(rows).idle_s == 390
    assert report(rows[:25]).idle_warning is None  # four minutes
    rows[-20] = {"t": rows[-20]["t"], "gpus": busy}  # busy 3 minutes ago: idle since then only
    assert report(rows).idle_warning is None
    assert report([{"t": float(10 * i), "gpus": idle} for i in range(40)], running=False).idle_warning is None
    mig = gpustats.parse_csv((FIXTURES / "h100_mig_not_supported.csv").read_text())
    assert report([{"t": float(10 * i), "gpus": mig} for i in range(40)]).idle_s is None  # no utilisation: no verdict
    assert IDLE_WINDOW_S == 300


def test_no_nvidia_smi_is_said_once(capsys, tmp_path, ssh_run):
    out = Path(ssh_run.workdir) / "gpu.jsonl"
    gpustats.main(["--out", str(out), "--pid", str(os.getpid()), "--nvidia-smi", str(tmp_path / "nope")])
    code, text, err = cli(capsys, "status", "r1")
    assert code == 0, err
    assert "GPUs: not sampled" in text and "not found" in text


def test_the_file_stays_bounded(tmp_path):
    out = tmp_path / "gpu.jsonl"
    rc = gpustats.main(["--out", str(out), "--pid", str(os.getpid()), "--interval", "0", "--max-samples", "60",
                        "--max-bytes", "20000", "--nvidia-smi", str(_fake_smi(tmp_path, "h100_8x.csv"))])
    assert rc == 0 and out.stat().st_size <= 20000
    rows = parse_rows(out.read_bytes())
    assert rows and all(len(r["gpus"]) == 8 for r in rows)


def test_sampler_is_standard_library_only():
    import ast

    tree = ast.parse(Path(gpustats.__file__).read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods <= set(sys.stdlib_module_names) | {"__future__"}, mods


def test_a_gpu_launch_starts_the_sampler_beside_own_code(capsys, tmp_path, sshd, client_key, monkeypatch):
    from tests.support.cli import wait_for

    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "0.25")
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "job.py").write_text("import time\nprint('step 1: loss 2.0', flush=True)\ntime.sleep(3)\n")
    wd = tmp_path / "pod" / "gpujob"
    code, out, err = cli(capsys, "launch", "--code", str(code_dir), "--run", f"{sys.executable} job.py", "--name",
                         "gpujob", "--profile", "h100", "--provider", "ssh", "--host",
                         f"{sshd.user}@127.0.0.1:{sshd.port}", "--identity", str(client_key[0]), "--python",
                         sys.executable, "--workdir", str(wd))
    assert code == 0, err
    assert "GPU sampler started" in out + err
    # this machine has no nvidia-smi: the sampler says so once, and status shows it
    wait_for(lambda: (wd / "gpu.jsonl").exists(), 30, "the sampler's first row")
    code, text, err = cli(capsys, "status", "gpujob")
    assert code == 0, err
    assert "GPUs: not sampled (nvidia-smi not found on this host)" in text


def test_tail_once_shows_the_gpus(capsys, tmp_path, ssh_run):
    wd = Path(ssh_run.workdir)
    gpustats.main(["--out", str(wd / "gpu.jsonl"), "--pid", str(os.getpid()), "--interval", "0", "--max-samples",
                   "1", "--nvidia-smi", str(_fake_smi(tmp_path, "l40s.csv"))])
    (wd / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "loss": 2.5, "time": 1.0}) + "\n")
    code, text, err = cli(capsys, "tail", "r1", "--no-follow")
    assert code == 0, err
    assert "GPU 1 NVIDIA L40S: util 85%, mem 39.2/45 GiB, power 298/350 W, 57 C" in text
