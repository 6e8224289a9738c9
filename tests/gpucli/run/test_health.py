"""The preflight's record (gpucli/runs/health.py) and the bars per GPU family (gpucli/profiles/health.yaml)."""

from __future__ import annotations

import pytest

from gpucli.errors import CatalogError
from gpucli.plan.catalog import load_catalog
from gpucli.run.preflight import calibration_entry
from gpucli.runs import records as runs
from gpucli.runs.health import Preflight, thresholds


def test_every_catalogue_family_has_a_bar_between_0_and_1():
    for gpu in load_catalog().gpus.values():
        bar = thresholds(gpu.architecture)
        assert bar.family == gpu.architecture and 0 < bar.min_matmul_share < 1
    assert thresholds("Volta").family == "default" and thresholds(None).family == "default"


def test_a_bad_bar_is_one_line(tmp_path):
    path = tmp_path / "health.yaml"
    path.write_text("default: {min_matmul_share: 0.4}\nfamilies: {Hopper: {min_matmul_share: 2}}\n")
    with pytest.raises(CatalogError, match="Hopper.min_matmul_share"):
        thresholds("Hopper", path)


def test_a_pods_result_is_read_field_by_field():
    pf = Preflight.from_json({"ok": True, "tokens_per_s": "fast", "peak_mem_gib": 3, "steps": 3.5, "fp8": "yes",
                              "gpu_name": "NVIDIA H100 80GB HBM3", "matmul_tflops": float("nan"),
                              "model_shape": {"d_model": 64, "x": "y"}, "unknown": 1})
    assert pf.ok and pf.tokens_per_s is None and pf.peak_mem_gib == 3.0 and pf.steps is None and pf.fp8 is None
    assert pf.matmul_tflops is None and pf.model_shape == {"d_model": 64} and pf.gpu_name == "NVIDIA H100 80GB HBM3"
    assert not Preflight.from_json(["not", "a", "result"]).ok


def test_the_record_keeps_it():
    pf = Preflight(ok=True, device="cuda", gpu_name="NVIDIA H100 80GB HBM3", tokens_per_s=1e5, peak_mem_gib=40.0,
                   matmul_tflops=700.0, peak_tflops=989.5, matmul_share=0.707, steps=3)
    record = runs.RunRecord(name="pf", provider="local", created_at=runs.now_iso(), profile="h100", phase="fast",
                            model="124m", n_gpus=1, gpu="h100", workdir="/tmp/x", preflight=pf)
    runs.save(record)
    assert runs.load("pf").preflight == pf
    assert "71% of 989.5" in pf.line
    runs.save(record.with_(preflight=None))
    assert "preflight" not in (runs.runs_dir() / "pf.json").read_text()


def test_a_gpu_calibration_entry_names_the_gpu_the_catalogue_knows():
    record = runs.RunRecord(name="pf", provider="runpod", created_at=runs.now_iso(), profile="h100", phase="fast",
                            model="124m", n_gpus=1, gpu="h100", workdir="/w")
    shape = {"d_model": 768, "n_layers": 12, "n_heads": 12, "d_ff": 3072, "vocab_size": 50304}
    pf = Preflight(ok=True, device="cuda", gpu_name="NVIDIA H100 80GB HBM3", tokens_per_s=4e5, peak_mem_gib=30.0,
                   steps=3, world=1, seq_len=1024, micro_batch=16, compile="blocks", model_shape=shape, mfu=0.4)
    entry = calibration_entry(record, pf)
    assert entry is not None and entry["gpu"] == "h100-sxm" and entry["compile"] is True
    assert entry["precision"] == "bf16" and entry["tokens_per_s"] == 4e5
    unknown = Preflight(**{**pf.to_json(), "gpu_name": "NVIDIA Something New"})
    assert calibration_entry(record, unknown) is None  # never a file the planner would refuse


def test_nvidia_smi_is_held_to_the_rent_and_the_bars():
    from gpucli.runs.health import smi_check

    bars = thresholds("Ampere")
    healthy = "NVIDIA A100-SXM4-80GB, 0, Not Active\n" * 8
    ok = smi_check(healthy, rented="A100 80GB", rented_count=8, same_model=True, bars=bars)
    assert ok.ok and ok.smi_gpus == 8 and ok.ecc_uncorrected == 0 and ok.hw_slowdown == 0
    assert "nvidia-smi 8x NVIDIA A100-SXM4-80GB, 0 ECC errors" in Preflight(ok=True, smi_gpus=8, smi_gpu=ok.smi_gpu,
                                                                          ecc_uncorrected=0).line
    short = smi_check("NVIDIA A100-SXM4-80GB, 0, Not Active\n" * 7, rented="A100 80GB", rented_count=8, same_model=True, bars=bars)
    assert not short.ok and short.stage == "smi" and "lists 7 GPUs, 8 were rented" in (short.error or "")
    ecc = smi_check(healthy.replace(", 0,", ", 2,", 1), rented="A100 80GB", rented_count=8, same_model=True, bars=bars)
    assert not ecc.ok and "2 uncorrected ECC errors" in (ecc.error or "")
    slow = smi_check(healthy.replace("Not Active", "Active", 1), rented="A100 80GB", rented_count=8, same_model=True,
                     bars=bars)
    assert not slow.ok and "hardware slowdown" in (slow.error or "")
    other = smi_check(healthy, rented="H100 SXM", rented_count=8, same_model=False, bars=bars)
    assert not other.ok and "H100 SXM was rented" in (other.error or "")
    no_ecc = smi_check("NVIDIA GeForce RTX 4090, [N/A], Not Active\n", rented="RTX 4090", rented_count=1,
                       same_model=True, bars=thresholds("Ada Lovelace"))
    assert no_ecc.ok and no_ecc.ecc_uncorrected == 0
