"""``gpucli watch RUN --detach --on user@host``: the watcher on an always-on machine (a real sshd on
loopback), this machine's own watcher gone: a RunPod Instant Cluster (the emulator's) is deleted by the
watcher over there when the run ends. The provider key reaches it only in a 0600 env file: not on any
command line there (``ps`` of that host) nor in its log."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

from gpucli.runs import records as runs
from tests.e2e.cloud.test_clusterend import alive, launch, quick  # noqa: F401 - the fixture
from tests.support.cli import cli, wait_for


def test_a_watcher_on_another_machine_ends_the_cluster(capsys, runpod_emulator, cluster_emulator, tmp_path,
                                                       quick, sshd, client_key):  # noqa: F811
    record, pid, _ = launch(capsys, tmp_path, "faraway", 12)
    os.kill(pid, signal.SIGKILL)  # this machine's watcher is gone: this machine is off, as far as the run goes
    wait_for(lambda: not alive(pid), 30, "the local watcher to die")
    on = f"{sshd.user}@127.0.0.1:{sshd.port}"
    code, out, err = cli(capsys, "watch", "faraway", "--detach", "--on", on, "--identity", str(client_key[0]),
                         "--poll", "1")
    assert code == 0, err
    assert "watcher of faraway started on" in err + out
    state = json.loads((runs.runs_dir() / "faraway.remote-watch.json").read_text())
    folder = Path(state["folder"])
    env = folder / "env"
    assert env.stat().st_mode & 0o777 == 0o600 and cluster_emulator.api_key in env.read_text()
    assert alive(state["pid"])

    # The key on no command line of that host while the watcher runs, nor in what it writes.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert "gpucli watch faraway" in ps and cluster_emulator.api_key not in ps

    wait_for(lambda: not cluster_emulator.billing_pods(), 180, "the cluster to be deleted by the remote watcher")
    wait_for(lambda: not alive(state["pid"]), 60, "the remote watcher to exit")
    log = (folder / "watch.log").read_text()
    assert f"deleted its cluster {record.launch['cluster_id']}" in log
    assert cluster_emulator.api_key not in log

    code, out, err = cli(capsys, "watch", "faraway", "--status", "--json")
    assert code == 0, err
    shown = json.loads(out)
    # the run is over as the watcher there saw it (its own watcher reads "failed" at times when a node's
    # job ends before its watchdog writes why: the same as this machine's watcher, gpucli/run/life/lifecycle.py)
    assert shown["running"] is False and shown["run_status"] in ("finished", "failed"), (shown, log)
    assert runs.load("faraway").status == shown["run_status"]  # the record it kept came back
    code, out, err = cli(capsys, "watch", "faraway", "--stop")
    assert code == 0, err
    assert not env.exists()  # its secrets are gone from that machine
    shutil.rmtree(folder)  # the test sshd's user is this machine's: leave its home as it was
    if not any(folder.parent.iterdir()):
        folder.parent.rmdir()


def test_bad_remote_watch_requests_are_one_line(capsys, runpod_emulator, cluster_emulator, tmp_path, quick):  # noqa: F811
    code, out, err = cli(capsys, "watch", "nosuch", "--status")
    assert code != 0 and "Traceback" not in err
    record, pid, _ = launch(capsys, tmp_path, "near", 2)
    code, out, err = cli(capsys, "watch", "near", "--on", "me@127.0.0.1:1")
    assert code != 0 and "--detach and --on go together" in err
    code, out, err = cli(capsys, "watch", "near", "--detach", "--on", "me@127.0.0.1:1")
    assert code != 0 and "cannot be reached" in err and "Traceback" not in err
    wait_for(lambda: not cluster_emulator.billing_pods(), 180, "the local watcher to delete the cluster")
