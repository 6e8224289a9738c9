"""Run records on this machine and on the test sshd, as a launch leaves them (a folder with code/ and a
0600 env file), for exec and for launches on a machine a run already has."""

from __future__ import annotations

import os

import pytest

from gpucli.runs import records as runs
from gpucli.runs.records import RunRecord, now_iso
from gpucli.ssh import SshTarget

SECRET = "s3cr3t-value-9f2c"


def _folder(wd):
    (wd / "code").mkdir(parents=True)
    fd = os.open(wd / "env", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"MY_SECRET='{SECRET}'\n")


@pytest.fixture
def local_run(tmp_path):
    wd = tmp_path / "runs" / "l1"
    _folder(wd)
    record = RunRecord(name="l1", provider="local", created_at=now_iso(), profile="cpu", phase="fast", model="tiny",
                       n_gpus=1, gpu=None, workdir=str(wd), status="finished")
    runs.save(record)
    return record


@pytest.fixture
def ssh_run(sshd, client_key, tmp_path):
    key_type, key_b64 = sshd.host_key_pub.split()[:2]
    wd = tmp_path / "pod" / "r1"
    _folder(wd)
    record = RunRecord(name="r1", provider="ssh", created_at=now_iso(), profile="cpu", phase="fast", model="tiny",
                       n_gpus=1, gpu=None, workdir=str(wd), status="finished",
                       ssh=SshTarget(host="127.0.0.1", port=sshd.port, user=sshd.user,
                                     identity_file=str(client_key[0]), host_key=f"{key_type} {key_b64}"))
    runs.save(record)
    return record
