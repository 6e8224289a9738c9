"""Pod files shown to the user: bounded reads and clean text, against a real sshd pod.

The run folder is crafted by a hostile job: a 3 GB console.log (sparse) that ends in escape sequences,
a metrics.jsonl that never stops growing, FIFOs where files should be, rows whose steps are strings,
infinities or 5,000 digits, lists where objects belong, JSON nested 100,000 deep, event names and
reasons with escape sequences and rich markup. ``status`` and ``tail --no-follow`` finish, print one
clean screen and no control byte the pod wrote.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from gpucli.cli.sanitize import clean
from gpucli.runs import records as runs
from gpucli.ssh import SshTarget
from tests.support.cli import cli

ESCAPES = "\x1b[2J\x1b[H\x1b]0;pwned\x07\x1b]52;c;cm0gLXJmIH4=\x07\x9b31m\x1bP+q\x1b\\"


@pytest.fixture
def run_dir(sshd, client_key, tmp_path):
    workdir = tmp_path / "pod"
    workdir.mkdir()
    record = runs.RunRecord(name="victim", provider="ssh", created_at="2026-11-24T00:00:00+00:00", profile="cpu",
                            phase="fast", model="tiny", n_gpus=1, gpu=None, workdir=str(workdir), status="running",
                            pid=4_000_000,  # no such process: the run reads as ended, its log tail is shown
                            ssh=SshTarget(host=sshd.host, port=sshd.port, user=sshd.user,
                                          identity_file=str(client_key[0])))
    runs.save(record)
    return workdir


def no_pod_bytes(text: str) -> None:
    assert "\x1b" not in text and "\x9b" not in text and "\x07" not in text
    assert "Traceback" not in text and "internal error" not in text


HOSTILE_ROWS = [
    {"kind": "event", "event": "started", "time": 1},
    {"kind": "train", "step": 1, "loss": 3.0, "time": 2},
    {"kind": "train", "step": "two[/bold]", "loss": "x", "time": 3},
    {"kind": "train", "step": 3, "loss": float("inf"), "lr": "fast", "tok_per_s": [1], "mfu": {}, "time": 4},
    {"kind": "val", "step": [4], "val_loss": "[red]low", "time": 5},
    {"kind": "event", "event": f"error{ESCAPES}", "error": f"[/bold] broke {ESCAPES}", "time": 6},
    {"kind": "event", "event": {"not": "a name"}, "time": 7},
]


def write_rows(path: Path, extra: bytes = b"") -> None:
    with open(path, "wb") as fh:
        for row in HOSTILE_ROWS:
            fh.write(json.dumps(row).encode() + b"\n")
        fh.write(b'{"kind": "train", "step": ' + b"9" * 5000 + b"}\n")
        fh.write(b"[" * 100_000 + b"]" * 100_000 + b"\n")
        fh.write(b'["a", "list"]\n')
        fh.write(extra)


@pytest.mark.parametrize("command", [("status", "victim"), ("tail", "victim", "--no-follow"), ("ls",)])
def test_hostile_rows_and_a_huge_log_end_print_clean(command, run_dir, capsys):
    write_rows(run_dir / "metrics.jsonl")
    log = run_dir / "console.log"
    with open(log, "wb") as fh:
        fh.truncate(3 << 30)  # 3 GB, sparse: only the end is read
        fh.seek(3 << 30)
        fh.write(f"final words {ESCAPES} [/bold]\n".encode())
    code, out, err = cli(capsys, *command)
    no_pod_bytes(out + err)
    assert code in (0, 1), err
    if command[0] != "ls":
        assert "final words" in out + err


def test_a_growing_metrics_file_does_not_keep_status_reading(run_dir, capsys):
    path = run_dir / "metrics.jsonl"
    write_rows(path)
    stop = threading.Event()

    def grow() -> None:
        step = 10
        with open(path, "ab") as fh:
            while not stop.is_set():
                fh.write(json.dumps({"kind": "train", "step": step, "loss": 1.0, "time": step}).encode() * 1 + b"\n")
                fh.write(b"x" * 65536)  # and an endless line in between
                fh.flush()
                step += 1

    writer = threading.Thread(target=grow, daemon=True)
    writer.start()
    try:
        time.sleep(0.3)
        code, out, err = cli(capsys, "status", "victim")
    finally:
        stop.set()
        writer.join()
    no_pod_bytes(out + err)
    assert code == 0, err


@pytest.mark.parametrize("name", ["metrics.jsonl", "console.log", "status.json", "prepare.jsonl"])
def test_a_fifo_in_place_of_a_run_file_never_blocks(name, run_dir, capsys):
    write_rows(run_dir / "metrics.jsonl")
    (run_dir / "console.log").write_text("ended\n")
    os.unlink(run_dir / name) if (run_dir / name).exists() else None
    os.mkfifo(run_dir / name)
    result: list = []
    t = threading.Thread(target=lambda: result.append(cli(capsys, "status", "victim")), daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), f"status blocked on a FIFO named {name}"
    code, out, err = result[0]
    no_pod_bytes(out + err)
    assert len([ln for ln in err.splitlines() if ln.startswith("Error:")]) <= 1


def test_clean_removes_every_escape_and_keeps_text():
    assert clean(f"a{ESCAPES}b\tc\nd é 日本 [x]") == "ab\tc\nd é 日本 [x]"
    assert clean("\x1b") == "" and clean("\x1b[") == "" and clean("\x9d0;t") == ""


@pytest.mark.parametrize("command", [("tail", "victim", "--no-follow"), ("status", "victim")])
def test_an_endless_console_log_before_the_first_step_does_not_keep_the_command_reading(command, run_dir, capsys):
    (run_dir / "metrics.jsonl").write_text("")  # no row yet: what the run does is read from its logs
    log = run_dir / "console.log"
    stop = threading.Event()

    def grow() -> None:
        with open(log, "ab") as fh:
            while not stop.is_set():
                fh.write(b"compiling " + ESCAPES.encode() + b" " + b"x" * 4096 + b"\n")
                fh.flush()

    writer = threading.Thread(target=grow, daemon=True)
    writer.start()
    try:
        time.sleep(0.3)
        result: list = []
        t = threading.Thread(target=lambda: result.append(cli(capsys, *command)), daemon=True)
        t.start()
        t.join(120)
        assert not t.is_alive(), "the command kept reading a growing log"
    finally:
        stop.set()
        writer.join()
    code, out, err = result[0]
    no_pod_bytes(out + err)
