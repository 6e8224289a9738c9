"""The bundled trainer logging to an experiment tracker: a real trackio writing its local log from a
CPU run (its run name and config attached, every train and validation row at its step), a missing
package that changes nothing in the run, and ``launch --tracker`` in run.yaml."""

from __future__ import annotations

import importlib.util
import json
import sqlite3

import pytest

from tests.e2e.everyday.conftest import read_rows, run_trainer, tiny_args
from tests.e2e.everyday.conftest import trainer_env as _env
from tests.support.cli import cli


@pytest.mark.skipif(importlib.util.find_spec("trackio") is None, reason="trackio is not installed (gpucli[trackio])")
def test_trackio_gets_the_runs_rows_name_and_config(data_dir, tmp_path):
    out = tmp_path / "run"
    store = tmp_path / "trackio"
    r = run_trainer(tiny_args(data_dir, out, **{"tracking.backend": "trackio", "tracking.project": "everyday",
                                                "tracking.run_name": "tiny-cpu"}),
                    env=_env(TRACKIO_DIR=str(store), HF_HUB_OFFLINE="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trackio: logging to project 'everyday' as run 'tiny-cpu'" in r.stderr + r.stdout
    db = sqlite3.connect(store / "everyday.db")
    logged = {}
    for run_name, step, metrics in db.execute("select run_name, step, metrics from metrics"):
        assert run_name == "tiny-cpu"
        logged.setdefault(step, {}).update(json.loads(metrics))
    rows = read_rows(out)
    train = {row["step"]: row["loss"] for row in rows if row.get("kind") == "train"}
    val = {row["step"]: row["val_loss"] for row in rows if row.get("kind") == "val"}
    assert len(train) >= 20 and len(val) >= 2
    for step, loss in train.items():
        assert logged[step]["train/loss"] == pytest.approx(loss)
    for step, loss in val.items():
        assert logged[step]["val/val_loss"] == pytest.approx(loss)
    (config,) = [json.loads(c) for (c,) in db.execute("select config from configs where run_name = 'tiny-cpu'")]
    assert config["model"]["preset"] == "tiny" and config["training"]["max_steps"] == 20


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_a_missing_tracker_package_changes_nothing(data_dir, tmp_path):
    out = tmp_path / "run"
    r = run_trainer(tiny_args(data_dir, out, **{"tracking.backend": "wandb", "training.max_steps": 6}), env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "the wandb package is not installed" in r.stderr + r.stdout
    assert [row for row in read_rows(out) if row.get("event") == "finished"][-1]["reason"] == "max_steps"


def test_bad_backend_is_one_line():
    from trainer.spec.config import ConfigError
    from trainer.spec.load import load_config

    assert load_config(None, ["--training.max_steps=5", "--tracking.backend=trackio"]).tracking.backend == "trackio"
    with pytest.raises(ConfigError, match="tracking.backend must be one of none, wandb, trackio"):
        load_config(None, ["--training.max_steps=5", "--tracking.backend=mlflow"])


def test_launch_tracker_sets_run_yaml(capsys, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "k-" + "x" * 20)
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--tracker", "wandb", "--name", "trk",
                         "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    text = json.dumps(plan)
    assert '"backend": "wandb"' in text and '"run_name": "trk"' in text
    assert "x" * 20 not in text
    code, out, err = cli(capsys, "launch", "--profile", "cpu", "--tracker", "mlflow", "--dry-run")
    assert code != 0 and "--tracker must be wandb or trackio" in err
