"""The best validated state is kept: at each improvement of the validation loss the trainer writes the
weights alone to ``checkpoints/best`` (safetensors, sha256 in meta.json with its step and loss),
replacing the previous best; it is never resumed from, pruned or counted in ``keep_last``, and the
weights in it are the ones that scored that loss."""

from __future__ import annotations

import json

import pytest
import torch

from tests.trainer.conftest import read_rows, run_trainer, tiny_args
from trainer.data.loader import TokenSplit, val_batches
from trainer.loop import checkpoint as ckpt
from trainer.sample import load_for_inference, resolve_checkpoint


@pytest.fixture(scope="module")
def run(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("best") / "run"
    # validation every 3 steps, one periodic checkpoint at the end: the best can fall in between
    r = run_trainer(tiny_args(data_dir, out, **{"training.val_interval": 3, "training.checkpoint_interval": 1000,
                                                "training.keep_last": 1, "training.max_steps": 14,
                                                "training.learning_rate": 0.02}))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_best_holds_the_lowest_validation_and_its_weights(run, data_dir):
    rows = read_rows(run)
    vals = [(r["val_loss"], r["step"]) for r in rows if r.get("kind") == "val"]
    best_loss, best_step = min(vals, key=lambda v: (v[0], v[1]))
    best = run / "checkpoints" / ckpt.BEST_DIR
    meta = json.loads((best / "meta.json").read_text())
    assert (meta["step"], meta["val_loss"], meta["kind"]) == (best_step, best_loss, "best")
    assert ckpt.verify(best) == (True, "ok")
    assert set(meta["files"]) == {"model.safetensors"} and not (best / "model.pt").exists()
    assert not list(best.glob("optim_*"))
    # One write per improvement, each replacing the last; nothing left of the swaps.
    improvements = sum(1 for i, (v, _) in enumerate(vals) if v < min((w for w, _ in vals[:i]), default=float("inf")))
    assert len([r for r in rows if r.get("event") == "best_checkpoint"]) == improvements >= 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [ckpt.BEST_DIR, "step_000014"]
    # The weights are those that scored best_loss: the same validation batches give the same loss.
    model, _, _ = load_for_inference(best)
    seq = json.loads((run / "config.json").read_text())["training"]["seq_len"] if (run / "config.json").exists() \
        else 64
    batches = val_batches(TokenSplit(data_dir, "val"), 2, 4, seq)
    with torch.no_grad():
        loss = sum(float(model(torch.from_numpy(b.x), torch.from_numpy(b.y))) for b in batches) / len(batches)
    assert loss == pytest.approx(best_loss, abs=1e-4)


def test_best_is_never_resumed_pruned_or_counted(run):
    root = run / "checkpoints"
    assert [p.name for _, p in ckpt.list_checkpoints(root)] == ["step_000014"]
    assert ckpt.find_resumable(root).name == "step_000014"
    assert ckpt.prune(root, 1) == [] and (root / ckpt.BEST_DIR).is_dir()
    # Loading a run picks the lower loss of the best folder and the periodic checkpoints.
    periodic = json.loads((root / "step_000014" / "meta.json").read_text())["val_loss"]
    best = json.loads((root / ckpt.BEST_DIR / "meta.json").read_text())["val_loss"]
    want = root / ckpt.BEST_DIR if best < periodic else root / "step_000014"
    assert resolve_checkpoint(run) == want


def test_status_and_ls_show_the_best_step_and_loss():
    import datetime as dt
    import io

    from rich.console import Console

    from gpucli.cli import render
    from gpucli.cli.render_runs import runs_table
    from gpucli.run.watch.monitor import summarize
    from gpucli.runs.limits import Limits
    from gpucli.runs.records import RunRecord

    rec = RunRecord(name="r", provider="local", created_at="2026-01-01T11:00:00+00:00", profile="cpu", phase="fast",
                    model="tiny", n_gpus=1, gpu=None, workdir="w", status="running",
                    started_at="2026-01-01T11:00:00+00:00", limits=Limits())
    rows = [{"kind": "val", "step": 3, "val_loss": 2.5}, {"kind": "val", "step": 6, "val_loss": 2.1},
            {"kind": "val", "step": 9, "val_loss": 2.3}, {"kind": "train", "step": 9, "loss": 2.0}]
    st = summarize(rec, rows, alive=True, now=dt.datetime(2026, 1, 1, 12, tzinfo=dt.timezone.utc))
    assert (st.best_val_loss, st.best_val_step, st.val_loss) == (2.1, 6, 2.3)
    buf = io.StringIO()
    old = render._OUT
    render._OUT = Console(file=buf, width=200)
    try:
        runs_table([(rec, st)], json_=False)
    finally:
        render._OUT = old
    assert "2.100 @6" in buf.getvalue()


def test_fetch_best_brings_the_best_folder_and_mirror_resume_never_see_it(run, tmp_path):
    from gpucli.providers.local.target import LocalHost
    from gpucli.run.files.checkpoints import list_checkpoints
    from gpucli.run.starting.jobs import fetch_best
    from gpucli.runs.limits import Limits
    from gpucli.runs.records import RunRecord

    host = LocalHost()
    assert [c.name for c in list_checkpoints(host, str(run))] == ["step_000014"]  # what mirror and resume read
    both = list_checkpoints(host, str(run), with_best=True)
    assert sorted(c.name for c in both) == [ckpt.BEST_DIR, "step_000014"]
    rec = RunRecord(name="r", provider="local", created_at="2026-01-01T11:00:00+00:00", profile="cpu", phase="fast",
                    model="tiny", n_gpus=1, gpu=None, workdir=str(run), status="finished", limits=Limits())
    got = fetch_best(host, rec, tmp_path / "dest")
    want = min(both, key=lambda c: (c.val_loss, -c.step))
    assert got.checkpoint.name == want.name and got.dest == tmp_path / "dest" / f"r-{want.name}"
    assert ckpt.verify(got.dest) == (True, "ok")
    # the weights without pickle come along, whichever was chosen (best holds only those; a periodic
    # checkpoint has them beside model.pt, listed in its meta.json)
    assert "model.safetensors" in ckpt.read_meta(got.dest)["files"] and (got.dest / "model.safetensors").is_file()
    periodic = ckpt.read_meta(run / "checkpoints" / "step_000014")
    assert {"model.pt", "model.safetensors"} <= set(periodic["files"])
    model, _, meta = load_for_inference(got.dest)
    assert meta["step"] == want.step
