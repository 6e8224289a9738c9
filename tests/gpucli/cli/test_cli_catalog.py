"""The commands as a user runs them: output, --json, bad input (one line, non-zero, no traceback)."""

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from gpucli.cli.app import main
from gpucli.settings import PACKAGE_CATALOG


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_gpus_profiles_models_tables(capsys):
    code, out, _ = run(capsys, "gpus")
    assert code == 0
    for name in ("H200 SXM", "H100 NVL", "A100 PCIe 40GB", "RTX PRO 6000 Blackwell", "RTX 4000 Ada", "B300"):
        assert name in out
    assert "stale" in out
    code, out, _ = run(capsys, "profiles")
    assert code == 0
    for name in ("rtx4090", "a100-40", "b300", "8xB200", "4xA100", "extreme"):
        assert name in out
    code, out, _ = run(capsys, "models")
    assert code == 0 and "778M" in out and "12.9B" in out


def test_json_listings(capsys):
    code, out, _ = run(capsys, "gpus", "--json")
    data = json.loads(out)
    assert code == 0 and len(data["gpus"]) == 18
    assert all(p["source"] and "kind" in p for p in data["prices"])
    code, out, _ = run(capsys, "profiles", "--json")
    data = json.loads(out)
    # the cloud training guide's fast and extreme, and the Atlas 1B build plan's two-stage tnt
    assert len(data["single"]) == 9 and len(data["cluster"]) == 6 and len(data["phases"]) == 3
    tnt = {p["name"]: p for p in data["phases"]}["tnt"]
    assert tnt["stages"] == {"stage1_steps": 80000, "stage2_steps": 8000, "stage1_chunk_size": 2048,
                             "stage2_chunk_size": 256}
    code, out, _ = run(capsys, "models", "--json")
    by_name = {m["name"]: m for m in json.loads(out)}
    assert by_name["1b"]["params"] == 777_856_512
    # The trainer's own presets (trainer/spec/presets.py), every architectural choice stated.
    assert (by_name["1b"]["pos_embedding"], by_name["1b"]["tied_embeddings"], by_name["1b"]["mlp"]) == ("rope", False, "gelu")
    assert by_name["tiny"]["d_model"] == 64 and by_name["1.31b"]["params"] == 1_315_276_800


def test_plan_table_and_json(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", "--model", "1b")
    assert code == 0
    assert "Pareto front" in out and "Picks" in out and "Cost against time" in out
    code, out, _ = run(capsys, "plan", "--model", "1b", "--json", "--budget", "500", "--deadline", "24h")
    data = json.loads(out)
    assert code == 0 and data["front"] and data["picks"]["cheapest"]
    assert all("dominated_by" in d for d in data["dominated"])
    assert data["budget"] and data["deadline_hours"] == 24
    png = tmp_path / "front.png"
    code, _, _ = run(capsys, "plan", "--model", "124m", "--plot", str(png), "--no-chart")
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,needle,code", [
    (["plan", "--model", "1bb"], "unknown model '1bb' (did you mean 1b", 2),
    (["plan", "--model", "1b", "--gpu", "h1000"], "unknown GPU 'h1000'", 2),
    (["plan", "--model", "1b", "--tokens", "lots"], "not a number", 2),
    (["plan", "--model", "1b", "--deadline", "soon"], "not a duration", 2),
    (["plan", "--model", "1b", "--budget", "-5"], "--budget must be", 2),
    (["plan", "--model", "1b", "--workload", "dance"], "unknown workload", 2),
    (["plan", "--model", "7b", "--gpu", "a4000", "--max-gpus", "1"], "fits on none", 6),
    (["plan", "--model", "7b", "--workload", "generate"], "needs --tokens", 2),
])
def test_bad_input_is_one_line(capsys, args, needle, code):
    got, out, err = run(capsys, *args)
    assert got == code
    assert needle in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def broken_catalog(tmp_path, file, mutate):
    d = tmp_path / "cat"
    shutil.copytree(PACKAGE_CATALOG, d)
    data = yaml.safe_load((d / file).read_text())
    mutate(data)
    (d / file).write_text(yaml.safe_dump(data))
    return d


@pytest.mark.parametrize("file,mutate,needle", [
    ("gpus.yaml", lambda d: d["gpus"]["h100-sxm"].update(vram_gb="lots"),
     "gpus.yaml: gpus.h100-sxm.vram_gb: expected a number, got 'lots'"),
    ("gpus.yaml", lambda d: d["gpus"]["l4"].update(interconnect="smoke"),
     "gpus.yaml: gpus.l4.interconnect: must be one of nvlink, pcie"),
    ("prices.yaml", lambda d: d["prices"][0].update(gpu="h999"), "prices.yaml: prices[0].gpu: unknown GPU 'h999'"),
    ("prices.yaml", lambda d: d["prices"][1].update(as_of="last week"), "prices.yaml: prices[1].as_of: expected a date"),
    ("calibration.yaml", lambda d: d["entries"][0]["model"].update(n_heads=7),
     "calibration.yaml: entries[0].model.n_heads: d_model 1024 is not divisible by n_heads 7"),
    ("calibration.yaml", lambda d: d["entries"][0]["model"].update(width=3),
     "calibration.yaml: entries[0].model.width: unknown key"),
    ("calibration.yaml", lambda d: d["entries"][0]["model"].update(mlp="tanh"),
     "calibration.yaml: entries[0].model.mlp: must be one of gelu, swiglu, relu2"),
    ("profiles.yaml", lambda d: d["cluster"]["8xH100"]["phases"].update(turbo={"micro_batch": 1, "grad_accum": 1}),
     "profiles.yaml: cluster.8xH100.phases.turbo: unknown phase"),
    ("phases.yaml", lambda d: d["phases"]["fast"].pop("iterations"), "phases.yaml: phases.fast.iterations: missing"),
])
def test_bad_catalogue_file(capsys, tmp_path, file, mutate, needle):
    d = broken_catalog(tmp_path, file, mutate)
    code, _, err = run(capsys, "--catalog", str(d), "gpus")
    assert code == 2
    assert needle in err, err
    assert "Traceback" not in err


def test_invalid_yaml_and_missing_dir(capsys, tmp_path):
    d = tmp_path / "cat"
    shutil.copytree(PACKAGE_CATALOG, d)
    (d / "phases.yaml").write_text("phases: [unclosed\n")
    code, _, err = run(capsys, "--catalog", str(d), "models")
    assert code == 2 and "phases.yaml: line" in err and "invalid YAML" in err
    code, _, err = run(capsys, "--catalog", str(tmp_path / "nope"), "models")
    assert code == 2 and "does not exist" in err


def test_catalog_env_var(capsys, tmp_path, monkeypatch):
    d = broken_catalog(tmp_path, "gpus.yaml", lambda g: g["gpus"]["b300"].update(name="B300 test edition"))
    monkeypatch.setenv("GPUCLI_CATALOG", str(d))
    code, out, _ = run(capsys, "gpus")
    assert code == 0 and "B300 test edition" in out


def test_real_process_help_and_plan():
    """As a user runs it: the console script, a real process."""
    out = subprocess.run([sys.executable, "-m", "gpucli.cli.app", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "plan" in out.stdout
    out = subprocess.run([sys.executable, "-m", "gpucli.cli.app", "plan", "--model", "nope"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
