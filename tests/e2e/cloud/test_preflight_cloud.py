"""The preflight on an emulator pod (a real sshd, the real trainer on CPU): a pass is recorded before the run
is detached; a failure is one line with the machine's cost, and the pod is gone by the provider's word."""

from __future__ import annotations

import sys

import pytest

from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, emulator_for, error_lines, launch
from tests.support.cli import cli


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_preflight_on_a_pod(provider, request, capsys, tmp_path):
    emu = emulator_for(request, provider)
    code, out, err = launch(capsys, tmp_path, provider, f"{provider}-pf")
    assert code == 0, err
    pf = runs.load(f"{provider}-pf").preflight
    # The profile is an RTX 4090, the run is told to use the CPU (hardware.device=cpu): the preflight says
    # what it measured, on what, and holds no CPU to the 4090's peak.
    assert pf is not None and pf.ok and pf.device == "cpu" and pf.tokens_per_s and pf.peak_mem_gib
    assert pf.matmul_share is None and pf.steps == 3
    assert cli(capsys, "down", f"{provider}-pf")[0] == 0

    code, out, err = launch(capsys, tmp_path, provider, f"{provider}-pf-bad", "--set", "hardware.fp8=true")
    assert code == 1
    lines = error_lines(err)
    assert len(lines) == 1 and "preflight failed" in lines[0] and "the machine cost $" in lines[0], err
    record = runs.load(f"{provider}-pf-bad")
    assert record.status == "failed" and record.pid is None and record.preflight is not None
    pod = record.instance_id
    assert pod is not None and pod not in emu.ledger.alive()  # the provider says it is gone
    assert f"terminated pod {pod}" in err + out
    assert_nothing_running(emu)


def test_own_preflight_failing_on_a_pod_ends_it(request, capsys, tmp_path):
    emu = emulator_for(request, "runpod")
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "train.py").write_text("print('step 1 loss 2.5', flush=True)\n")
    code, out, err = cli(capsys, "launch", "--code", str(code_dir), "--run", f"{sys.executable} train.py",
                         "--name", "own-pod-pf", "--provider", "runpod", "--profile", "rtx4090", "--python",
                         sys.executable, "--ready-timeout", "20", "--workdir", str(tmp_path / "pod" / "own-pod-pf"),
                         "--preflight", "echo checking; exit 3")
    assert code == 1
    lines = error_lines(err)
    assert len(lines) == 1 and "your preflight failed" in lines[0] and "exit 3" in lines[0], err
    assert "the machine cost $" in lines[0]
    record = runs.load("own-pod-pf")
    assert record.status == "failed" and record.preflight is not None and record.preflight.exit_code == 3
    assert record.instance_id not in emu.ledger.alive()
    assert_nothing_running(emu)


def _own_any(capsys, tmp_path, name: str, preflight: str):
    code_dir = tmp_path / "code"
    code_dir.mkdir(exist_ok=True)
    (code_dir / "train.py").write_text("print('step 1 loss 2.5', flush=True)\n")
    return cli(capsys, "launch", "--code", str(code_dir), "--run", f"{sys.executable} train.py", "--name", name,
               "--provider", "any", "--profile", "rtx4090", "--python", sys.executable, "--ready-timeout", "20",
               "--workdir", str(tmp_path / "pod" / name), "--preflight", preflight)


def test_own_preflight_failing_once_is_tried_on_one_more_machine(request, capsys, tmp_path):
    rp, vast = emulator_for(request, "runpod"), emulator_for(request, "vast")
    marker = tmp_path / "first-machine-seen"  # the first machine fails the check; the second passes it
    code, out, err = _own_any(capsys, tmp_path, "own-any-pf",
                              f"if [ -e {marker} ]; then exit 0; else touch {marker}; exit 3; fi")
    assert code == 0, err
    record = runs.load("own-any-pf")
    assert [a["ok"] for a in record.attempts] == [False, True], record.attempts
    assert "exit 3" in record.attempts[0]["reason"] and "trying it on one more machine" in err
    assert record.status == "running" and record.preflight is not None and record.preflight.ok
    assert cli(capsys, "down", "own-any-pf")[0] == 0
    assert_nothing_running(rp)
    assert_nothing_running(vast)


def test_own_preflight_failing_on_two_machines_stops_there(request, capsys, tmp_path):
    rp, vast = emulator_for(request, "runpod"), emulator_for(request, "vast")
    code, out, err = _own_any(capsys, tmp_path, "own-any-pf2", "echo checking; exit 3")
    assert code == 1, err
    lines = error_lines(err)
    assert len(lines) == 1 and "your preflight failed" in lines[0] and "exit 3" in lines[0], err
    record = runs.load("own-any-pf2")
    assert len(record.attempts) == 2 and not any(a["ok"] for a in record.attempts)  # not a third machine
    assert len(rp.ledger.created()) + len(vast.ledger.created()) == 2
    assert_nothing_running(rp)
    assert_nothing_running(vast)
