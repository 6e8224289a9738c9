"""Console lines in each project's format, written here after the projects' own format strings."""

from __future__ import annotations

import pytest

from gpucli.pod.logparse import LogParser, LossSpikes, compile_metrics_regex, normalize_json_row, split_lines


def feed(lines, regex=None):
    p = LogParser(regex)
    rows = [row for line in lines for row in p.feed(line)] + p.flush()
    for row in rows:
        row.pop("_held", None)  # jobrun's merge reads it: a step worked out from a bar
    return rows


def test_nanogpt_iter_and_eval_lines():
    rows = feed(["iter 0: loss 10.9784, time 30728.83ms, mfu -100.00%",
                 "iter 5: loss 9.1234, time 141.06ms, mfu 38.12%",
                 "step 250: train loss 1.9032, val loss 2.0011",
                 "saving checkpoint to out-shakespeare-char"])
    assert rows == [
        {"kind": "train", "step": 0, "loss": 10.9784, "dt_ms": 30728.83},
        {"kind": "train", "step": 5, "loss": 9.1234, "mfu": pytest.approx(0.3812), "dt_ms": 141.06},
        {"kind": "val", "step": 250, "val_loss": 2.0011, "train_loss": 1.9032},
    ]


def test_nanochat_base_train_lines_of_recent_versions():
    # scripts/base_train.py now: "bf16_mfu" and the dataloader position after the epoch
    rows = feed(["step 00042/01000 (4.20%) | loss: 3.123456 | lrm: 1.00 | dt: 412.50ms | tok/sec: 1,271,012 | "
                 "bf16_mfu: 47.31 | epoch: 1 pq: 3 rg: 7 | total time: 0.21m | eta: 6.6m",
                 "Step 00250 | Validation bpb: 0.912345", "Step 00250 | CORE metric: 0.2010"])
    assert rows == [{"kind": "train", "step": 42, "loss": 3.123456, "max_steps": 1000, "lrm": 1.0, "dt_ms": 412.5,
                     "tok_per_s": 1271012.0, "mfu": pytest.approx(0.4731), "epoch": 1.0},
                    {"kind": "val", "step": 250, "val_bpb": 0.912345}]


def test_nanochat_step_and_validation_lines():
    rows = feed(["step 00042/01000 (4.20%) | loss: 3.123456 | lrm: 1.00 | dt: 412.50ms | tok/sec: 1,271,012 | "
                 "mfu: 47.31 | epoch: 0 | total time: 0.21m | eta: 6.6m",
                 "Step 00250 | Validation bpb: 0.912345"])
    assert rows[0]["step"] == 42 and rows[0]["loss"] == 3.123456 and rows[0]["tok_per_s"] == 1271012
    assert rows[0]["mfu"] == pytest.approx(0.4731) and rows[0]["lrm"] == 1.0 and rows[0]["max_steps"] == 1000
    assert rows[1] == {"kind": "val", "step": 250, "val_bpb": 0.912345}


def test_hf_trainer_dicts_take_the_step_from_the_training_bar():
    rows = feed([
        "  0%|          | 0/500 [00:00<?, ?it/s]",
        " 10%|█         | 50/500 [00:10<01:30,  5.00it/s]",
        "{'loss': 2.3104, 'grad_norm': 1.8271, 'learning_rate': 4.5e-05, 'epoch': 0.1}",
        " 10%|█         | 50/500 [00:10<01:30,  5.00it/s]",  # tqdm.write redraws the bar: the log's step
        "100%|██████████| 13/13 [00:01<00:00, 9.10it/s]",  # the eval bar: another total
        "{'eval_loss': 2.0123, 'eval_runtime': 1.43, 'eval_samples_per_second': 72.7, 'epoch': 0.1}",
        " 10%|█         | 50/500 [00:11<01:31,  5.00it/s]",
        " 19%|█▉        | 99/500 [00:20<01:20,  5.00it/s]",  # drawn at most every 0.1 s: may be stale
        "{'loss': '2.101', 'grad_norm': '1.5', 'learning_rate': '4e-05', 'epoch': '0.2'}",  # recent: '{v:.4g}'
        " 20%|██        | 100/500 [00:20<01:20,  5.00it/s]",
        "{'train_runtime': 100.1, 'train_samples_per_second': 40.0, 'train_loss': 2.2, 'epoch': 1.0}",
    ])
    assert rows == [
        {"kind": "train", "step": 50, "loss": 2.3104, "lr": 4.5e-05, "grad_norm": 1.8271, "epoch": 0.1},
        {"kind": "val", "step": 50, "val_loss": 2.0123},
        {"kind": "train", "step": 100, "loss": 2.101, "lr": 4e-05, "grad_norm": 1.5, "epoch": 0.2},
    ]


def test_hf_trainer_without_a_bar_counts_logged_rows_and_reads_tensor_values():
    rows = feed(["{'loss': 2.5, 'grad_norm': tensor(0.75), 'learning_rate': 1e-05, 'epoch': 0.01}",
                 "{'loss': 2.4, 'grad_norm': np.float64(0.5), 'learning_rate': 1e-05, 'epoch': 0.02}"])
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in rows] == [(1, 2.5, 0.75), (2, 2.4, 0.5)]


def test_lightning_bars_across_epochs_and_validation():
    rows = feed([
        "Sanity Checking DataLoader 0: 100%|██████████| 2/2 [00:00<00:00, 40.00it/s]",
        "Epoch 0:  50%|█████     | 50/100 [00:05<00:05,  9.80it/s, v_num=0, train_loss=1.230]",
        "Epoch 0:  50%|█████     | 50/100 [00:05<00:05,  9.80it/s, v_num=0, train_loss=1.230]",  # a refresh
        "Validation DataLoader 0:  40%|████      | 4/10 [00:00<00:00, 20.00it/s]",
        "Epoch 0: 100%|██████████| 100/100 [00:10<00:00,  9.80it/s, v_num=0, train_loss=1.100, val_loss=1.300]",
        "Epoch 1:   1%|          | 1/100 [00:00<00:10,  9.80it/s, v_num=0, loss=1.05, val_loss=1.300]",
    ])
    assert rows == [
        {"kind": "train", "step": 50, "loss": 1.23, "epoch": 0.0},
        {"kind": "val", "step": 100, "val_loss": 1.3},  # train rows go out when the count moves on
        {"kind": "train", "step": 100, "loss": 1.1, "epoch": 0.0},
        {"kind": "train", "step": 101, "loss": 1.05, "epoch": 1.0},
    ]


def test_json_lines_and_rows_in_the_trainers_format():
    rows = feed(['{"step": 7, "loss": 1.5, "lr": 0.0003, "tok_per_s": 900}',
                 '{"iter": 8, "train/loss": 1.4, "val/loss": 1.6}',
                 '{"kind": "train", "step": 9, "loss": 1.3, "ppl": 3.67}',
                 '{"message": "no step here"}', '{"step": 3, "loss": NaN}'])
    assert rows == [
        {"kind": "train", "step": 7, "loss": 1.5, "lr": 0.0003, "tok_per_s": 900.0},
        {"kind": "train", "step": 8, "loss": 1.4},
        {"kind": "val", "step": 8, "val_loss": 1.6},
        {"kind": "train", "step": 9, "loss": 1.3, "ppl": 3.67},
    ]
    assert normalize_json_row([1, 2]) == [] and normalize_json_row({"step": -1, "loss": 1}) == []


def test_user_regex_first_then_the_built_in_formats():
    regex = r"^>> (?P<step>\d+) (?P<loss>[\d.]+)"
    assert feed([">> 12 0.5", "iter 3: loss 2.0000, time 1.00ms, mfu 1.00%"], regex) == [
        {"kind": "train", "step": 12, "loss": 0.5},
        {"kind": "train", "step": 3, "loss": 2.0, "mfu": 0.01, "dt_ms": 1.0}]
    with pytest.raises(ValueError, match="named groups"):
        compile_metrics_regex(r"(?P<loss>\d)")
    with pytest.raises(ValueError, match="does not compile"):
        compile_metrics_regex(r"(?P<step>\d+")


def test_ordinary_lines_are_not_metrics():
    assert feed(["Loading checkpoint shards: 100%|██████████| 2/2 [00:03<00:00,  1.5s/it]",
                 "number of parameters: 10.65M", "{'a': 1}", "step 5 done", "Epoch 3 of 10"]) == []


def test_split_lines_cuts_carriage_returns_and_keeps_the_rest():
    assert split_lines("a\rb\r\nc\n\nd") == (["a", "b", "c"], "d")


def test_loss_spikes():
    s = LossSpikes(window=5, factor=2.0, min_history=3)
    assert [s.update(x) for x in (1.0, 1.0, 1.0)] == [None, None, None]
    assert s.update(2.5) == 1.0  # above 2x the mean of 1.0
    assert s.update(1.9) is None  # the spike did not raise the mean
    assert s.update(float("nan")) is None


def test_litgpt_pretrain_lines_give_the_optimizer_step():
    # litgpt/pretrain.py fit(): 2 micro-batches per optimizer step, validation every 40 steps
    p = LogParser()
    rows = [r for line in (
        "Epoch 1 | iter 1 step 0 | loss train: 6.100, val: n/a | iter time: 10.00 ms remaining time: 0:00:03",
        "Epoch 1 | iter 2 step 1 | loss train: 6.000, val: n/a | iter time: 12.50 ms (step) remaining time: 0:00:03",
        "Epoch 1 | iter 80 step 40 | loss train: 5.300, val: n/a | iter time: 10.00 ms (step) remaining time: 0:00:02",
        "iter 80: val loss 5.2318, val time: 12.00 ms",
        "Saving checkpoint to 'out/step-00000040/lit_model.pth'",
        "Epoch 1 | iter 160 step 80 | loss train: 5.100, val: 5.232 | iter time: 10.00 ms (step) remaining time: 0:00:00",
        "iter 160: val loss 5.8097, val time: 12.00 ms",
        "Final evaluation | val loss: 5.810 | val ppl: 333.7") for r in p.feed(line)]
    assert rows == [{"kind": "train", "step": 1, "loss": 6.0, "dt_ms": 12.5},
                    {"kind": "train", "step": 40, "loss": 5.3, "dt_ms": 10.0},
                    {"kind": "val", "step": 40, "val_loss": 5.2318},
                    {"kind": "train", "step": 80, "loss": 5.1, "dt_ms": 10.0},
                    {"kind": "val", "step": 80, "val_loss": 5.8097},
                    {"kind": "val", "step": 80, "val_loss": 5.81}]  # the final evaluation: one row per step after Merge
