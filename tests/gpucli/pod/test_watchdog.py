"""The pod-side watchdog as a real process watching a real process group (no provider here)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

WATCHDOG = Path(__file__).resolve().parents[3] / "gpucli" / "pod" / "watchdog.py"


def start_group(script: str) -> subprocess.Popen:
    """A stand-in trainer: its own session (process group), like start_detached makes."""
    return subprocess.Popen([sys.executable, "-c", script], start_new_session=True)


def run_watchdog(run_dir: Path, pgid: int, *extra: str, timeout: float = 60) -> dict:
    proc = subprocess.run([sys.executable, str(WATCHDOG), "--run-dir", str(run_dir), "--pgid", str(pgid),
                           "--provider", "local", "--poll-s", "0.2", "--grace-s", "2", *extra],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads((run_dir / "watchdog.json").read_text())


def test_finished_run_is_seen(tmp_path):
    (tmp_path / "status.json").write_text(json.dumps({"state": "finished", "reason": "max_steps"}))
    p = start_group("import time; time.sleep(0.5)")
    state = run_watchdog(tmp_path, p.pid)
    p.wait()
    assert state["verdict"] == "finished (max_steps)" and state["state"] == "done"


def test_crashed_run_is_seen(tmp_path):
    p = start_group("import time, sys; time.sleep(0.5); sys.exit(3)")
    state = run_watchdog(tmp_path, p.pid)
    p.wait()
    assert state["verdict"] == "crashed"


def test_hung_trainer_is_terminated_then_killed(tmp_path):
    # Ignores SIGTERM, like a trainer wedged in a collective; writes one row, then nothing.
    script = ("import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              f"pathlib.Path({str(tmp_path / 'metrics.jsonl')!r}).write_text('{{}}\\n'); time.sleep(600)")
    p = start_group(script)
    state = run_watchdog(tmp_path, p.pid, "--stall-minutes", "0.02")  # 1.2 s without a row
    assert p.wait(timeout=10) == -signal.SIGKILL
    assert state["verdict"].startswith("stalled")
    log = (tmp_path / "watchdog.log").read_text()
    assert "SIGTERM" in log and "SIGKILL" in log


def test_limit_is_a_backstop(tmp_path):
    # Still writing rows, but past the dollar limit: $3600/h and a $2 budget is 2 seconds.
    script = ("import time, pathlib; p = pathlib.Path(" + repr(str(tmp_path / "metrics.jsonl")) + ")\n"
              "while True:\n    p.write_text('{}\\n'); time.sleep(0.1)")
    p = start_group(script)
    state = run_watchdog(tmp_path, p.pid, "--budget-usd", "2", "--price-per-hour-usd", "3600")
    assert p.wait(timeout=10) == -signal.SIGTERM
    assert state["verdict"].startswith("limit reached")


def test_cloud_provider_without_pod_credentials_says_so(tmp_path, monkeypatch):
    env = {k: v for k, v in os.environ.items() if k not in ("RUNPOD_POD_ID", "RUNPOD_API_KEY")}
    env["GPUCLI_POD_ENVIRON"] = str(tmp_path / "no-such-environ")
    p = start_group("pass")
    p.wait()
    proc = subprocess.run([sys.executable, str(WATCHDOG), "--run-dir", str(tmp_path), "--pgid", str(p.pid),
                           "--provider", "runpod", "--poll-s", "0.2"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 1
    log = (tmp_path / "watchdog.log").read_text()
    assert "RUNPOD_POD_ID / RUNPOD_API_KEY not in the pod environment" in log
    assert "COULD NOT END THE POD" in log


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_reads_pod_scoped_credentials_from_pid1_style_environ(tmp_path, provider):
    sys.path.insert(0, str(WATCHDOG.parent))
    try:
        import importlib

        wd = importlib.import_module("watchdog")
    finally:
        sys.path.pop(0)
    environ = tmp_path / "environ"
    environ.write_bytes(b"PATH=/usr/bin\0RUNPOD_POD_ID=pod123\0RUNPOD_API_KEY=scoped\0CONTAINER_ID=77\0"
                        b"CONTAINER_API_KEY=c-scoped\0")
    old = os.environ.get("GPUCLI_POD_ENVIRON")
    os.environ["GPUCLI_POD_ENVIRON"] = str(environ)
    try:
        env = wd.pod_environ()
    finally:
        if old is None:
            os.environ.pop("GPUCLI_POD_ENVIRON")
        else:
            os.environ["GPUCLI_POD_ENVIRON"] = old
    assert env["RUNPOD_POD_ID"] == "pod123" and env["CONTAINER_API_KEY"] == "c-scoped"


# --- setup_pod.sh: a pod that cannot verify TLS is refused before training starts (runpod/runpodctl#149) ---
SETUP = WATCHDOG.with_name("setup_pod.sh")


def run_setup(tmp_path: Path, pid1: bytes, *, certs: bool) -> subprocess.CompletedProcess:
    environ = tmp_path / "environ"
    environ.write_bytes(pid1)
    env = dict(os.environ, GPUCLI_POD_ENVIRON=str(environ))
    if not certs:  # what an image without ca-certificates looks like to OpenSSL
        (tmp_path / "empty.pem").write_text("")
        (tmp_path / "certs").mkdir()
        env.update(SSL_CERT_FILE=str(tmp_path / "empty.pem"), SSL_CERT_DIR=str(tmp_path / "certs"))
    # what a launch writes beside it: the pod's environment builder and the trainer's pin file
    shutil.copy(SETUP.with_name("envbuild.py"), tmp_path)
    shutil.copy(Path(__file__).resolve().parents[3] / "trainer" / "requirements.txt", tmp_path)
    return subprocess.run(["sh", str(SETUP), sys.executable, str(tmp_path / "envs")], capture_output=True,
                          text=True, env=env, timeout=600, cwd=tmp_path)


@pytest.mark.parametrize("pid1", [b"RUNPOD_POD_ID=abc\0RUNPOD_API_KEY=k\0", b"CONTAINER_ID=7\0CONTAINER_API_KEY=k\0"])
def test_setup_refuses_a_pod_without_ca_certificates(tmp_path, pid1):
    proc = run_setup(tmp_path, pid1, certs=False)
    assert proc.returncode != 0
    (line,) = proc.stderr.strip().splitlines()  # one line, as the launch shows it
    assert "no CA certificates" in line and "cannot verify TLS" in line and "runpodctl#149" in line
    assert "installing" not in proc.stdout  # said before anything else is done


def test_setup_only_warns_on_a_machine_of_the_users_and_passes_with_certificates(tmp_path):
    proc = run_setup(tmp_path, b"PATH=/usr/bin\0", certs=False)
    assert proc.returncode == 0, proc.stderr
    assert "setup_pod: warning: no CA certificates" in proc.stderr
    proc = run_setup(tmp_path, b"RUNPOD_POD_ID=abc\0", certs=True)
    assert proc.returncode == 0, proc.stderr
    assert "CA certificates" not in proc.stderr
    # this Python has the pinned packages: it is used as it is, nothing built
    assert '"source": "image"' in proc.stdout.splitlines()[-1] and not (tmp_path / "envs").exists()
