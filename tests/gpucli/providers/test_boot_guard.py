"""The boot guard (gpucli/providers/bootguard.py; issue 28 rule 1), run as a real process against the vast.ai
emulator with an instance's own scoped key in its environment: the launch's heartbeat keeps the pod,
the watchdog's hand-over ends the guard, silence ends the pod through the provider's API. The key is
never on the guard's command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gpucli.providers.bootguard import guard_code, guard_command, start_args
from gpucli.providers.clients import get_provider
from gpucli.providers.http import USER_AGENT, RetryPolicy
from gpucli.providers.query import parse_query
from tests.gpucli.providers.test_clients import spec_for
from tests.support.cli import wait_for

FAST = RetryPolicy(max_attempts=2, base_delay_s=0.001, max_delay_s=0.005, deadline_s=5)


def _instance(emu, client_key) -> str:
    vp = get_provider("vast", policy=FAST)
    return vp.create(spec_for(vp.search_offers(parse_query("gpu_name=RTX_3090 num_gpus=1"))[0], client_key[1])).instance_id


def _guard(emu, pod_id: str, wd: Path, home: Path, window_s: int) -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "CONTAINER_ID": pod_id,
           "CONTAINER_API_KEY": emu.pod_key_of(pod_id)}
    return subprocess.Popen([sys.executable, "-c", guard_code(), "vast", str(wd), str(window_s), emu.url, USER_AGENT],
                            env=env)


def test_silence_ends_the_pod_and_a_heartbeat_keeps_it(vast_emulator, client_key, tmp_path):
    pod_id = _instance(vast_emulator, client_key)
    wd = tmp_path / "run"
    wd.mkdir()
    proc = _guard(vast_emulator, pod_id, wd, tmp_path, window_s=2)
    try:
        assert vast_emulator.pod_key_of(pod_id) not in Path(f"/proc/{proc.pid}/cmdline").read_text()
        beat_until = time.monotonic() + 5  # longer than the window: only the heartbeat keeps the pod
        while time.monotonic() < beat_until:
            (wd / ".launching").touch()
            assert proc.poll() is None and pod_id in vast_emulator.ledger.alive()
            time.sleep(0.3)
        wait_for(lambda: pod_id not in vast_emulator.ledger.alive(), 60, "the guard ending the pod")
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    (ended,) = vast_emulator.ledger.ended(pod_id)
    assert ended.event == "terminated" and ended.by == "pod-key"  # its own key, not the account's
    assert "terminating the pod" in (tmp_path / ".gpucli-boot-guard.log").read_text()


def test_the_watchdogs_hand_over_ends_the_guard_not_the_pod(vast_emulator, client_key, tmp_path):
    pod_id = _instance(vast_emulator, client_key)
    wd = tmp_path / "run"
    wd.mkdir()
    (wd / "watchdog.json").write_text("{}")  # an old run's: not a hand-over
    os.utime(wd / "watchdog.json", (time.time() - 3600, time.time() - 3600))
    proc = _guard(vast_emulator, pod_id, wd, tmp_path, window_s=30)
    try:
        time.sleep(1.0)
        assert proc.poll() is None
        (wd / "watchdog.json").write_text('{"state": "launching"}')  # gpucli's watchdog runs
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert pod_id in vast_emulator.ledger.alive()
    assert "handed over" in (tmp_path / ".gpucli-boot-guard.log").read_text()
    vast_emulator.end_pod(pod_id, "terminated", "test")


def test_the_start_command_has_no_secret_and_keeps_runpods_start():
    line = guard_command("runpod", "/workspace/gpucli-runs/x", 660, "https://api.runpod.io", USER_AGENT)
    assert "API_KEY" not in line and "Bearer" not in line
    args = start_args(line)
    assert args.startswith("bash -c ") and args.endswith("exec /start.sh'")
