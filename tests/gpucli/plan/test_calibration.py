"""Calibration entries replace the default MFU, nearest first, and say how far they reached."""

import datetime as dt
import shutil

import pytest
import yaml

from gpucli.plan.catalog import load_catalog
from gpucli.plan.estimate import count_params, modelled_mfu, train_flops_per_token
from gpucli.plan.planner import PlanRequest, make_plan
from gpucli.settings import PACKAGE_CATALOG

TODAY = dt.date(2026, 11, 22)


def catalog_with(tmp_path, entries):
    d = tmp_path / "cat"
    shutil.copytree(PACKAGE_CATALOG, d)
    (d / "calibration.yaml").write_text(yaml.safe_dump(entries, sort_keys=False))
    return load_catalog(d)


# What scripts/bench_trainer.py --write-calibration appends (device name as torch reports it).
BENCH_124M = {"gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1,
              "model": {"name": "124m", "d_model": 768, "n_layers": 12, "n_heads": 12, "d_ff": 3072,
                        "vocab_size": 50304, "params": 124_000_000},
              "seq_len": 1024, "micro_batch": 64, "precision": "bf16", "compile": True, "tokens_per_s": 632000.0,
              "mfu": 0.546, "peak_mem_gib": 30.0, "date": "2026-11-22", "trainer_version": "0.1.0",
              "source": "scripts/bench_trainer.py"}


def est(plan, label):
    return next(e for e in plan.estimates if e.setup.label == label)


def test_exact_entry_gives_the_measured_speed(tmp_path):
    cat = catalog_with(tmp_path, [BENCH_124M])
    plan = make_plan(cat, PlanRequest(model=cat.model("124m"), today=TODAY, gpus=("h100-sxm",), counts=(1,)))
    e = est(plan, "1x H100 SXM")
    assert e.tokens_per_s == 632000.0
    assert e.speed_source.startswith("measured: scripts/bench_trainer.py (2026-11-22): 124m on 1x H100 SXM")


def test_other_count_rescales_by_scaling_efficiency(tmp_path):
    cat = catalog_with(tmp_path, [BENCH_124M])
    plan = make_plan(cat, PlanRequest(model=cat.model("124m"), today=TODAY, gpus=("h100-sxm",), counts=(8,)))
    e = est(plan, "8x H100 SXM")
    flops = train_flops_per_token(cat.model("124m"))
    assert e.mfu == pytest.approx(0.546)
    assert e.tokens_per_s == pytest.approx(8 * 989.5e12 * 0.546 * 0.97**3 / flops)
    assert "from 1 GPU to 8" in e.speed_source


def test_other_shape_transfers_mfu_by_the_step_time_model(tmp_path):
    cat = catalog_with(tmp_path, [BENCH_124M])
    model = cat.model("1b")
    plan = make_plan(cat, PlanRequest(model=model, today=TODAY, gpus=("h100-sxm",), counts=(1,)))
    e = est(plan, "1x H100 SXM")
    h100 = cat.gpus["h100-sxm"]
    moved = modelled_mfu(model, model.max_seq_len, h100) / modelled_mfu(cat.model("124m"), 1024, h100)
    assert 1.1 < moved < 1.4  # a 1B model keeps the matmul units busier than 124M does
    assert e.mfu == pytest.approx(min(0.80, 0.546 * moved))
    assert "step-time model" in e.speed_source and "124m on 1x H100 SXM" in e.speed_source


def test_other_gpu_is_said_so(tmp_path):
    cat = catalog_with(tmp_path, [BENCH_124M])
    plan = make_plan(cat, PlanRequest(model=cat.model("124m"), today=TODAY, gpus=("h200", "a100-80"), counts=(1,)))
    assert "another GPU" in est(plan, "1x H200 SXM").speed_source  # Hopper too
    assert "another architecture" in est(plan, "1x A100 SXM 80GB").speed_source


def test_step_time_model_reproduces_nanogpts_own_pair(tmp_path):
    """Unfitted to it, the model moves nanoGPT's 124M H100 point (42.0 %) onto its 1.31B point
    (53.8 %) within 3 %; and it is blind neither to sequence length nor to width."""
    from gpucli.plan.catalog import ModelShape

    h100 = catalog_with(tmp_path, []).gpus["h100-sxm"]
    small = ModelShape(name="124m", d_model=768, n_layers=12, n_heads=12, d_ff=3072, vocab_size=50304,
                       max_seq_len=1024)
    big = ModelShape(name="1.31b", d_model=2048, n_layers=24, n_heads=16, d_ff=8192, vocab_size=50304,
                     max_seq_len=2048)
    assert 0.420 * modelled_mfu(big, 2048, h100) / modelled_mfu(small, 1024, h100) == pytest.approx(0.538, rel=0.03)
    assert count_params(big).total == pytest.approx(1.3153e9, rel=1e-3)
    assert modelled_mfu(big, 4096, h100) > modelled_mfu(big, 2048, h100)  # attention counts as useful work
    assert all(0.2 < modelled_mfu(m, m.max_seq_len, h100) < 0.8 for m in (small, big))


def test_cpu_entries_are_ignored_and_unknown_gpus_refused(tmp_path):
    cpu = dict(BENCH_124M, gpu="cpu")
    cat = catalog_with(tmp_path, [cpu])
    assert cat.calibration == ()
    from gpucli.errors import CatalogError

    with pytest.raises(CatalogError, match="unknown GPU 'Voodoo 5'"):
        catalog_with(tmp_path / "x", [dict(BENCH_124M, gpu="Voodoo 5")])


def test_gpucli_calibrate_adds_a_runs_speed_and_plan_uses_it(tmp_path, capsys):
    """A finished H100 run's rows -> `gpucli calibrate` -> the next plan quotes that run."""
    import json

    from gpucli.cli.app import main
    from gpucli.plan import catalog as catalog_mod
    from gpucli.runs import records as runs
    from gpucli.runs.records import RunRecord

    wd = tmp_path / "run"
    (wd / "checkpoints" / "step_000100").mkdir(parents=True)
    rows = [{"kind": "train", "step": s, "tok_per_s": 600000.0 + s, "mfu": 0.52, "mem_gib": 30.0, "seq_len": 1024}
            for s in range(10, 110, 10)]
    (wd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shape = {"d_model": 768, "n_layers": 12, "n_heads": 12, "d_ff": 3072, "vocab_size": 50304, "max_seq_len": 1024}
    (wd / "checkpoints" / "step_000100" / "meta.json").write_text(json.dumps(
        {"step": 100, "model_shape": shape, "files": {"model.pt": "0" * 64}, "trainer_version": "0.1.0"}))
    (wd / "run.yaml").write_text(yaml.safe_dump({"training": {"batch_size": 64, "seq_len": 1024},
                                                 "hardware": {"mixed_precision": True, "compile": True}}))
    runs.save(RunRecord(name="h100-run", provider="local", created_at=runs.now_iso(), profile="h100",
                        phase="fast", model="124m", n_gpus=1, gpu="h100-sxm", workdir=str(wd), status="finished"))
    assert main(["calibrate", "h100-run", "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)
    assert entry["tokens_per_s"] == 600065.0 and entry["mfu"] == 0.52 and entry["gpu"] == "h100-sxm"
    catalog_mod.clear_cache()
    cat = load_catalog()
    plan = make_plan(cat, PlanRequest(model=cat.model("124m"), today=TODAY, gpus=("h100",), counts=(1,)))
    e = est(plan, "1x H100 SXM")
    assert e.tokens_per_s == 600065.0 and "gpucli calibrate h100-run" in e.speed_source
    # A CPU run is refused plainly.
    runs.save(RunRecord(name="cpu-run", provider="local", created_at=runs.now_iso(), profile="cpu", phase="fast",
                        model="tiny", n_gpus=1, gpu=None, workdir=str(wd), status="finished"))
    assert main(["calibrate", "cpu-run"]) == 2
    assert "ran on a CPU" in capsys.readouterr().err
