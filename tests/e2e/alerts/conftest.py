"""Fixtures for the Telegram tests: a small prepared corpus, one trainer run with every alert on
(against a module-wide emulator, watched with ``ps`` while it runs), and the CLI runner."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpucli.cli import render
from tests.support.telegram import TelegramEmulator, fields  # noqa: F401 - the alerts tests read messages with it
from tests.trainer.conftest import REPO, tiny_args, trainer_env

# Every alert in a 20-step run: stage 2 from step 10, checkpoints and validations at 10 and 20, a
# cost update every 0.11 s, and a spike factor so low that every logged step after the first 5 is
# a "spike" (the loss falls, so a real 2x spike cannot be forced without faking the loss).
ALERT_ARGS: dict[str, object] = {
    "training.stage1_steps": 10, "training.stage2_steps": 10, "training.stage2_seq_len": 32,
    "training.spike_factor": 0.1, "limits.price_per_hour_usd": 2.39, "notifications.cost_update_hours": "0.00003",
    "notifications.telegram.enabled": "true",
}


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    from trainer.data.loader import prepare

    out = tmp_path_factory.mktemp("tg_data")
    prepare([], out, "byte", val_split=0.1, max_bytes=150_000, log=lambda m: None)
    return out


def alert_args(data_dir: Path, out_dir: Path, **over: object) -> list[str]:
    return tiny_args(data_dir, out_dir, **{**ALERT_ARGS, **over})


def telegram_env(emu: TelegramEmulator, **extra: str) -> dict[str, str]:
    return trainer_env(TELEGRAM_API_BASE=emu.url, TELEGRAM_BOT_TOKEN=emu.token, TELEGRAM_CHAT_ID=emu.chat_id,
                       **extra)


@dataclass
class Run:
    out_dir: Path
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    ended_at: float  # time.time() when the process was seen gone (within ~0.3 s)
    ps_seen: list[str] = field(default_factory=list)


def run_watched(args: list[str], env: dict[str, str], out_dir: Path, timeout: float = 120, nproc: int = 1) -> Run:
    """Run the trainer as a subprocess (under torchrun when ``nproc`` > 1), sampling ``ps -eo args``
    while it is alive."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, *launcher, "-m", "trainer.train", *args], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps_seen: list[str] = []
    try:
        while p.poll() is None and time.monotonic() - t0 < timeout:
            ps_seen.append(subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout)
            time.sleep(0.3)
        out, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        ended_at = time.time()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return Run(out_dir, p.returncode, out, err, time.monotonic() - t0, ended_at, ps_seen)


@pytest.fixture(scope="session")
def alerts_run(data_dir, tmp_path_factory):
    """(emulator, Run) of one healthy 20-step run with every alert; the reference for the fault runs."""
    emu = TelegramEmulator().start()
    out = tmp_path_factory.mktemp("alerts") / "run"
    try:
        run = run_watched(alert_args(data_dir, out), telegram_env(emu), out)
        assert run.returncode == 0, run.stderr[-3000:]
        yield emu, run
    finally:
        emu.stop()


@pytest.fixture
def run(capsys):
    """``run(*args) -> (exit code, stdout, stderr)`` through gpucli's real entry point, in process."""
    from gpucli.cli.app import main

    def _run(*args: str) -> tuple[int, str, str]:
        render.reset_consoles()
        code = main(list(args))
        out, err = capsys.readouterr()
        render.reset_consoles()
        return code, out, err

    return _run
