"""A run record pointing at the test sshd, as a launch over ``--provider ssh`` leaves it."""

from __future__ import annotations

import pytest

from gpucli.run import records as runs
from gpucli.run.records import RunRecord, now_iso
from gpucli.ssh import SshTarget


@pytest.fixture
def ssh_run(sshd, client_key, tmp_path):
    key_type, key_b64 = sshd.host_key_pub.split()[:2]
    wd = tmp_path / "pod" / "r1"
    wd.mkdir(parents=True)
    record = RunRecord(name="r1", provider="ssh", created_at=now_iso(), profile="cpu", phase="fast", model="tiny",
                       n_gpus=1, gpu=None, workdir=str(wd), status="running",
                       ssh=SshTarget(host="127.0.0.1", port=sshd.port, user=sshd.user,
                                     identity_file=str(client_key[0]), host_key=f"{key_type} {key_b64}"))
    runs.save(record)
    return record


@pytest.fixture
def fake_home(tmp_path, monkeypatch):
    """$HOME for ~/.ssh/config (OpenSSH itself reads the passwd home: tests pass -F)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home
