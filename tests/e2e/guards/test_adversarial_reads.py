"""What an adversarial pod or a damaged record can make gpucli do (issue 41 point 9), over a real sshd.

Every read of what a pod writes is bounded; a frozen pod is one line in ``status``; a garbage file
listing is a one-line error in ``fetch-best``; a run record with a price that is a string is a one-line
"not a gpucli run record" in ``status`` and ``down``, never "internal error".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from gpucli.errors import TransferError
from gpucli.run.watch import monitor
from gpucli.runs import records as runs
from gpucli.ssh.remote import Remote, SshTarget
from gpucli.ssh.transfer import parse_manifest
from tests.support.cli import cli


def _ssh_launch(capsys, tmp_path: Path, sshd, client_key, name: str, script: str) -> None:
    code_dir = tmp_path / f"code-{name}"
    code_dir.mkdir()
    (code_dir / "job.py").write_text(script)
    code, out, err = cli(capsys, "launch", "--code", str(code_dir), "--run", f"{sys.executable} job.py", "--name", name,
                         "--provider", "ssh", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}",
                         "--identity", str(client_key[0]), "--python", sys.executable,
                         "--workdir", str(tmp_path / "pod" / name))
    assert code == 0, err


def test_metrics_that_never_end_are_read_bounded(sshd, client_key, tmp_path, monkeypatch):
    workdir = tmp_path / "flood"
    workdir.mkdir()
    row = json.dumps({"kind": "train", "step": 1, "loss": 2.0, "pad": "x" * 200}).encode() + b"\n"
    with open(workdir / "metrics.jsonl", "wb") as fh:
        fh.write(json.dumps({"kind": "val", "step": 0, "val_loss": 3.0}).encode() + b"\n")
        fh.write(row * 40_000)  # ~9 MB of rows
        fh.write(b"{" + b"9" * (3 << 20))  # and a "row" that never ends
    monkeypatch.setattr(monitor, "MAX_ROWS_BYTES", 4 << 20)
    monkeypatch.setattr(monitor, "MAX_ROWS_PER_KIND", 1000)
    target = SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))
    with Remote(target) as host:
        tracemalloc.start()
        rows = monitor.read_all_rows(host, str(workdir))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert 0 < len(rows) <= 1000 and all(r["kind"] == "train" for r in rows)
    assert peak < 40 << 20  # bounded by the byte and row caps, not by the file
    assert monitor.MAX_ROWS_BYTES <= 4 << 20


def test_the_default_bounds_are_far_below_a_flood():
    assert monitor.MAX_ROWS_BYTES <= 64 << 20 and monitor.MAX_ROWS_PER_KIND * monitor.MAX_KINDS <= 1_000_000
    assert monitor.SMALL_FILE_BYTES <= 1 << 20


def test_a_frozen_pod_is_one_line_in_status(capsys, tmp_path, sshd, client_key):
    _ssh_launch(capsys, tmp_path, sshd, client_key, "frozen", "import time\ntime.sleep(300)\n")
    os.killpg(sshd.proc.pid, signal.SIGSTOP)  # the machine freezes: TCP still accepted, nothing answers
    try:
        # a real gpucli process: what it prints on stderr is what a user sees (no test log capture)
        proc = subprocess.run([sys.executable, "-m", "gpucli", "status", "frozen", "--json"], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    finally:
        os.killpg(sshd.proc.pid, signal.SIGCONT)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "paramiko" not in proc.stderr.lower()
    state = json.loads(proc.stdout)["state"]
    assert state.startswith("unreachable (") and "\n" not in state and "no SSH banner" in state
    assert "Traceback" not in state and "paramiko" not in state.lower()
    assert cli(capsys, "down", "frozen")[0] == 0


@pytest.mark.parametrize("garbage", [b"not a listing\0", b"12 x\0", b"abc 1.0 file\0", b"1 " + b"9" * 40 + b" f\0"])
def test_a_garbage_listing_is_a_transfer_error(garbage):
    with pytest.raises(TransferError, match="not what find prints"):
        parse_manifest(b"5 1700000000.5 ok.pt\0" + garbage)
    assert parse_manifest(b"5 1700000000.5 ok.pt\0")["ok.pt"].size == 5


def test_fetch_best_over_a_garbage_listing_is_one_line(capsys, tmp_path, client_key):
    from tests.support.sshd import SshServer

    fake_bin, mark = tmp_path / "fakebin", tmp_path / "hostile"
    fake_bin.mkdir()
    # the host's find prints garbage once the host turns hostile (or its find breaks)
    real_find = subprocess.run(["sh", "-c", "command -v find"], capture_output=True, text=True).stdout.strip()
    (fake_bin / "find").write_text(f"#!/bin/sh\nif [ -e {mark} ]; then printf 'garbage without fields\\0'; "
                                   f"else exec {real_find} \"$@\"; fi\n")
    (fake_bin / "find").chmod(0o755)
    server = SshServer.start(tmp_path / "sshd", authorized_keys=[client_key[1]],
                             set_env={"PATH": f"{fake_bin}:{os.environ['PATH']}"})
    try:
        code_dir = tmp_path / "code-garbage"
        code_dir.mkdir()
        (code_dir / "job.py").write_text("import os\nos.makedirs('out', exist_ok=True)\n"
                                         "open('out/step_10.pt', 'wb').write(b'w' * 10)\n")
        code, out, err = cli(capsys, "launch", "--code", str(code_dir), "--run", f"{sys.executable} job.py",
                             "--checkpoints", "out", "--name", "garbage", "--provider", "ssh", "--host",
                             f"{server.user}@127.0.0.1:{server.port}", "--identity", str(client_key[0]),
                             "--python", sys.executable, "--workdir", str(tmp_path / "pod" / "garbage"))
        assert code == 0, err
        mark.write_text("")
        code, out, err = cli(capsys, "fetch-best", "garbage", "--dest", str(tmp_path / "d"))
        assert code != 0
        assert "internal error" not in err and "ValueError" not in err and "Traceback" not in err
        assert "not what find prints" in err
    finally:
        mark.unlink(missing_ok=True)
        cli(capsys, "down", "garbage")
        server.stop()


def test_a_record_whose_price_is_a_string_is_one_line(capsys, tmp_path):
    record = runs.RunRecord(name="strprice", provider="ssh", created_at=runs.now_iso(), profile="cpu",
                            phase="fast", model="tiny", workdir=str(tmp_path / "w"), status="running", n_gpus=1,
                            gpu=None)
    path = runs.save(record)
    data = json.loads(path.read_text())
    data["price_per_hour_usd"] = "0.50"  # a record written by hand, or damaged
    path.write_text(json.dumps(data))
    for cmd in (["status", "strprice"], ["down", "strprice"]):
        code, out, err = cli(capsys, *cmd)
        assert code != 0
        assert "internal error" not in err and "Traceback" not in err and "TypeError" not in err
        assert "not a gpucli run record" in err and "price_per_hour_usd" in err
