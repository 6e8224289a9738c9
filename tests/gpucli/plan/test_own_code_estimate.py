"""Estimates for your own code (launch --code ... --model/--params --seq-len --tokens) and plan's counts in
examples x epochs or steps x batch (the GPU profiles guide counts that way)."""

from __future__ import annotations

import json

import pytest

from gpucli.plan.catalog import load_catalog
from gpucli.plan.owncode import own_code_estimate, shape_for_params
from tests.support.cli import cli


@pytest.fixture
def code(tmp_path):
    d = tmp_path / "code"
    d.mkdir()
    (d / "train.py").write_text("print('hi')\n")
    return str(d)


def _dry(capsys, code, *extra):
    return cli(capsys, "launch", "--code", code, "--run", "python train.py", "--profile", "8xH100",
               "--provider", "runpod", "--dry-run", "--json", *extra)


def test_own_code_with_a_size_gets_time_cost_and_disk(capsys, code):
    rc, out, err = _dry(capsys, code, "--params", "680M", "--seq-len", "2048", "--tokens", "10B")
    assert rc == 0, err
    data = json.loads(out)
    p = data["planned"]
    assert p["tokens_per_s"] > 0 and p["hours"] == pytest.approx(10e9 / p["tokens_per_s"] / 3600)
    assert p["cost_usd"] == pytest.approx(p["hours"] * data["price_per_hour_usd"])
    assert "assumes your code reaches the bundled trainer's MFU" in p["source"]
    assert data["disk"]["checkpoint_gb"] > 5  # 680M params x (4 + 8) bytes


def test_own_code_without_a_size_says_so_plainly(capsys, code):
    rc, out, err = _dry(capsys, code)
    assert rc == 0, err
    data = json.loads(out)
    assert data["planned"]["tokens_per_s"] is None and "no estimate for your own code" in data["planned"]["source"]
    assert data["disk"] is None
    rc, out, _ = cli(capsys, "launch", "--code", code, "--run", "python train.py", "--profile", "8xH100",
                     "--provider", "runpod", "--dry-run")
    assert "your own code (no estimate" in out and "model tiny" not in out


def test_a_preset_size_is_that_preset(capsys, code):
    cat = load_catalog()
    e = own_code_estimate(cat, gpu_id="h100-sxm", n_gpus=1, usd_per_hour=2.5, model=cat.model("d24"), params=None,
                          seq_len=2048, tokens=1e9)
    assert e.shape == cat.model("d24") and e.missing is None
    e = own_code_estimate(cat, gpu_id="h100-sxm", n_gpus=1, usd_per_hour=2.5, model=None, params=680e6,
                          seq_len=2048, tokens=None)
    assert e.missing and "--tokens" in e.missing and e.checkpoint is not None
    shape, note = shape_for_params(680e6)
    assert shape.name == "d24" and "d24" in note


def test_plan_counts_examples_and_epochs_or_steps_and_batch(capsys):
    rc, out, err = cli(capsys, "plan", "--model", "25m", "--examples", "50000", "--epochs", "3", "--seq-len", "512",
                       "--gpu", "l40s", "--max-gpus", "1", "--json")
    assert rc == 0, err
    assert json.loads(out)["tokens"] == 50000 * 3 * 512
    rc, out, _ = cli(capsys, "plan", "--model", "25m", "--steps", "10000", "--batch", "1024", "--seq-len", "512",
                     "--gpu", "l40s", "--max-gpus", "1", "--json")
    assert json.loads(out)["tokens"] == 10000 * 1024 * 512
    rc, _, err = cli(capsys, "plan", "--model", "25m", "--steps", "10000")
    assert rc == 2 and "--steps and --batch go together" in err
    rc, _, err = cli(capsys, "plan", "--model", "25m", "--steps", "10", "--batch", "2", "--tokens", "1B")
    assert rc == 2 and "both say how much" in err
