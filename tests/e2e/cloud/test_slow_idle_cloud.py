"""A slow run replaced and idle GPUs stopped, on the RunPod and vast.ai emulators' pods (real sshd, the
real tiny trainer on CPU, the real watchdog ending the pod with the pod's own key).

The plan is for the profile's GPU (an RTX 4090) while the emulator's pod trains on a CPU: every run here is
far under its plan, so the slow check has something true to say."""

from __future__ import annotations

import json
import os

import pytest

from gpucli.plan.catalog import load_catalog
from gpucli.run.life import lifecycle
from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import (
    assert_nothing_running,
    cli,
    emulator_for,
    launch,
    rows_of,
    wait_for,
)


def replaced_at(texts: list[str]) -> int:
    """The step of the newest checkpoint the watch mirrored before it replaced the pod."""
    before = texts[:next(i for i, t in enumerate(texts) if "on a new machine" in t)]
    mirrored = [t for t in before if t.startswith("mirrored step_")]
    return int(mirrored[-1].split("(step ")[1].split(")")[0]) if mirrored else 0


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_replace_slow_continues_on_a_new_pod_from_the_checkpoint(provider, request, capsys, tmp_path, monkeypatch):
    emu = emulator_for(request, provider)
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    name = f"slow-{provider}"
    code, _, err = launch(capsys, tmp_path, provider, name, "--replace-slow", "--stall-minutes", "30")
    assert code == 0, err
    first = runs.load(name)
    assert first.planned.tokens_per_s and first.limits.replace_slow and first.limits.slow_below == 0.7

    notices: list = []
    how = lifecycle.watch(name, load_catalog(), mirror=True, recover=False, poll_s=0.5, max_resumes=1,
                          on_notice=notices.append)
    texts = [n.text for n in notices]
    replaced = [t for t in texts if "on a new machine (1/1)" in t]
    assert replaced and "slow: " in replaced[0] and "% of plan (" in replaced[0], texts
    second = runs.load(name)
    assert second.instance_id != first.instance_id and second.previous_instances == (first.instance_id,), texts
    assert emu.ledger.ended(first.instance_id)  # the slow pod: its checkpoint copied home, then ended
    assert first.instance_id not in emu.ledger.alive()
    # The second pod is as slow (a CPU again), yet only one replacement was allowed: the run ends there,
    # by its steps when the tiny run gets through them first, else stopped with the watchdog's words.
    assert how == "ended" and (second.end_reason == "max_steps" or second.end_reason.startswith("slow: ")), (
        second.end_reason, texts)
    rows = rows_of(capsys, name)
    resumed = [r for r in rows if r.get("event") == "resumed"]
    assert resumed and resumed[-1]["step"] > 0  # continued from the slow pod's checkpoint, not from scratch
    assert resumed[0]["step"] >= replaced_at(texts)  # the slow pod's last (emergency) checkpoint, taken home
    code, _, err = cli(capsys, "down", name)
    assert code == 0, err
    assert_nothing_running(emu)  # 0 pods left billing


def test_slow_is_said_without_replacing(runpod_emulator, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    code, _, err = launch(capsys, tmp_path, "runpod", "slow-said")
    assert code == 0, err

    def said():
        code, out, _ = cli(capsys, "status", "slow-said", "--json")
        return json.loads(out).get("slow") if code == 0 else None

    slow = wait_for(said, 120, "status saying slow")
    assert slow.startswith("slow: ") and "tok/s measured" in slow and "planned)" in slow
    record = runs.load("slow-said")
    log = wait_for(lambda: "% of plan (" in (tmp_path / "pod" / "slow-said" / "watchdog.log").read_text(), 60,
                   "the watchdog's line")
    assert log and json.loads((tmp_path / "pod" / "slow-said" / "slow.json").read_text())["replace"] is False
    assert record.status == "running"
    code, _, err = cli(capsys, "down", "slow-said")
    assert code == 0, err
    assert_nothing_running(runpod_emulator)


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_idle_gpus_end_an_emulator_pod_with_a_checkpoint(provider, request, capsys, tmp_path, monkeypatch):
    """Every GPU at 0 % (a fake nvidia-smi first on the pod's PATH): the watchdog signals the trainer (its
    checkpoint), then stops the pod with the pod's own key, with the laptop doing nothing."""
    emu = emulator_for(request, provider)
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nvidia-smi").write_text("#!/bin/sh\nprintf '0, 0\\n'\n")
    (folder / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("GPUCLI_EMU_POD_PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "1")
    name = f"idle-{provider}"
    code, _, err = launch(capsys, tmp_path, provider, name, "--idle-stop", "5s", "--slow-below", "0",
                          "--no-preflight")  # the fake nvidia-smi answers only the idle check
    assert code == 0, err
    record = runs.load(name)
    wait_for(lambda: emu.ledger.ended(record.instance_id) or None, 180, "the watchdog to end the pod")
    (event,) = emu.ledger.ended(record.instance_id)
    assert event.event == "stopped" and event.by == "pod-key"
    run_dir = tmp_path / "pod" / name
    verdict = json.loads((run_dir / "watchdog.json").read_text())
    # (the emulator's stop takes the pod's processes, the watchdog too, before it writes "done")
    assert verdict["verdict"].startswith("idle: GPUs at 0 % for "), verdict
    finished = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"finished"' in x]
    assert finished and finished[-1]["reason"] == "signal"
    assert (run_dir / "checkpoints" / f"step_{finished[-1]['step']:06d}").is_dir()
    assert not (run_dir / "slow.json").exists()  # --slow-below 0: no slow check
    code, _, err = cli(capsys, "down", name)
    assert code == 0, err
    assert_nothing_running(emu)
