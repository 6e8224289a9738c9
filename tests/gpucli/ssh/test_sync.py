"""sync_up / download against a real sshd: excludes, no-op re-sync, resume after a cut connection,
sha256 verification. The sshd runs on this machine, so the "remote" folder is checked directly."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from gpucli.errors import TransferError
from gpucli.ssh.remote import Remote
from gpucli.ssh.transfer import TransferProgress

BIG = 96 << 20  # big enough that a cut at 30% lands mid-stream on this machine


def _sha(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _write(path: Path, data: bytes, mtime: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def _random_file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        left = size
        while left:
            n = min(left, 8 << 20)
            fh.write(os.urandom(n))
            left -= n


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), int(p.stat().st_mtime))
            for p in sorted(root.rglob("*")) if p.is_file()}


class _CutAt:
    """A progress callback that cuts every SSH connection once the transfer passes ``fraction``."""

    def __init__(self, sshd, fraction: float) -> None:
        self.sshd, self.fraction = sshd, fraction
        self.fired = threading.Event()
        self.reports: list[TransferProgress] = []

    def __call__(self, p: TransferProgress) -> None:
        self.reports.append(p)
        if not self.fired.is_set() and p.bytes_total and p.bytes_done > self.fraction * p.bytes_total:
            self.fired.set()
            threading.Thread(target=self.sshd.kill_sessions).start()


def test_sync_tree_with_excludes_then_noop_then_changes(remote, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    t = 1_700_000_000
    for i in range(60):
        _write(src / f"pkg/m{i % 5}/f{i}.py", os.urandom(100 + i * 37), t + i)
    _write(src / "weird name ü.txt", b"x" * 10, t)
    _write(src / "data/shard.bin", os.urandom(300_000), t)  # "big" with the threshold below
    _write(src / ".git/HEAD", b"ref", t)
    _write(src / "pkg/__pycache__/m.cpython-311.pyc", b"c", t)
    _write(src / "logs/run.log", b"l", t)
    _write(src / "keep.log", b"k", t)
    _write(src / ".gpucliignore", b"*.log\n!keep.log\n", t)
    os.chmod(src / "pkg/m0/f0.py", 0o755)

    reports: list[TransferProgress] = []
    stats = remote.sync_up(src, str(dst), progress=reports.append, small_file_bytes=256 << 10)
    want = {k: v for k, v in _tree(src).items()
            if not k.startswith((".git/", "logs/")) and "__pycache__" not in k}
    assert _tree(dst) == want  # content and mtimes
    assert os.stat(dst / "pkg/m0/f0.py").st_mode & 0o777 == 0o755
    assert stats.files_sent == len(want) == stats.files_total and stats.bytes_sent == stats.bytes_total
    assert reports[-1].bytes_done == reports[-1].bytes_total == stats.bytes_total
    assert reports[-1].files_done == reports[-1].files_total == len(want)

    again = remote.sync_up(src, str(dst), small_file_bytes=256 << 10)
    assert (again.files_sent, again.bytes_sent, again.files_skipped) == (0, 0, len(want))

    # Same content, new mtime on the big file: hashed, not re-sent; mtime fixed remotely.
    os.utime(src / "data/shard.bin", (t + 99, t + 99))
    _write(src / "pkg/m1/f1.py", b"changed", t + 5)
    third = remote.sync_up(src, str(dst), small_file_bytes=256 << 10)
    assert third.files_sent == 1 and third.bytes_sent == len(b"changed")
    assert int(os.stat(dst / "data/shard.bin").st_mtime) == t + 99
    assert _tree(dst)["pkg/m1/f1.py"] == (b"changed", t + 5)
    assert remote.sync_up(src, str(dst), small_file_bytes=256 << 10).files_sent == 0


def test_sync_cut_mid_big_file_resumes_to_identical_bytes(sshd, target, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _random_file(src / "big.bin", BIG)
    _write(src / "small.txt", b"hello")
    cut = _CutAt(sshd, 0.3)
    with Remote(target) as r, pytest.raises(TransferError, match="run the same command again"):
        r.sync_up(src, str(dst), progress=cut)
    assert cut.fired.is_set()
    # One part of the file (a slow link makes the sync send it over several channels, with a sidecar of
    # the ranges done, which may leave the part its full length with holes: the resume below is the proof).
    parts = [p for p in dst.glob(".big.bin.*.gpucli-part") if ".ranges." not in p.name]
    assert len(parts) == 1 and parts[0].stat().st_size > 0
    assert not (dst / "big.bin").exists()

    with Remote(target) as r:
        stats = r.sync_up(src, str(dst))
    assert stats.bytes_resumed > 0 and stats.bytes_sent < BIG
    assert _sha(dst / "big.bin") == _sha(src / "big.bin")
    assert int((dst / "big.bin").stat().st_mtime) == int((src / "big.bin").stat().st_mtime)
    assert not list(dst.glob(".*.gpucli-part"))
    with Remote(target) as r:
        assert r.sync_up(src, str(dst)).files_sent == 0


def test_stale_partial_of_another_version_is_not_spliced(remote, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _random_file(src / "big.bin", 6 << 20)
    st = (src / "big.bin").stat()
    # A partial with the right name but wrong content (a cut of some other upload).
    _write(dst / f".big.bin.{st.st_size}.{int(st.st_mtime)}.gpucli-part", os.urandom(2 << 20))
    _write(dst / ".big.bin.1.1.gpucli-part", b"old version")
    stats = remote.sync_up(src, str(dst))
    assert stats.bytes_resumed == 0
    assert _sha(dst / "big.bin") == _sha(src / "big.bin")
    assert not list(dst.glob(".*.gpucli-part"))


def test_download_cut_resumes_and_verifies(sshd, target, tmp_path):
    src = tmp_path / "remote" / "model.pt"
    _random_file(src, BIG)
    digest = _sha(src)
    dest = tmp_path / "local" / "model.pt"
    cut = _CutAt(sshd, 0.3)
    with Remote(target) as r, pytest.raises(TransferError):
        r.download(str(src), dest, sha256=digest, progress=cut)
    assert cut.fired.is_set() and not dest.exists()
    partial = dest.with_name("model.pt.partial")
    assert 0 < partial.stat().st_size < BIG

    with Remote(target) as r:
        stats = r.download(str(src), dest, sha256=digest)
    assert stats.resumed_from > 0 and stats.bytes_transferred == BIG - stats.resumed_from
    assert _sha(dest) == digest and stats.sha256 == digest
    assert not partial.exists()
    with Remote(target) as r:
        assert r.download(str(src), dest, sha256=digest).skipped


def test_download_sha_mismatch_keeps_old_copy(remote, tmp_path):
    src = tmp_path / "remote" / "meta.json"
    _write(src, b'{"step": 2}')
    dest = tmp_path / "local" / "meta.json"
    _write(dest, b'{"step": 1}')
    with pytest.raises(TransferError, match="sha256 mismatch"):
        remote.download(str(src), dest, sha256="0" * 64)
    assert dest.read_bytes() == b'{"step": 1}'
    assert not dest.with_name("meta.json.partial").exists()
    remote.download(str(src), dest, sha256=hashlib.sha256(b'{"step": 2}').hexdigest())
    assert dest.read_bytes() == b'{"step": 2}'


def test_download_tree(remote, tmp_path):
    src = tmp_path / "ckpt"
    _write(src / "step_000500/meta.json", b"{}", 1_700_000_000)
    _write(src / "step_000500/model.pt", os.urandom(700_000), 1_700_000_001)
    _write(src / "step_000100/meta.json", b"{}", 1_700_000_002)
    out = tmp_path / "out"
    stats = remote.download_tree(str(src), out)
    assert stats.files_sent == 3 and _tree(out) == _tree(src)
    assert remote.download_tree(str(src), out).files_sent == 0


def test_few_big_files_go_over_sftp_only_into_new_nested_folders(remote, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst" / "deep"
    _write(src / "step_1/model.pt", os.urandom(50_000), 1_700_000_000)
    _write(src / "step_2/sub/optim.pt", os.urandom(70_000), 1_700_000_001)
    stats = remote.sync_up(src, str(dst), small_file_bytes=1024)
    assert stats.files_sent == 2 and _tree(dst) == _tree(src)
    assert remote.sync_up(src, str(dst), small_file_bytes=1024).files_sent == 0


def test_cut_mid_tar_stream_then_resync_is_complete(sshd, target, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    for i in range(400):
        _write(src / f"d{i % 7}/f{i}.bin", os.urandom(60_000), 1_700_000_000 + i)
    cut = _CutAt(sshd, 0.3)
    with Remote(target) as r, pytest.raises(TransferError):
        r.sync_up(src, str(dst), progress=cut)
    assert cut.fired.is_set()
    with Remote(target) as r:
        stats = r.sync_up(src, str(dst))
    assert stats.files_skipped > 0  # what arrived before the cut is not sent again
    assert _tree(dst) == _tree(src)
