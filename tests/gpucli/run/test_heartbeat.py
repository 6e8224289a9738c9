"""An upload is a sign of a live launch: the host a starting job sees (run/starting/start.py ``Beating``) touches the
launch's marker from each upload's progress, so the pod's early watchdog never takes a long upload (one big
file adds no new entry to the folders it watches) for a dead launch. Against a real sshd."""

from __future__ import annotations

import os

from gpucli.run.starting import start
from gpucli.ssh.remote import Remote, SshTarget


def test_an_upload_touches_the_launch_marker_and_still_reports_its_progress(sshd, client_key, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(start, "BEAT_S", 0.0)  # a touch at every report (a minute apart in a launch)
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(8 << 20))
    wd = tmp_path / "pod" / "run"
    wd.mkdir(parents=True)
    seen = []
    target = SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))
    with Remote(target) as r:
        host = start.Beating(r, start.heartbeat(r, str(wd)))
        stats = host.sync_up(src, str(wd / "data"), excludes=[], progress=seen.append)
        assert host.target == r.target  # everything but uploads is the host's own
    assert (wd / ".launching").exists()  # touched over SSH from the upload's progress
    assert stats.files_sent == 1 and (wd / "data" / "big.bin").stat().st_size == 8 << 20
    assert seen and seen[-1].bytes_done == 8 << 20  # the caller's own progress still gets every report


def test_the_heartbeat_touches_at_most_once_a_window(sshd, client_key, tmp_path):
    wd = tmp_path / "run"
    wd.mkdir()
    target = SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))
    with Remote(target) as r:
        beat = start.heartbeat(r, str(wd))
        for _ in range(3):
            beat()  # within BEAT_S of its start: the launch's own first touch counts
    assert not (wd / ".launching").exists()
