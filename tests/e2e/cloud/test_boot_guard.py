"""The pod guards itself from its first moment (issue 28 rule 1): the create call carries the boot guard
(RunPod v2 ``args``, vast ``onstart``; gpucli/providers/bootguard.py), the emulators run a container's start
command when they start it (``run_start_commands``, tests/support/emulators/startcmd.py).

A launch SIGKILLed right after the create call, before any SSH, leaves a pod that ends itself by the
guard's deadline through its own scoped key; a launch that hands over to its watchdog is left alone."""

from __future__ import annotations

import signal

import pytest

from gpucli.providers.api import InstanceNotFound
from gpucli.providers.clients import get_provider
from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, emulator_for, launch
from tests.e2e.trust.test_launch_signals import record_of, start_launch
from tests.support.cli import cli, wait_for
from tests.support.emulators import PodBehaviour


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_a_pod_whose_launch_was_killed_before_ssh_ends_itself(provider, request, tmp_path, monkeypatch):
    emu = emulator_for(request, provider)
    emu.run_start_commands = True
    emu.behaviours.append(PodBehaviour(pending_polls=10**9))  # the launch keeps waiting for it
    monkeypatch.setenv("GPUCLI_BOOT_GUARD_S", "2")
    proc = start_launch(tmp_path, provider, "killed")
    try:
        wait_for(lambda: (r := record_of("killed")) is not None and r.instance_id and emu.ledger.created(), 90,
                 "the pod's creation")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    (created,) = emu.ledger.created()
    (body,) = [b for m, p, b in emu.requests if (m, p) == ("POST", "/v2/pods") or p.startswith("/api/v0/asks/")]
    start = body["args"] if provider == "runpod" else body["onstart"]
    assert "python3" in start and emu.api_key not in str(body)  # the guard rides the create call, no secret
    # The provider starts the container whether or not a launch is there to ask about it.
    emu.pods[created.pod_id].behaviour.pending_polls = 0
    client = get_provider(provider)

    def started_then_gone() -> bool:
        try:
            client.get(created.pod_id)
        except InstanceNotFound:
            return True
        return created.pod_id not in emu.ledger.alive()

    wait_for(started_then_gone, 90, "the boot guard ending the pod")
    (ended,) = emu.ledger.ended(created.pod_id)
    assert ended.event == "terminated" and ended.by == "pod-key"
    assert_nothing_running(emu)


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_a_launch_that_hands_over_is_not_ended_by_the_guard(provider, request, capsys, tmp_path, monkeypatch):
    emu = emulator_for(request, provider)
    emu.run_start_commands = True
    monkeypatch.setenv("GPUCLI_BOOT_GUARD_S", "30")
    code, out, err = launch(capsys, tmp_path, provider, "guarded")
    assert code == 0, err
    (created,) = emu.ledger.created()
    pod = emu.pods[created.pod_id]
    guard_log = pod.sshd.root / ".gpucli-boot-guard.log"
    wait_for(lambda: guard_log.exists() and "handed over" in guard_log.read_text(), 60, "the guard's hand-over")
    assert created.pod_id in emu.ledger.alive() and runs.load("guarded").status == "running"
    code, out, err = cli(capsys, "down", "guarded")
    assert code == 0, err
    (ended,) = emu.ledger.ended(created.pod_id)
    assert ended.by == "account-key"  # ended by `down`, never by the guard
    assert_nothing_running(emu)
