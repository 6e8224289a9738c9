"""trainer/preflight.py on the CPU as gpucli runs it on a host: one process and two (torchrun, gloo), a
configuration that cannot run, a deadline that passes, and the arch check against torch's own lists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO, tiny_args, trainer_env
from trainer.preflight import arch_verdict


def run_preflight(out: Path, args: list[str], nproc: int = 1, timeout: float = 600) -> subprocess.CompletedProcess:
    head = [sys.executable, "-m", "trainer.preflight"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "trainer.preflight"]
    return subprocess.run([*head, "--out", str(out), *args], cwd=REPO, env=trainer_env(), capture_output=True,
                          text=True, timeout=timeout)


def result(out: Path, rank: int = 0) -> dict:
    return json.loads((out / f"result_rank{rank}.json").read_text())


@pytest.mark.parametrize(("cap", "archs", "ok"), [
    ((9, 0), ["sm_80", "sm_86", "sm_90"], True),  # H100 on a cu12x build
    ((8, 6), ["sm_80", "sm_90"], True),  # sm_80 cubins run on an sm_86 card (same major)
    ((10, 0), ["sm_50", "sm_80", "sm_86", "sm_90"], False),  # B200 on a CUDA 12.4 build: no kernel image
    ((12, 0), ["sm_80", "sm_90", "sm_100"], False),  # an RTX 5090 needs sm_120 itself
    ((12, 0), ["sm_90", "compute_90"], True),  # PTX compiled when it loads
    ((8, 0), ["sm_86", "sm_90"], False),  # a newer minor does not run on an older one
])
def test_arch_verdict(cap, archs, ok):
    assert arch_verdict(cap, archs)[0] is ok


def test_one_process_measures_and_leaves_no_checkpoint(data_dir, tmp_path):
    out = tmp_path / "preflight"
    r = run_preflight(out, tiny_args(data_dir, tmp_path / "run", **{"training.grad_accum_steps": 1}))
    assert r.returncode == 0, r.stderr[-3000:]
    res = result(out)
    assert res["ok"] and res["device"] == "cpu" and res["arch_ok"] is None
    assert res["steps"] == 3 and res["tokens_per_s"] > 0 and res["peak_mem_gib"] > 0 and res["micro_batch"] == 4
    assert res["matmul_tflops"] > 0 and "matmul_share" not in res and "allreduce_busbw_gbps" not in res
    assert res["disk_write_mb_s"] > 0 and res["model_shape"]["d_model"] == 64
    assert not (tmp_path / "run").exists()  # the run's folder (its checkpoints) untouched
    assert not list(out.rglob("model.pt"))


def test_two_processes_measure_the_all_reduce(data_dir, tmp_path):
    out = tmp_path / "preflight"
    r = run_preflight(out, tiny_args(data_dir, tmp_path / "run"), nproc=2)
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in (0, 1):
        res = result(out, rank)
        assert res["ok"] and res["world"] == 2 and res["allreduce_backend"] == "gloo"
        assert res["allreduce_busbw_gbps"] > 0


def test_a_configuration_that_cannot_run_is_one_line(data_dir, tmp_path):
    out = tmp_path / "preflight"
    r = run_preflight(out, tiny_args(data_dir, tmp_path / "run", **{"training.seq_len": 100000}))
    assert r.returncode == 2
    res = result(out)
    assert not res["ok"] and "max_seq_len" in res["error"] and "\n" not in res["error"] and res["fix"]


def test_the_deadline_ends_it_with_a_verdict(data_dir, tmp_path):
    out = tmp_path / "preflight"
    r = run_preflight(out, [*tiny_args(data_dir, tmp_path / "run"), "--deadline-s", "0.05"])
    assert r.returncode == 124
    res = result(out)
    assert not res["ok"] and res["error"].startswith("did not finish in 0.05 s")


def test_out_of_memory_says_what_to_change():
    import torch

    from trainer.preflight import oom_fix
    from trainer.spec.load import load_config

    cfg = load_config(None, ["--model.preset=tiny", "--training.batch_size=16", "--training.grad_accum_steps=2",
                             "--training.seq_len=128", "--training.max_steps=10"])
    error, fix = oom_fix(cfg, torch.device("cpu"))
    assert error == "CUDA out of memory at micro-batch 16 (seq 128) on this machine"
    assert fix.startswith("try --set training.batch_size=8 --set training.grad_accum_steps=4")
    one = load_config(None, ["--model.preset=tiny", "--training.batch_size=1", "--training.max_steps=10"])
    assert "hardware.fsdp=on" in oom_fix(one, torch.device("cpu"))[1]
