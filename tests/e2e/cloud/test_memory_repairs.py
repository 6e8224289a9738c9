"""A host whose GPU memory has a repair pending (nvidia-smi -q's Remapped Rows) is refused by the preflight
on an emulator pod whose nvidia-smi answers as the driver would: one line, the pod gone by the provider's
word, the figures in the failed run's record."""

from __future__ import annotations

from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, emulator_for, error_lines, launch
from tests.gpucli.run.test_health import SMI_Q
from tests.support.emulators import PodBehaviour


def test_a_pending_row_remapping_refuses_the_pod(request, capsys, tmp_path):
    emu = emulator_for(request, "runpod")
    emu.behaviours.append(PodBehaviour(nvidia_smi="NVIDIA GeForce RTX 4090, 0, Not Active\n",
                                       nvidia_smi_q=SMI_Q.format(pending="Yes", failed="No")))
    code, out, err = launch(capsys, tmp_path, "runpod", "remap")
    assert code == 1, err
    lines = error_lines(err)
    assert len(lines) == 1 and "preflight failed (smi)" in lines[0] and "memory repair pending" in lines[0], err
    record = runs.load("remap")
    pf = record.preflight
    assert pf is not None and pf.remap_pending == 1 and pf.remap_failed == 0 and pf.memory_check == "read"
    assert pf.xid_log is not None  # the kernel log: read, or said not readable here
    assert record.instance_id not in emu.ledger.alive()
    assert_nothing_running(emu)
