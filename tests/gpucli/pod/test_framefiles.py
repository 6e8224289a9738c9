"""Metrics from the files frameworks write, read by the pod's standard-library readers: TensorBoard event
files written by the real SummaryWriter (both scalar encodings, a record cut mid-write), Hugging Face
trainer_state.json, Lightning's metrics.csv, and the merge with the console's rows."""

from __future__ import annotations

import json
import os
import time

import pytest

from gpucli.pod.framefiles import EventFile, FrameworkFiles, Merge, StepKeying, TrainerState, reader_for

tb = pytest.importorskip("torch.utils.tensorboard")


@pytest.mark.parametrize("new_style", [True, False])  # a tensor proto, or the older simple_value
def test_event_files_of_the_real_summary_writer(tmp_path, new_style):
    w = tb.SummaryWriter(str(tmp_path))
    for step in (5, 10, 15):
        w.add_scalar("train/loss", 3.0 - step / 10, step, new_style=new_style)
        w.add_scalar("train/learning_rate", 1e-3, step, new_style=new_style)
    w.add_scalar("eval/loss", 2.25, 10, new_style=new_style)
    w.add_text("args", "not a scalar", 0)
    w.close()
    (path,) = tmp_path.glob("events.out.tfevents.*")
    rows = EventFile(path).poll()
    assert all(abs(r["logged_at"] - time.time()) < 600 for r in rows)  # the events' wall_time
    train = [(r["step"], round(r["loss"], 4), r.get("lr")) for r in rows if r["kind"] == "train"]
    assert train == [(5, 2.5, pytest.approx(1e-3)), (10, 2.0, pytest.approx(1e-3)), (15, 1.5, pytest.approx(1e-3))]
    assert [(r["step"], r["val_loss"]) for r in rows if r["kind"] == "val"] == [(10, 2.25)]


def test_a_record_cut_mid_write_is_read_once_complete(tmp_path):
    w = tb.SummaryWriter(str(tmp_path / "src"))
    for step in range(1, 4):
        w.add_scalar("loss", float(step), step)
    w.close()
    (src,) = (tmp_path / "src").glob("events.out.tfevents.*")
    data = src.read_bytes()
    dst = tmp_path / "events.out.tfevents.1.host"
    dst.write_bytes(data[:-7])  # the last record cut
    reader = EventFile(dst)
    # step 2's row waits while a record is half there: it may hold more of step 2's values
    assert [r["step"] for r in reader.poll()] == [1]
    dst.write_bytes(data)
    assert [(r["step"], r["loss"]) for r in reader.poll()] == [(2, 2.0), (3, 3.0)]
    assert reader.poll() == []


def test_trainer_state_and_lightning_csv(tmp_path):
    state = tmp_path / "checkpoint-20" / "trainer_state.json"
    state.parent.mkdir()
    state.write_text(json.dumps({"best_model_checkpoint": "out/checkpoint-10", "log_history": [
        {"loss": 2.5, "grad_norm": 1.0, "learning_rate": 0.001, "epoch": 0.5, "step": 10},
        {"eval_loss": 2.1, "eval_runtime": 0.1, "epoch": 0.5, "step": 10},
        {"train_runtime": 1.0, "train_loss": 2.4, "step": 20}]}))
    rows = TrainerState(state).poll()
    assert rows == [{"kind": "train", "step": 10, "loss": 2.5, "lr": 0.001, "grad_norm": 1.0, "epoch": 0.5},
                    {"kind": "val", "step": 10, "val_loss": 2.1}]
    assert TrainerState(state).poll() and reader_for(state).poll() == rows
    csv_path = tmp_path / "metrics.csv"
    csv_path.write_text("epoch,step,train_loss,val_loss\n0,1,5.4,\n0,7,,2.8\n0,9,2.5")  # last line half-written
    assert reader_for(csv_path).poll() == [{"kind": "train", "step": 1, "loss": 5.4, "epoch": 0.0},
                                           {"kind": "val", "step": 7, "val_loss": 2.8}]
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    assert reader_for(tmp_path / "other.csv") is None


def test_files_written_before_the_job_are_not_its_own(tmp_path):
    old = tmp_path / "lightning_logs" / "version_0" / "metrics.csv"
    old.parent.mkdir(parents=True)
    old.write_text("step,train_loss\n1,9.0\n")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    files = FrameworkFiles([tmp_path], since=time.time() - 5)
    assert files.poll() == []
    new = tmp_path / "lightning_logs" / "version_1" / "metrics.csv"
    new.parent.mkdir()
    new.write_text("step,train_loss\n1,4.0\n")
    files.last_scan = -1e9
    # Lightning's version_N folder: its 0-based logger step 1 is the loss of the 2nd optimizer step
    assert files.poll() == [{"kind": "train", "step": 2, "loss": 4.0, "source": "csv"}]


def test_merge_one_row_per_kind_and_step_console_moves_ahead_of_the_files():
    m = Merge(hold_s=2.0)
    # nanoGPT's own step: out at once, with its source
    assert m.add([{"kind": "train", "step": 1, "loss": 3.0}], now=0.0) == \
        [{"kind": "train", "step": 1, "loss": 3.0, "source": "console"}]
    # a step worked out from a bar waits; a file row at or past its step makes it moot
    assert m.add([{"kind": "val", "step": 8, "val_loss": 2.0, "_held": True}], now=1.0) == []
    assert m.add([{"kind": "val", "step": 8, "val_loss": 2.0, "source": "csv"}], now=1.5) == \
        [{"kind": "val", "step": 8, "val_loss": 2.0, "source": "csv"}]
    assert m.due(10.0) == []
    # ahead of the files (a checkpoint's trainer_state.json is written seldom): the console keeps the
    # live value moving, and the file row of that step, read later, is not a second row
    assert m.add([{"kind": "val", "step": 16, "val_loss": 1.0, "_held": True}], now=11.0) == []
    assert m.due(13.5) == [{"kind": "val", "step": 16, "val_loss": 1.0, "source": "console"}]
    assert m.add([{"kind": "val", "step": 16, "val_loss": 1.0, "source": "tensorboard"}], now=14.0) == []
    # behind what the files gave: the files have that stretch
    assert m.add([{"kind": "val", "step": 12, "val_loss": 1.5}], now=15.0) == []
    # with no file of that kind, the held row goes out after its wait
    assert m.add([{"kind": "train", "step": 2, "loss": 2.0, "_held": True}], now=20.0) == []
    assert m.due(21.0) == [] and m.due(22.5) == [{"kind": "train", "step": 2, "loss": 2.0, "source": "console"}]
    # a train file row past a held console row drops it (not out of order after the file's)
    assert m.add([{"kind": "train", "step": 3, "loss": 1.9, "_held": True}], now=23.0) == []
    assert m.add([{"kind": "train", "step": 4, "loss": 1.8, "source": "csv"}], now=23.5) == \
        [{"kind": "train", "step": 4, "loss": 1.8, "source": "csv"}]
    assert m.due(30.0, final=True) == []


def test_step_keying_lightning_and_litgpt():
    # Lightning: the logger's step is taken before the increment
    pl = StepKeying(lightning=True)
    assert pl.step(0, {"train_loss": 5.0}) == 1 and pl.step(159, {"val_loss": 2.0}) == 160
    assert StepKeying(lightning=False).step(7, {"loss": 1.0}) == 7
    # LitGPT, 2 micro-batches per step: train rows at iter - 1 carry iter and the optimizer step
    lit = StepKeying(lightning=True)
    assert lit.step(79, {"val_loss": 5.2}) == 80  # before any train row: nothing says it is keyed by iteration
    lit = StepKeying(lightning=True)
    assert lit.step(1, {"loss": 6.0, "iter": 2, "step": 1}) == 1
    assert lit.step(159, {"loss": 5.1, "iter": 160, "step": 80}) == 80
    assert lit.step(79, {"val_loss": 5.2318}) == 40  # validation after the 40th step (iter 80)
    assert lit.step(159, {"val_loss": 5.8097}) == 80
    assert lit.step(160, {"val_loss": 5.81}) == 80  # the final validation, logged at iter_num


def test_litgpt_csv_is_not_read_its_optimizer_step_is_overwritten(tmp_path):
    path = tmp_path / "logs" / "csv" / "version_0" / "metrics.csv"
    path.parent.mkdir(parents=True)
    path.write_text("epoch,iter,learning_rate,loss,step,val_loss,val_ppl\n0,2,0.001,6.0,1,,\n"
                    "0,4,0.001,5.9,3,,\n,,,,3,5.8,330.0\n")
    assert reader_for(path).poll() == []
