from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

JOBRUN = Path(__file__).resolve().parents[3] / "gpucli" / "pod" / "jobrun.py"
WATCHDOG = Path(__file__).resolve().parents[3] / "gpucli" / "pod" / "watchdog.py"


class Job:
    """One jobrun.py run in a temp run folder (code in RUN/code, as the launch lays it out)."""

    def __init__(self, root: Path) -> None:
        self.run_dir = root / "run"
        self.code = self.run_dir / "code"
        self.code.mkdir(parents=True)
        self.proc: subprocess.Popen | None = None

    def args(self, cmd: str, *extra: str) -> list[str]:
        return [sys.executable, str(JOBRUN), "--run-dir", str(self.run_dir), "--cwd", str(self.code),
                "--cmd", cmd, "--gpus", "0", *extra]

    def run(self, cmd: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self.args(cmd, *extra), capture_output=True, text=True, timeout=timeout)

    def start(self, cmd: str, *extra: str) -> subprocess.Popen:
        # Its own session, as start_detached starts it: the watchdog signals that whole group.
        self.proc = subprocess.Popen(self.args(cmd, *extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self.proc

    def rows(self) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def kind(self, kind: str) -> list[dict]:
        return [r for r in self.rows() if r.get("kind") == kind]

    def events(self, name: str) -> list[dict]:
        return [r for r in self.rows() if r.get("event") == name]

    def status(self) -> dict:
        return json.loads((self.run_dir / "status.json").read_text())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)


@pytest.fixture
def job(tmp_path):
    j = Job(tmp_path)
    yield j
    j.stop()
