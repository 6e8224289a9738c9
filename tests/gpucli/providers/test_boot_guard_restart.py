"""The boot guard at a container that starts again (issue 41 rule 1; gpucli/providers/bootguard.py), run as a
real process against the emulators with the pod's own key: a run folder that already holds the run is
only ever stopped, never terminated; ``.hold`` keeps a pod being read up; RunPod's pod key refused by
REST v2 falls back to GraphQL (issue 41 rule 2); a 409 for a stop of a pod already EXITED is done."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucli.providers.bootguard import guard_code, guard_command
from gpucli.providers.clients import get_provider
from gpucli.providers.http import USER_AGENT, RetryPolicy
from gpucli.providers.query import parse_query
from tests.gpucli.providers.test_clients import spec_for

FAST = RetryPolicy(max_attempts=2, base_delay_s=0.001, max_delay_s=0.005, deadline_s=5)
QUERY = {"vast": "gpu_name=RTX_3090 num_gpus=1", "runpod": "gpu_ram>=20 num_gpus=1"}


def _pod(emu, provider: str, client_key) -> str:
    client = get_provider(provider, policy=FAST)
    offer = client.search_offers(parse_query(QUERY[provider]))[0]
    return client.create(spec_for(offer, client_key[1])).instance_id


def _guard(emu, provider: str, pod_id: str, wd: Path, home: Path, window_s: float) -> subprocess.Popen:
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    env.update({"RUNPOD_POD_ID": pod_id, "RUNPOD_API_KEY": emu.pod_key_of(pod_id)} if provider == "runpod"
               else {"CONTAINER_ID": pod_id, "CONTAINER_API_KEY": emu.pod_key_of(pod_id)})
    return subprocess.Popen([sys.executable, "-c", guard_code(), provider, str(wd), str(window_s), emu.url,
                             USER_AGENT], env=env)


def _held_folder(tmp_path: Path) -> Path:
    """A run folder as a run left it: checkpoints, an old watchdog verdict (not a hand-over)."""
    wd = tmp_path / "run"
    (wd / "checkpoints" / "step_000010").mkdir(parents=True)
    (wd / "checkpoints" / "step_000010" / "model.safetensors").write_bytes(b"weights")
    (wd / "watchdog.json").write_text('{"state": "done"}')
    old = time.time() - 3600
    os.utime(wd / "watchdog.json", (old, old))
    return wd


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_a_restarted_pod_that_holds_the_run_is_stopped_never_terminated(provider, request, client_key, tmp_path):
    emu = request.getfixturevalue(f"{provider}_emulator")
    pod_id = _pod(emu, provider, client_key)
    wd = _held_folder(tmp_path)
    proc = _guard(emu, provider, pod_id, wd, tmp_path, window_s=2)
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    ended = [e for e in emu.ledger.ended(pod_id) if e.event in ("stopped", "terminated")]
    assert [(e.event, e.by) for e in ended] == [("stopped", "pod-key")]
    assert pod_id in emu.ledger.alive() and (wd / "checkpoints" / "step_000010" / "model.safetensors").exists()
    text = (tmp_path / ".gpucli-boot-guard.log").read_text()
    assert "never terminate" in text and "stopping the pod" in text and "stopped (" in text
    emu.end_pod(pod_id, "terminated", "test")


def test_a_hold_keeps_a_restarted_pod_up_while_it_is_read(vast_emulator, client_key, tmp_path):
    pod_id = _pod(vast_emulator, "vast", client_key)
    wd = _held_folder(tmp_path)
    proc = _guard(vast_emulator, "vast", pod_id, wd, tmp_path, window_s=2)
    try:
        hold_until = time.monotonic() + 5  # longer than the window: only the hold keeps the pod
        while time.monotonic() < hold_until:
            (wd / ".hold").touch()
            assert proc.poll() is None and not vast_emulator.pods[pod_id].stopped
            time.sleep(0.3)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert vast_emulator.pods[pod_id].stopped and pod_id in vast_emulator.ledger.alive()
    vast_emulator.end_pod(pod_id, "terminated", "test")


def test_runpod_pod_key_refused_by_rest_v2_ends_the_pod_through_graphql(runpod_emulator, client_key, tmp_path):
    emu = runpod_emulator
    emu.pod_key_rest_v2 = False  # v2 "may return 403 when a valid key lacks access"
    pod_id = _pod(emu, "runpod", client_key)
    wd = tmp_path / "run"
    wd.mkdir()
    proc = _guard(emu, "runpod", pod_id, wd, tmp_path, window_s=1)
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    (ended,) = [e for e in emu.ledger.ended(pod_id) if e.event in ("stopped", "terminated")]
    assert (ended.event, ended.by) == ("terminated", "pod-key")  # nothing of the run: terminated
    text = (tmp_path / ".gpucli-boot-guard.log").read_text()
    assert "HTTP 403" in text and "terminated (GraphQL" in text


def test_runpod_stop_of_a_pod_already_exited_is_done(runpod_emulator, client_key, tmp_path):
    emu = runpod_emulator
    pod_id = _pod(emu, "runpod", client_key)
    emu.end_pod(pod_id, "stopped", "test")  # stopped already: v2 answers the stop 409 (openapi podAction)
    wd = _held_folder(tmp_path)
    proc = _guard(emu, "runpod", pod_id, wd, tmp_path, window_s=1)
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert "stopped (REST v2 POST" in (tmp_path / ".gpucli-boot-guard.log").read_text()
    assert ("podAction", {"id": pod_id, "action": "stop"}) in emu.calls
    assert not any(op == "deletePod" for op, _ in emu.calls)
    emu.end_pod(pod_id, "terminated", "test")


def test_the_vast_onstart_stays_under_vasts_limit():
    """onstart is at most 4048 characters (vast-ai/docs api-reference/openapi.yaml "Key Quirks")."""
    from gpucli.providers.onstart import onstart_hook

    wd = "gpucli-runs/" + "r" * 64
    line = guard_command("vast", wd, 1800, "https://console.vast.ai", USER_AGENT)
    onstart = "mkdir -p ~/.ssh && chmod 700 ~/.ssh && echo " + "k" * 120 + " >> ~/.ssh/authorized_keys; " \
              + line + "; " + onstart_hook(wd)
    assert len(onstart) <= 4048, len(onstart)
