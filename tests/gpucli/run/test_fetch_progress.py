"""fetch-best's progress shows the checkpoint's known size from the first report, and a bad local
``.partial`` left by a cut download is not blamed on the remote: it is downloaded again from the start.

A real checkpoint folder on this machine (``LocalHost``) and over a real sshd (``Remote``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest

from gpucli.providers.local.target import LocalHost
from gpucli.run.files.checkpoints import list_checkpoints
from gpucli.run.files.harvest import download_checkpoint
from gpucli.ssh.remote import Remote, SshTarget


def _checkpoint(root: Path) -> dict[str, bytes]:
    files = {"model.pt": os.urandom(300_000), "optim_000.pt": os.urandom(100_000)}
    folder = root / "checkpoints" / "step_000010"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "meta.json").write_text(json.dumps(
        {"step": 10, "val_loss": 2.5, "files": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}))
    return files


def test_progress_counts_the_whole_checkpoint_from_the_start(tmp_path):
    files = _checkpoint(tmp_path / "run")
    host = LocalHost()
    (ck,) = list_checkpoints(host, str(tmp_path / "run"))
    reports = []
    download_checkpoint(host, ck, tmp_path / "dest" / "ck", progress=reports.append)
    total = sum(len(d) for d in files.values())
    assert reports, "no progress reported"
    assert all(r.bytes_total == total for r in reports)  # known before the first byte, never "?"
    assert reports[0].bytes_done == 0 and reports[-1].bytes_done == total
    assert [r.bytes_done for r in reports] == sorted(r.bytes_done for r in reports)  # never goes back
    assert reports[-1].files_done == reports[-1].files_total == 2


def test_a_bad_local_partial_is_downloaded_again_not_blamed_on_the_remote(tmp_path, sshd, client_key, caplog):
    files = _checkpoint(tmp_path / "pod")
    target = SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))
    src = tmp_path / "pod" / "checkpoints" / "step_000010" / "model.pt"
    dest = tmp_path / "here" / "model.pt"
    dest.parent.mkdir()
    # What a cut download leaves, with its first bytes damaged on this machine since.
    st = src.stat()
    (dest.parent / "model.pt.partial.json").write_text(
        json.dumps({"path": str(src), "size": st.st_size, "mtime": int(st.st_mtime)}))
    (dest.parent / "model.pt.partial").write_bytes(b"\0" * 1000 + files["model.pt"][1000:100_000])
    want = hashlib.sha256(files["model.pt"]).hexdigest()
    with Remote(target) as remote, caplog.at_level(logging.WARNING, logger="gpucli.ssh"):
        stats = remote.download(str(src), dest, sha256=want)
    assert dest.read_bytes() == files["model.pt"] and stats.resumed_from == 0
    assert "the local partial copy (100000 bytes from an earlier download) was bad" in caplog.text
    assert not (dest.parent / "model.pt.partial").exists()


def test_a_bad_remote_file_is_still_refused(tmp_path, sshd, client_key):
    from gpucli.errors import TransferError

    _checkpoint(tmp_path / "pod")
    target = SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))
    src = tmp_path / "pod" / "checkpoints" / "step_000010" / "model.pt"
    with Remote(target) as remote, pytest.raises(TransferError, match="the remote file may be corrupt"):
        remote.download(str(src), tmp_path / "here" / "model.pt", sha256="0" * 64)
