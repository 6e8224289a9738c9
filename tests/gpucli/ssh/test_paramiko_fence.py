"""The fence around paramiko's internals: where an attribute is missing the transfer still works
through paramiko's public path and says so at debug level; the heap tuning is the caller's choice."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import gpucli.ssh as ssh_pkg
from gpucli.ssh import _paramiko, heap, sftp, wire
from gpucli.ssh.transfer import LocalFile

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


@pytest.fixture(autouse=True)
def _fresh_fallback_log(monkeypatch):
    monkeypatch.setattr(_paramiko, "_logged", set())


def test_pin_comment_lists_every_private_attribute_the_fence_names():
    doc = _paramiko.__doc__ or ""
    listed = set(re.findall(r"``(\w+)``", doc.split("When one is missing")[0]))
    listed -= {"SFTPClient", "Channel", "Transport", "Packetizer", "_Packetizer__", "SFTPFile",
               "pyproject"}
    pin = PYPROJECT.read_text().split('"paramiko')[0].rsplit('"requests', 1)[1]
    missing = sorted(a for a in listed if not re.search(rf"\b{a}\b", pin))
    assert len(listed) >= 25 and not missing, missing


def test_pipelined_read_falls_back_to_paramikos_reads(remote, tmp_path, monkeypatch, caplog):
    data = os.urandom((3 << 20) + 17)
    (tmp_path / "f.bin").write_bytes(data)
    client = remote._sftp_client()
    real = _paramiko.sftp_pipeline_ok  # judged on an object without paramiko's private attributes
    monkeypatch.setattr(_paramiko, "sftp_pipeline_ok", lambda s, what: real(SimpleNamespace(), what))
    got: list[bytes] = []
    with caplog.at_level(logging.DEBUG, logger="gpucli.ssh._paramiko"):
        sftp.read_range(client, str(tmp_path / "f.bin"), 5, len(data), lambda b: got.append(bytes(b)),
                        max_read=remote._max_read)
    assert b"".join(got) == data[5:]
    assert any("paramiko fallback" in r.message for r in caplog.records)


def test_pipelined_write_falls_back_and_resumes(remote, tmp_path, monkeypatch, caplog):
    data = os.urandom((2 << 20) + 5)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    part = tmp_path / "part.bin"
    part.write_bytes(data[:1000])
    f = LocalFile("src.bin", str(src), len(data), int(src.stat().st_mtime), 0o644)
    client = remote._sftp_client()
    monkeypatch.setattr(_paramiko, "file_handle", lambda fh, what: _paramiko.fallback(what))
    seen: list[int] = []
    with caplog.at_level(logging.DEBUG, logger="gpucli.ssh._paramiko"):
        end = sftp.write_from(client, str(part), f, 1000, lambda n, rel, done: seen.append(n),
                              max_write=remote._max_write)
    assert end == len(data) and sum(seen) == len(data)
    assert hashlib.sha256(part.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert [r.message for r in caplog.records if "paramiko fallback" in r.message]


def test_send_all_uses_channel_sendall_where_the_window_internals_are_missing(caplog):
    sent: list[bytes] = []
    chan = SimpleNamespace(sendall=lambda view: sent.append(bytes(view)))
    with caplog.at_level(logging.DEBUG, logger="gpucli.ssh._paramiko"):
        wire.send_all(chan, b"abc" * 1000)
        wire.send_all(chan, b"more")
    assert sent == [b"abc" * 1000, b"more"]
    fallbacks = [r for r in caplog.records if "paramiko fallback" in r.message]
    assert len(fallbacks) == 1 and fallbacks[0].levelno == logging.DEBUG  # once per reason


def test_sftp_checks_report_what_is_missing(caplog):
    with caplog.at_level(logging.DEBUG, logger="gpucli.ssh._paramiko"):
        assert not _paramiko.sftp_pipeline_ok(SimpleNamespace(), "x")
        assert _paramiko.file_handle(SimpleNamespace(), "y") is None
        assert _paramiko.sftp_limits(SimpleNamespace()) == (_paramiko.DEFAULT_REQUEST,) * 2
    assert len([r for r in caplog.records if r.levelno == logging.DEBUG]) == 3


def test_download_leaves_the_heap_alone_until_a_command_asks(remote, tmp_path, monkeypatch):
    monkeypatch.setattr(heap, "_tuned", False)
    (tmp_path / "r.bin").write_bytes(os.urandom(1 << 20))
    remote.download(str(tmp_path / "r.bin"), tmp_path / "l.bin")
    assert heap._tuned is False
    ssh_pkg.tune_heap_for_downloads()
    ssh_pkg.tune_heap_for_downloads()  # idempotent
    assert heap._tuned is True
