"""The watchdog's idle-GPU stop and slow-run check, as real processes: the watchdog script watching a
real process group, ``nvidia-smi`` a script on PATH that prints what the real one prints for the query."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from gpucli.pod import slowrun

WATCHDOG = Path(__file__).resolve().parents[3] / "gpucli" / "pod" / "watchdog.py"


def fake_smi(folder: Path, utils: list[int]) -> dict[str, str]:
    """A ``nvidia-smi`` first on PATH answering the index,utilization query (csv,noheader,nounits)."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "nvidia-smi"
    lines = "\\n".join(f"{i}, {u}" for i, u in enumerate(utils))
    exe.write_text(f"#!/bin/sh\nprintf '{lines}\\n'\n")
    exe.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def trainer(run_dir: Path, tok_per_s: float | None = None) -> subprocess.Popen:
    """A stand-in job in its own session writing a train row every 0.1 s (so it never stalls); on SIGTERM
    it writes its checkpoint marker and exits, as the trainer writes its emergency checkpoint."""
    row = {"kind": "train", "step": 1, "tok_per_s": tok_per_s or 1000.0}
    script = (
        "import json, signal, sys, time, pathlib\n"
        f"d = pathlib.Path({str(run_dir)!r})\n"
        "def bye(*_):\n    (d / 'ckpt').write_text('saved'); sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "while True:\n"
        f"    with open(d / 'metrics.jsonl', 'a') as fh: fh.write(json.dumps(dict({row!r}, time=time.time())) + '\\n')\n"
        "    time.sleep(0.1)\n")
    return subprocess.Popen([sys.executable, "-c", script], start_new_session=True)


def watchdog(run_dir: Path, pgid: int, *extra: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, str(WATCHDOG), "--run-dir", str(run_dir), "--pgid", str(pgid),
                           "--provider", "local", "--poll-s", "0.2", "--grace-s", "5", *extra],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads((run_dir / "watchdog.json").read_text())


def test_idle_gpus_end_the_run_with_a_checkpoint(tmp_path):
    env = fake_smi(tmp_path / "bin", [0, 3])  # both at or under 5 %
    p = trainer(tmp_path)
    state = watchdog(tmp_path, p.pid, "--idle-stop-minutes", "0.03", env=env)  # 1.8 s
    assert p.wait(timeout=10) == 143
    assert (tmp_path / "ckpt").read_text() == "saved"
    assert state["verdict"].startswith("idle: GPUs at 3 % for ")
    assert (tmp_path / "stop_reason").read_text().startswith("by watchdog: idle: GPUs at 3 %")
    log = (tmp_path / "watchdog.log").read_text()
    assert "SIGTERM" in log and "idle stop: every GPU at or under 5 %" in log


def test_one_busy_gpu_keeps_the_run(tmp_path):
    env = fake_smi(tmp_path / "bin", [0, 60])
    p = trainer(tmp_path)
    state = watchdog(tmp_path, p.pid, "--idle-stop-minutes", "0.02", "--max-hours", "0.001", env=env)  # 3.6 s cap
    p.wait(timeout=10)
    assert state["verdict"].startswith("limit reached"), state


def test_no_nvidia_smi_no_idle_stop(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path / "empty")}  # a CPU-only host: nothing on PATH answers
    p = trainer(tmp_path)
    state = watchdog(tmp_path, p.pid, "--idle-stop-minutes", "0.01", "--max-hours", "0.0008", env=env)
    p.wait(timeout=10)
    assert state["verdict"].startswith("limit reached")
    assert "no nvidia-smi on this host" in (tmp_path / "watchdog.log").read_text()


def test_slow_run_is_said_once_and_replaced_when_asked(tmp_path):
    p = trainer(tmp_path, tok_per_s=12300.0)
    state = watchdog(tmp_path, p.pid, "--planned-tokens-per-s", "30000", "--slow-below", "0.7", "--replace-slow")
    assert p.wait(timeout=10) == 143 and (tmp_path / "ckpt").exists()
    assert state["verdict"] == "slow: 41 % of plan (12.3k tok/s measured, 30.0k planned)"
    said = json.loads((tmp_path / "slow.json").read_text())
    assert said["measured_tokens_per_s"] == 12300.0 and said["replace"] is True
    assert (tmp_path / "watchdog.log").read_text().count("slow: 41 % of plan") == 2  # said, then the run over


def test_slow_run_without_replace_goes_on(tmp_path):
    p = trainer(tmp_path, tok_per_s=12300.0)
    state = watchdog(tmp_path, p.pid, "--planned-tokens-per-s", "30000", "--slow-below", "0.7", "--max-hours", "0.0008")
    assert p.wait(timeout=10) == 143
    assert state["verdict"].startswith("limit reached")
    assert json.loads((tmp_path / "slow.json").read_text())["replace"] is False


def test_measured_speed_skips_warmup_and_each_restart():
    rows = [{"kind": "event", "event": "started"}] + [{"kind": "train", "tok_per_s": v} for v in (1, 2, 3, 10, 11, 12, 13, 14)]
    assert slowrun.measured_tps(rows) == 12
    rows += [{"kind": "event", "event": "resumed"}, *({"kind": "train", "tok_per_s": 5} for _ in range(7))]
    assert slowrun.measured_tps(rows) is None  # warm-up again: 3 left out, 4 left, 5 needed
    rows.append({"kind": "train", "tok_per_s": 5})
    assert slowrun.measured_tps(rows) == 5
    assert slowrun.slow_words(rows, None, 0.7) is None  # no plan: nothing said
    assert slowrun.slow_words(rows, 6.0, 0.7) is None and slowrun.slow_words(rows, 10.0, 0.7).startswith("slow: 50 %")



def test_slow_run_alerts_once_through_the_trainers_sender(tmp_path, telegram_emulator):
    """The alert goes out through the bundled trainer's Telegram sender in the run's code folder, with the
    token and chat from the run's env file (as the launch writes it: shell-quoted, 0600)."""
    run_dir = tmp_path / "gpucli-runs" / "slow-alert"
    (run_dir / "code").mkdir(parents=True)
    (run_dir / "code" / "trainer").symlink_to(Path(__file__).resolve().parents[3] / "trainer")
    env = {"TELEGRAM_BOT_TOKEN": telegram_emulator.token, "TELEGRAM_CHAT_ID": telegram_emulator.chat_id,
           "TELEGRAM_API_BASE": telegram_emulator.url}
    (run_dir / "env").write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TELEGRAM_")}  # only the env file counts
    p = trainer(run_dir, tok_per_s=12300.0)
    state = watchdog(run_dir, p.pid, "--planned-tokens-per-s", "30000", "--slow-below", "0.7", "--max-hours", "0.0015",
                     env=clean)
    p.wait(timeout=10)
    assert state["verdict"].startswith("limit reached")
    texts = telegram_emulator.texts()
    assert texts == ["*slow-alert*: slow: 41 % of plan (12.3k tok/s measured, 30.0k planned)"], texts
    assert telegram_emulator.token not in (run_dir / "watchdog.log").read_text()
