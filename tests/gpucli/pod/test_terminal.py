"""Console output read as a terminal shows it: the Hugging Face Trainer's log lines after tqdm's cursor
moves (a fragment captured from transformers 4.57 on a pipe), rich's redraws, colours, and the exception
line of a traceback."""

from __future__ import annotations

from gpucli.pod.logparse import LogParser
from gpucli.pod.terminal import Tail, Terminal, exception_line

# transformers 4.57.6 Trainer on a pipe, bytes as written (eval and logging every 10 steps, 20 steps):
# the log line follows a bar drawn before its step (9/20), tqdm.write redraws the bar (10/20) after it,
# and the eval dict comes right after a cursor-up out of the evaluation bar.
HF_457 = (
    "\r 45%|████▌     | 9/20 [00:00<00:01,  9.74it/s]\r                                              \r"
    "{'loss': 4.5418, 'grad_norm': 1.1868537664413452, 'learning_rate': 0.003, 'epoch': 0.5}\n"
    "\r 50%|█████     | 10/20 [00:01<00:01,  9.74it/s]\n\r  0%|          | 0/2 [00:00<?, ?it/s]\x1b[A"
    "\r                                               \r\n\r                                     \r\x1b[A"
    "{'eval_loss': 4.1583147048950195, 'eval_runtime': 0.0768, 'eval_samples_per_second': 104.132, "
    "'eval_steps_per_second': 26.033, 'epoch': 0.5}\n"
    "\r 50%|█████     | 10/20 [00:01<00:01,  9.74it/s]\n"
    "\r100%|██████████| 2/2 [00:00<00:00, 43.63it/s]\x1b[A\n\r                                             \x1b[A"
    "\r 55%|█████▌    | 11/20 [00:01<00:01,  7.20it/s]\r 65%|██████▌   | 13/20 [00:01<00:00,  8.58it/s]"
)


def screen_rows(text: str, chunk: int = 7) -> list[dict]:
    term, parser, rows = Terminal(), LogParser(), []
    for i in range(0, len(text), chunk):  # chunks cut anywhere, escape sequences included
        for line in term.feed(text[i:i + chunk]):
            rows += parser.feed(line)
    for line in term.flush():
        rows += parser.feed(line)
    return rows + parser.flush()


def test_hf_trainer_lines_after_cursor_moves_take_the_redrawn_step():
    rows = screen_rows(" 40%|████      | 8/20 [00:00<00:01,  9.86it/s]" + HF_457)
    assert [(r["kind"], r["step"], r.get("loss", r.get("val_loss"))) for r in rows] == [
        ("train", 10, 4.5418), ("val", 10, 4.1583147048950195)]


def test_overwrites_erases_and_colours():
    term = Terminal()
    # each state a line showed is read when the cursor leaves it (a bar redrawn in place is progress),
    # never a mix of two ("new text here" was never on screen)
    lines = term.feed("\x1b[32mstep 1\x1b[0m: ok\nold text here\rnew\x1b[K\n\x1b[1mbold\x1b[22m\n")
    assert lines == ["step 1: ok", "old text here", "new", "bold"]
    # rich's live display: redraw two lines in place (cursor up, erase line); only changed rows are read
    term = Terminal()
    out = term.feed("Epoch 0/1 ━━━ 1/4 0:00:01 v_num: 0\n    train_loss: 2.500\n")
    out += term.feed("\r\x1b[2K\x1b[1A\x1b[2K\x1b[1A\x1b[2KEpoch 0/1 ━━━ 2/4 0:00:01 v_num: 0\n    train_loss: 2.100\n")
    assert out == ["Epoch 0/1 ━━━ 1/4 0:00:01 v_num: 0", "train_loss: 2.500".rjust(21),
                   "Epoch 0/1 ━━━ 2/4 0:00:01 v_num: 0", "train_loss: 2.100".rjust(21)]


def test_lightning_rich_bar_and_its_metric_lines():
    rows = screen_rows("Epoch 3/3  ━━━━━━━━━━ 8/8 0:00:00 • 0:00:00 21.91it/s v_num: 0          \n"
                       "                         train_loss: 2.952 \n                         val_loss: 2.340   \n")
    assert [(r["kind"], r["step"]) for r in rows] == [("val", 8), ("train", 8)]
    assert rows[0]["val_loss"] == 2.34 and rows[1]["loss"] == 2.952


def test_tail_keeps_a_redrawn_bar_once_and_the_exception_line():
    term, tail = Terminal(), Tail(5)
    text = ("loading\n" + "".join(f"\r{i * 10:3d}%|##| {i}/10 [00:01<00:02]" for i in range(1, 6)) + "\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n    raise KeyError(k)\n"
            "KeyError: 'missing_column'\n")
    for line in term.feed(text) + term.flush():
        tail.add(line)
    assert list(tail) == ["loading", " 50%|##| 5/10 [00:01<00:02]", "Traceback (most recent call last):",
                          "  File \"x.py\", line 3, in <module>", "    raise KeyError(k)", "KeyError: 'missing_column'"][-5:]
    assert exception_line(list(tail) + [" 25%|██▌       | 20/80 [00:02<00:06]"]) == "KeyError: 'missing_column'"


def test_exception_line_of_chained_and_torchrun_tracebacks():
    lines = ["Traceback (most recent call last):", "  File \"a.py\", line 1", "ValueError: first", "",
             "During handling of the above exception, another exception occurred:", "",
             "Traceback (most recent call last):", "  File \"a.py\", line 3", "    x[k]",
             "    ^^^^", "KeyError: 'missing_column'", " 25%|██▌       | 20/80 [00:02<00:06]"]
    assert exception_line(lines) == "KeyError: 'missing_column'"
    assert exception_line(["[rank0]: Traceback (most recent call last):", "[rank0]:   File \"t.py\", line 2",
                           "[rank0]: torch.OutOfMemoryError: CUDA out of memory."]) == \
        "torch.OutOfMemoryError: CUDA out of memory."
    assert exception_line(["iter 5: loss 2.0", "Killed"]) is None
    # stderr's traceback right after a bar on stdout, no newline between: one terminal line
    assert exception_line([" 40%|████      | 16/40 [00:00<00:00, 28.90it/s]Traceback (most recent call last):",
                           "  File \"hf_clm.py\", line 52, in on_step_end", "KeyError: 'missing_column'",
                           " 48%|████▊     | 19/40 [00:01<00:01, 17.01it/s]"]) == "KeyError: 'missing_column'"


def test_torchrun_report_points_at_the_rank_that_failed_first():
    # as torchrun 2.13 prints it: rank 0 raises, rank 1 then loses its peer, torchrun's own ChildFailedError last
    lines = ["[rank0]: Traceback (most recent call last):", "[rank0]:   File \"t.py\", line 3, in <module>",
             "[rank0]: KeyError: 'missing_column'", "[rank1]: Traceback (most recent call last):",
             "[rank1]:   File \"t.py\", line 2, in <module>",
             "[rank1]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:29577.",
             "Traceback (most recent call last):", "  File \"<frozen runpy>\", line 198, in _run_module_as_main",
             "    raise ChildFailedError(", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
             "============================================================", "t.py FAILED",
             "Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-28_15:10:10",
             "  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 31086) ",
             "============================================================"]
    assert exception_line(lines) == "KeyError: 'missing_column'"
    # no child traceback seen: torchrun's own line is all there is
    assert exception_line(lines[6:]) == "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
