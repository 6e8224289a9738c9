"""The real Hugging Face Trainer, Lightning Trainer and LitGPT's pretrain, run unchanged through `gpucli launch` (tiny models
from a config, a tokenizer trained here): the rows in `tail --json` are the losses the framework
recorded at its steps, fetch-best brings back the checkpoint the framework names best and it loads with
the framework, and a crash or a cap ends with the right one-line story."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from tests.e2e.owncode.helpers import fetch_best, finished_rows, status_json
from tests.support.cli import cli

pytest.importorskip("transformers")
pytest.importorskip("lightning")

FRAMEWORKS = Path(__file__).resolve().parent / "frameworks"


@pytest.fixture(autouse=True)
def quick_watchdog(monkeypatch):
    monkeypatch.setenv("GPUCLI_WATCHDOG_GRACE_S", "15")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def code_folder(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    for f in [*FRAMEWORKS.glob("*.py"), *FRAMEWORKS.glob("*.yaml")]:
        shutil.copy(f, code / f.name)
    return code


def launch(capsys, tmp_path: Path, name: str, run: str, *extra: str) -> Path:
    code = code_folder(tmp_path)
    rc, out, err = cli(capsys, "launch", "--code", str(code), "--run", f"{sys.executable} {run}", "--name", name,
                       "--provider", "local", "--profile", "cpu", *extra)
    assert rc == 0, err
    return Path(runs.load(name).workdir) / "code"


def metric_rows(rows: list[dict], kind: str, key: str) -> dict[int, float]:
    found = [r for r in rows if r.get("kind") == kind]
    steps = [r["step"] for r in found]
    assert len(steps) == len(set(steps)), f"one {kind} row per step: {steps}"
    assert all(r.get("source") in ("console", "tensorboard", "trainer_state", "csv", "job") for r in found)
    return {r["step"]: r[key] for r in found}


def assert_same(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want), (got, want)
    for step, value in want.items():
        assert got[step] == pytest.approx(value, rel=1e-3, abs=1e-3), (step, got[step], value)


def test_hf_trainer_metrics_best_checkpoint_and_story(capsys, tmp_path):
    code = launch(capsys, tmp_path, "hf-real", "hf_clm.py --steps 40", "--checkpoints", "out")
    rows = finished_rows(capsys, "hf-real", timeout_s=300)
    state = json.loads((code / "out" / "checkpoint-40" / "trainer_state.json").read_text())
    history = state["log_history"]
    assert_same(metric_rows(rows, "train", "loss"), {e["step"]: e["loss"] for e in history if "loss" in e})
    assert_same(metric_rows(rows, "val", "val_loss"), {e["step"]: e["eval_loss"] for e in history if "eval_loss" in e})
    assert {r["source"] for r in rows if r.get("kind") == "val"} <= {"console", "tensorboard", "trainer_state"}

    st = status_json(capsys, "hf-real")
    assert st["story"] == "finished (exit 0)" and st["step"] == 40

    best = Path(state["best_model_checkpoint"]).name
    assert best != "checkpoint-40"  # the data make the middle checkpoint the best: newest is not best
    got = fetch_best(capsys, "hf-real", tmp_path / "fetched")
    assert got["checkpoint"] == best and "best_model_checkpoint" in got["reason"]
    assert all(f.startswith(best + "/") for f in got["files"]) and not any("tfevents" in f for f in got["files"])
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(Path(got["dest"]) / best)
    assert model.config.n_layer == 2

    rc, out, err = cli(capsys, "tail", "hf-real", "--no-follow")
    assert rc == 0 and "finished (exit 0)" in out and "compile" not in out


def test_hf_trainer_crash_halfway_says_the_exception(capsys, tmp_path):
    launch(capsys, tmp_path, "hf-crash", "hf_clm.py --steps 40 --crash-at 20", "--checkpoints", "out")
    rows = finished_rows(capsys, "hf-crash", timeout_s=300)
    st = status_json(capsys, "hf-crash")
    assert st["state"] == "failed" and st["story"] == "failed (exit 1: KeyError: 'missing_column')", st
    # the callback raises at step 20's end, before the Trainer logs step 20: 15 was the last logged
    assert max(metric_rows(rows, "train", "loss")) == 15
    rc, out, err = cli(capsys, "tail", "hf-crash", "--no-follow")
    end = [ln for ln in out.splitlines() if ln.startswith("run hf-crash")][-1]
    assert end == "run hf-crash failed (exit 1: KeyError: 'missing_column'), last step 15", out
    assert "%|" not in end


def test_hours_cap_fires_on_time_and_says_so(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "30")  # the cap's own deadline wakes the watchdog
    launch(capsys, tmp_path, "hf-cap", "hf_clm.py --steps 5000 --sleep 0.2", "--checkpoints", "out",
           "--hours", "0.005")
    finished_rows(capsys, "hf-cap", timeout_s=120)
    st = status_json(capsys, "hf-cap")
    m = re.fullmatch(r"stopped by cap: max_hours 0.005 h at (\d+) s", st["story"] or "")
    assert m, st["story"]
    assert 18 <= int(m.group(1)) <= 18 + 5  # within 5 s of the limit, not on a 30 s poll
    assert st["state"] == "stopped"  # its cap cut the training short: not "finished"

    # ls says what status says: the state and the best validation, while the run is live-checked and
    # again from the record alone once it is saved as ended
    for _ in range(2):
        rc, out, err = cli(capsys, "ls", "--json")
        assert rc == 0, err
        row = next(r for r in json.loads(out) if r["run"] == "hf-cap")
        assert row["state"] == "stopped" and row["best_val_loss"] == pytest.approx(st["best_val_loss"])
        assert row["best_val_step"] == st["best_val_step"] and row["step"] == st["step"]
    assert runs.load("hf-cap").status == "stopped"


def test_torchrun_failure_says_the_childs_exception(capsys, tmp_path):
    launch(capsys, tmp_path, "ddp-crash", "-m torch.distributed.run --nproc-per-node 2 ddp_crash.py")
    rows = finished_rows(capsys, "ddp-crash", timeout_s=300)
    st = status_json(capsys, "ddp-crash")
    # torchrun's own ChildFailedError comes last on the console; the cause is rank 0's exception
    assert st["state"] == "failed" and st["story"] == "failed (exit 1: KeyError: 'missing_column')", st
    assert max(metric_rows(rows, "train", "loss")) == 4


def _lightning_best(code: Path) -> tuple[str, float]:
    log = (code.parent / "train.log").read_text(errors="replace")
    m = re.findall(r"^best: (\S+) ([0-9.]+)$", log, flags=re.M)
    assert m, log[-2000:]
    return Path(m[-1][0]).name, float(m[-1][1])


@pytest.mark.parametrize("bar", ["default", "tqdm"])  # default: rich (installed) -> RichProgressBar
def test_lightning_metrics_and_best_checkpoint(capsys, tmp_path, bar):
    name = f"pl-{bar}"
    code = launch(capsys, tmp_path, name, f"lightning_lm.py --epochs 4 --bar {bar}")
    rows = finished_rows(capsys, name, timeout_s=300)
    import csv

    with open(code / "logs" / "lightning_logs" / "version_0" / "metrics.csv") as fh:
        logged = list(csv.DictReader(fh))
    # Lightning logs at the optimizer steps done before the batch: its step s is the (s+1)-th step's,
    # the count its checkpoints carry (epoch=3-step=32.ckpt after 32 steps)
    train = metric_rows(rows, "train", "loss")
    want = {int(r["step"]) + 1: float(r["train_loss"]) for r in logged if r["train_loss"]}
    assert set(want) <= set(train), (sorted(train), sorted(want))
    for step, value in want.items():  # the bar shows 3 significant digits: a row may be the bar's
        assert train[step] == pytest.approx(value, rel=5e-3, abs=5e-3), (step, train[step], value)
    assert_same(metric_rows(rows, "val", "val_loss"),
                {int(r["step"]) + 1: float(r["val_loss"]) for r in logged if r["val_loss"]})
    st = status_json(capsys, name)
    assert st["story"] == "finished (exit 0)" and max(train) == 32 and st["step"] == 32, (st, sorted(train))
    rc, out, err = cli(capsys, "tail", name, "--no-follow")
    assert rc == 0 and f"run {name} finished (exit 0), last step 32" in out, out[-1500:]

    best, score = _lightning_best(code)
    assert best != "epoch=3-step=32.ckpt"  # the newest is not the best here
    got = fetch_best(capsys, name, tmp_path / "fetched")
    assert got["checkpoint"] == best and got["files"] == [best]
    import torch

    ckpt = torch.load(Path(got["dest"]) / best, map_location="cpu", weights_only=False)
    callback = next(v for k, v in ckpt["callbacks"].items() if k.startswith("ModelCheckpoint"))
    assert Path(callback["best_model_path"]).name == best and float(callback["best_model_score"]) == \
        pytest.approx(score, abs=1e-4)


def test_hf_trainer_over_ssh(capsys, tmp_path, sshd, client_key):
    code = code_folder(tmp_path)
    name = "hf-ssh"
    rc, out, err = cli(capsys, "launch", "--code", str(code), "--run", f"{sys.executable} hf_clm.py --steps 20",
                       "--name", name, "--checkpoints", "out", "--provider", "ssh",
                       "--host", f"{sshd.user}@127.0.0.1:{sshd.port}", "--identity", str(client_key[0]),
                       "--python", sys.executable, "--workdir", str(tmp_path / "pod" / name))
    assert rc == 0, err
    rows = finished_rows(capsys, name, timeout_s=300)
    state = json.loads((tmp_path / "pod" / name / "code" / "out" / "checkpoint-20" / "trainer_state.json").read_text())
    history = state["log_history"]
    assert_same(metric_rows(rows, "train", "loss"), {e["step"]: e["loss"] for e in history if "loss" in e})
    assert_same(metric_rows(rows, "val", "val_loss"), {e["step"]: e["eval_loss"] for e in history if "eval_loss" in e})
    got = fetch_best(capsys, name, tmp_path / "fetched")
    assert got["checkpoint"] == Path(state["best_model_checkpoint"]).name


def test_litgpt_pretrain_steps_and_each_checkpoints_own_validation(capsys, tmp_path):
    pytest.importorskip("litgpt")
    code = code_folder(tmp_path)
    # TORCHDYNAMO_DISABLE: pretrain torch.compiles the model, minutes on a busy CPU for seconds of training
    cmd = f"TORCHDYNAMO_DISABLE=1 HF_HUB_OFFLINE=1 {sys.executable} -m litgpt pretrain --config litgpt_pretrain.yaml"
    rc, out, err = cli(capsys, "launch", "--code", str(code), "--run", cmd, "--name", "litgpt", "--checkpoints", "out",
                       "--provider", "local", "--profile", "cpu")
    assert rc == 0, err
    rows = finished_rows(capsys, "litgpt", timeout_s=400)
    code = Path(runs.load("litgpt").workdir) / "code"
    import csv

    with open(code / "out" / "logs" / "csv" / "version_0" / "metrics.csv") as fh:
        logged = list(csv.DictReader(fh))
    # its CSV is keyed by the micro-batch iteration - 1 (2 per optimizer step); the optimizer step is
    # iter / 2, the count of its step-NNNNNNNN checkpoints
    assert_same(metric_rows(rows, "train", "loss"), {int(r["iter"]) // 2: float(r["loss"]) for r in logged if r["loss"]})
    in_loop = {(int(r["step"]) + 1) // 2: float(r["val_loss"]) for r in logged if r["val_loss"] and int(r["step"]) % 2}
    assert sorted(in_loop) == [4, 8]
    assert_same(metric_rows(rows, "val", "val_loss"), in_loop)

    st = status_json(capsys, "litgpt")
    assert st["story"] == "finished (exit 0)" and st["step"] == 8, st
    best = min(in_loop, key=lambda k: (in_loop[k], -k))
    assert st["best_val_step"] == best and st["best_val_loss"] == pytest.approx(in_loop[best], abs=1e-4)
    rc, out, err = cli(capsys, "tail", "litgpt", "--no-follow")
    assert rc == 0 and "run litgpt finished (exit 0), last step 8" in out, out[-1500:]

    got = fetch_best(capsys, "litgpt", tmp_path / "fetched")
    assert got["checkpoint"] == f"step-{best:08d}" and got["val_loss"] == pytest.approx(in_loop[best], abs=1e-4)
    assert f"{in_loop[best]:.4f} (logged at its step {best})" in got["reason"], got
    import torch

    state = torch.load(Path(got["dest"]) / got["checkpoint"] / "lit_model.pth", map_location="cpu", weights_only=False)
    assert state["step_count"] == best and state["iter_num"] == 2 * best
