"""Webhook alerts for your own code: jobrun.py, laid out as the launch uploads it (its files and the
bundled trainer's senders flat in one folder, no gpucli or trainer package importable), posts its
events to a local receiver, with the URL from the env file as the bundled trainer reads it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpucli.run.starting.jobs.own import ALERT_SENDERS, JOB_FILES
from tests.support.receiver import Receiver

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.stop()


def _pod(tmp_path: Path, url: str) -> tuple[Path, Path, Path]:
    wd = tmp_path / "wd"
    (wd / "code").mkdir(parents=True)
    for name in JOB_FILES:
        shutil.copyfile(REPO / "gpucli" / "pod" / name, wd / name)
    for name, rel in ALERT_SENDERS.items():
        shutil.copyfile(REPO / "trainer" / rel, wd / name)
    env_file = wd / "env"
    env_file.write_text(f"export GPUCLI_WEBHOOK_URL='{url}'\n")
    env_file.chmod(0o600)
    return wd, wd / "code", env_file


def _run(wd: Path, code: Path, env_file: Path, cmd: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "GPUCLI_WEBHOOK_URL", "TELEGRAM_BOT_TOKEN", "TELEGRAM_CHAT_ID")}
    # -I: isolated, so neither gpucli nor the trainer can be imported, as on the pod
    return subprocess.run([sys.executable, "-I", str(wd / "jobrun.py"), "--run-dir", str(wd), "--cwd", str(code),
                           "--cmd", cmd, "--gpus", "0", "--name", "mine", "--env-file", str(env_file)],
                          env=env, capture_output=True, text=True, timeout=120)


def test_own_code_posts_started_and_failed_with_its_last_lines(tmp_path, receiver):
    wd, code, env_file = _pod(tmp_path, f"slack+{receiver.base}/hook/secret-part")
    (code / "job.py").write_text("print('step 1 loss 5.0')\nraise SystemExit('out of patience')\n")
    res = _run(wd, code, env_file, "python job.py")
    assert res.returncode == 1, res.stderr
    texts = [json.loads(r["body"])["text"] for r in receiver.requests]  # the Slack shape: {"text"}
    assert all(r["path"] == "/hook/secret-part" for r in receiver.requests)
    started = [t for t in texts if "*mine*: started" in t]
    failed = [t for t in texts if "out of patience" in t]  # the final alert may jump the queue: no order pinned
    assert len(texts) == 2 and len(started) == 1 and "python job.py" in started[0] and len(failed) == 1
    assert "mine" in failed[0]
    assert "secret-part" not in res.stderr + res.stdout  # the URL is a credential: never in the logs


def test_own_code_posts_its_finish_and_a_loss_spike(tmp_path, receiver):
    wd, code, env_file = _pod(tmp_path, f"{receiver.base}/any")
    lines = [f"iter {i}: loss 1.0000, time 1.00ms, mfu 1.00%" for i in range(8)]  # nanoGPT's format
    lines.append("iter 8: loss 9.0000, time 1.00ms, mfu 1.00%")
    (code / "log.txt").write_text("\n".join(lines) + "\n")
    res = _run(wd, code, env_file, "cat log.txt")
    assert res.returncode == 0, res.stderr
    bodies = [json.loads(r["body"]) for r in receiver.requests]
    assert all(b["source"] == "gpucli" for b in bodies)  # the generic JSON shape
    texts = [b["text"] for b in bodies]
    assert any("started" in t for t in texts) and any("loss spike at step 8" in t for t in texts)
    assert any("finished" in t for t in texts)  # the final alert jumps the queue at close: order not pinned


def test_a_webhook_that_never_answers_never_holds_the_job(tmp_path, receiver):
    receiver.hang.set()
    wd, code, env_file = _pod(tmp_path, f"{receiver.base}/slow")
    (code / "job.py").write_text("open('ran', 'w').write('yes')\nprint('done')\n")
    res = _run(wd, code, env_file, "python job.py")
    assert res.returncode == 0, res.stderr
    assert (code / "ran").read_text() == "yes"
    assert json.loads((wd / "status.json").read_text())["state"] == "finished"
    assert receiver.requests  # it did try
