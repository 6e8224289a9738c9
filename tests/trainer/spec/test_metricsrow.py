"""The typed metrics row (trainer/spec/metricsrow.py): what the trainer writes reads back the same, rows
written before the type existed (and own code's) still read, and a bad row is None, never an error."""

import json
import math

import pytest

from trainer.spec.metricsrow import MetricsRow, as_rows, encode, parse_line, parse_row
from trainer.watch.metrics import MetricsLogger

# Written by the trainer's MetricsLogger before rows went through MetricsRow (recorded from that writer).
OLD_TRAIN = ('{"kind": "train", "step": 20, "loss": 6.1234, "ppl": 456.7, "lr": 0.0006, "embedding_lr": 0.003, '
             '"grad_norm": 1.25, "tok_per_s": 10240.5, "mfu": null, "mem_gib": 0.61, "elapsed_s": 12.5, '
             '"cost_usd": 0.0, "tokens": 81920, "stage": 0, "seq_len": 256, "time": 1795888772.2489595}')
OLD_VAL = ('{"kind": "val", "step": 20, "val_loss": 6.01, "val_ppl": 407.4, "tokens": 81920, "elapsed_s": 13.0, '
           '"tcf/attn_rank": 3.5, "time": 1795888772.2490127}')
OLD_END = ('{"kind": "event", "event": "finished", "reason": "max_steps", "step": 20, "train_loss": 6.1234, '
           '"time": 1795888772.2490263}')
# gpucli/pod/logparse.py's row for a nanoGPT console line, and nanochat's validation in bits per byte.
OWN_TRAIN = '{"kind": "train", "step": 7, "loss": 2.5, "dt_ms": 120.0, "mfu": 0.31}'
OWN_VAL = '{"kind": "val", "step": 250, "val_bpb": 0.98}'


def test_old_rows_read_with_their_units_and_extra_keys():
    train, val, end = (parse_line(x) for x in (OLD_TRAIN, OLD_VAL, OLD_END))
    assert train == MetricsRow(kind="train", step=20, time=1795888772.2489595, loss=6.1234, lr=0.0006, grad_norm=1.25,
                               tok_per_s=10240.5, mem_gib=0.61, elapsed_s=12.5, cost_usd=0.0, tokens=81920,
                               seq_len=256, extra={"ppl": 456.7, "embedding_lr": 0.003, "stage": 0})
    assert train.mfu is None and train.get("stage") == 0 and train.get("loss") == 6.1234
    assert val.val_loss == 6.01 and val.extra["tcf/attn_rank"] == 3.5
    assert (end.event, end.reason, end.step, end.get("train_loss")) == ("finished", "max_steps", 20, 6.1234)
    # read and written again, each old line is the same JSON object (keys, order and nulls kept)
    for line in (OLD_TRAIN, OLD_VAL, OLD_END):
        assert json.dumps(parse_line(line).to_json()) == line


def test_own_code_rows_read():
    row = parse_line(OWN_TRAIN)
    assert (row.step, row.loss, row.dt_ms, row.step_time_s, row.mfu) == (7, 2.5, 120.0, 0.12, 0.31)
    assert parse_line(OWN_VAL).val_bpb == 0.98 and parse_line(OWN_VAL).val_loss is None


def test_what_the_trainer_writes_reads_back(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.write({"kind": "train", "step": 3, "loss": float("nan"), "tok_per_s": 5000.0, "dt_ms": 40.0,
                  "mfu": None, "stage": 1})
    logger.event("finished", reason="signal", step=3)
    logger.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    train, end = (parse_line(x) for x in lines)
    assert train.kind == "train" and train.step == 3 and train.loss is None  # NaN is written as null
    assert train.tok_per_s == 5000.0 and train.step_time_s == 0.04 and train.extra == {"stage": 1}
    assert "mfu" in json.loads(lines[0]) and isinstance(train.time, float)
    assert end.event == "finished" and end.reason == "signal"
    # the round trip: a row written from its typed form is the same row
    assert parse_line(encode(train.to_json())) == train


@pytest.mark.parametrize("line", [
    "", "   ", "not json", "[1, 2]", "42", "null", '"text"', '{"kind": 5}',
    '{"kind": "train", "loss": 1.0}',  # a train row without a step
    '{"kind": "val", "step": -1, "val_loss": 1.0}',  # a negative step
    '{"kind": "train", "step": "7", "loss": 1.0}',  # a step as text
    '{"kind": "train", "step": 1.5}',  # not a whole step
    "[" * 100_000 + "]" * 100_000,  # nested past the parser's recursion
    '{"kind": "train", "step": 1, "pad": "' + "x" * (2 << 20) + '"}',  # past the row size bound
    b"\xff\xfe\x00garbage",
])
def test_a_bad_line_is_none_never_an_error(line):
    assert parse_line(line) is None


def test_bad_fields_read_as_none_and_the_row_stays():
    row = parse_row({"kind": "train", "step": 4.0, "loss": "high", "lr": float("inf"), "tok_per_s": True,
                     "tokens": 2.5, "event": {"x": 1}, 3: "non-string key"})
    assert (row.step, row.loss, row.lr, row.tok_per_s, row.tokens) == (4, None, None, None, None)
    assert row.event == '{"x": 1}'
    assert parse_row({"step": 1}).kind == ""  # a progress row without a kind still reads (readers filter)
    assert as_rows([{"kind": "val"}, {"kind": "val", "step": 2, "val_loss": 1.5}, row, "x"]) == [
        MetricsRow(kind="val", step=2, val_loss=1.5), row]


def test_units_are_the_documented_ones():
    row = parse_line('{"kind": "train", "step": 1, "dt_ms": 1500, "mfu": 0.5, "tokens": 1024}')
    assert row.step_time_s == 1.5 and math.isclose(row.mfu, 0.5) and isinstance(row.tokens, int)
