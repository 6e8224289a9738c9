"""vast.ai's SSH routes end to end (issue 27 item 7, issue 28 rule 6): a launch whose instance's direct
port accepts TCP and never sends an SSH banner comes up through the proxy route, and every later
command uses that route; with both routes dead the launch fails in one line and the instance is
terminated. The emulator's fault switch is ``vast_emulator.net.silent`` (tests/support/emulators/vastnet.py)."""

from __future__ import annotations

import json

from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, emulator_for, error_lines, launch
from tests.support.cli import cli


def test_silent_direct_port_launches_through_the_proxy(request, capsys, tmp_path):
    emu = emulator_for(request, "vast")
    emu.net.silent.add("direct")
    code, out, err = launch(capsys, tmp_path, "vast", "routes")
    assert code == 0, err
    assert "gave no SSH banner" in err and "Traceback" not in err
    (created,) = emu.ledger.created()
    pod = emu.pods[created.pod_id]
    record = runs.load("routes")
    assert (record.ssh.host, record.ssh.port) == ("localhost", pod.proxy.port)  # the route that answered
    direct = emu.net.direct[created.pod_id]
    tried = len(direct._held)
    assert tried >= 1  # the launch tried the direct port first
    # Later commands go the recorded way: status reads the pod, down stops the trainer over SSH.
    code, out, err = cli(capsys, "status", "routes", "--json")
    assert code == 0, err
    assert json.loads(out)["instance_id"] == created.pod_id
    code, out, err = cli(capsys, "down", "routes")
    assert code == 0, err
    assert "trainer stopped" in out and f"pod {created.pod_id} terminated" in out
    assert len(direct._held) == tried  # no later command went to the silent direct port
    assert_nothing_running(emu)


def test_both_routes_dead_fail_in_one_line_and_terminate(request, capsys, tmp_path):
    emu = emulator_for(request, "vast")
    emu.net.silent.update({"direct", "proxy"})
    code, out, err = launch(capsys, tmp_path, "vast", "deadroutes", "--ready-timeout", "2")
    assert code != 0
    assert "Traceback" not in err + out and "paramiko" not in err.lower()
    (line,) = error_lines(err)
    assert "no SSH banner" in line and "direct" in line and "proxy" in line
    assert len(emu.ledger.created()) >= 1
    assert_nothing_running(emu)  # every instance the launch created is terminated: money never leaked
