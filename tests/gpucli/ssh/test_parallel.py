"""Transfers over several channels at once, through a proxy that adds a real link's delay and rate
(tests/gpucli/ssh/wan_proxy.py): nothing lost at 20 ms, and a cut in the middle of parallel ranges resumes
to the same sha256, up and down. Segments are shrunk so a few MB make many of them."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from gpucli.errors import TransferError
from gpucli.ssh import files as files_mod
from gpucli.ssh import pulls as pulls_mod
from gpucli.ssh import sync as sync_mod
from gpucli.ssh.parallel import channels_for, plan_segments
from gpucli.ssh.remote import Remote, SshTarget
from gpucli.ssh.segments import parse_record
from gpucli.ssh.transfer import PART_SUFFIX, TransferProgress
from tests.gpucli.ssh.wan_proxy import WanProxy

SEG = 1 << 20


@pytest.fixture(autouse=True)
def small_segments(monkeypatch):
    monkeypatch.setattr(files_mod, "SEGMENT_BYTES", SEG)
    monkeypatch.setattr(pulls_mod, "SEGMENT_BYTES", SEG)
    monkeypatch.setattr(sync_mod, "SEGMENT_BYTES", SEG)


@pytest.fixture
def wan(sshd, client_key):
    """A 20 ms, 40 MB/s path in front of the test sshd, and a target that goes through it."""
    with WanProxy(sshd.port, rtt_s=0.02, rate_bytes_s=40e6, lifetime_s=120) as proxy:
        yield SshTarget(host="127.0.0.1", port=proxy.port, user=sshd.user, identity_file=str(client_key[0]))


def _sha(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _random_file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))


class _CutAt:
    """A progress callback that kills every sshd session once the transfer passes ``fraction``."""

    def __init__(self, sshd, fraction: float) -> None:
        self.sshd, self.fraction = sshd, fraction
        self.fired = threading.Event()

    def __call__(self, p: TransferProgress) -> None:
        if not self.fired.is_set() and p.bytes_total and p.bytes_done > self.fraction * p.bytes_total:
            self.fired.set()
            threading.Thread(target=self.sshd.kill_sessions).start()


def test_channels_sized_from_rtt_and_window():
    assert channels_for(0.0002, 2 << 20, 1 << 30) == 1  # loopback: one channel, as before
    assert channels_for(0.1, 2 << 20, 1 << 30) == 6  # 2 MiB per 100 ms is 21 MB/s of 125
    assert channels_for(0.1, 16 << 20, 1 << 30) == 1
    assert channels_for(0.2, 16 << 20, 1 << 30) == 2
    assert channels_for(0.1, 2 << 20, 40 << 20) == 2  # never more than there are segments
    assert [(s.start, s.end) for s in plan_segments("f", 5, 2, {1})] == [(0, 2), (4, 5)]


def test_parse_record_refuses_other_versions_and_garbage():
    assert parse_record(b'{"size": 10, "mtime": 5, "seg": 4, "done": [0, 2]}', 10, 5) == (4, {0, 2})
    assert parse_record(b'{"size": 10, "mtime": 6, "seg": 4, "done": [0]}', 10, 5) is None
    assert parse_record(b'{"size": 10, "mtime": 5, "seg": 4, "done": [3]}', 10, 5) is None  # past the end
    assert parse_record(b'{"size": 10, "mt', 10, 5) is None  # cut mid-write


def test_no_loss_at_20ms_up_and_down_in_parallel(wan, sshd, tmp_path):
    src = tmp_path / "src"
    _random_file(src / "big.bin", 5 * SEG + 123)
    for i in range(40):
        _random_file(src / f"d{i % 4}" / f"s{i}.txt", 100 + 37 * i)
    dst = tmp_path / "remote"
    with Remote(wan) as r:
        assert r.measure_rtt() >= 0.015
        stats = r.sync_up(src, str(dst), channels=3)
        assert stats.files_sent == 41
        back = tmp_path / "back"
        got = r.download_tree(str(dst), back, channels=3)
        assert got.files_sent == 41
        one = r.download(str(dst / "big.bin"), tmp_path / "one.bin", sha256=_sha(src / "big.bin"), channels=4)
        assert one.bytes_transferred == 5 * SEG + 123
    for p in src.rglob("*"):
        if p.is_file():
            rel = p.relative_to(src)
            assert _sha(dst / rel) == _sha(p), rel
            assert _sha(back / rel) == _sha(p), rel
            assert int((back / rel).stat().st_mtime) == int(p.stat().st_mtime)
    assert not [p for p in dst.rglob("*") if p.name.endswith(PART_SUFFIX)]
    assert not [p for p in back.rglob("*") if p.name.endswith((".partial", ".partial.json"))]


def test_upload_cut_mid_parallel_ranges_resumes_to_same_sha(wan, sshd, tmp_path):
    src = tmp_path / "src"
    _random_file(src / "ckpt" / "model.bin", 24 * SEG + 7)
    _random_file(src / "ckpt" / "optim.bin", 12 * SEG)
    dst = tmp_path / "remote"
    # Progress counts bytes sent; a segment is recorded once the server acknowledged all of it, up to
    # a window per channel later: cut late enough that some have been.
    cut = _CutAt(sshd, 0.7)
    with Remote(wan) as r, pytest.raises(TransferError):
        r.sync_up(src, str(dst), channels=4, progress=cut)
    assert cut.fired.is_set()
    parts = [p.name for p in (dst / "ckpt").iterdir()]
    assert any(".ranges" in n for n in parts), parts  # the record of the finished segments
    with Remote(wan) as r:
        stats = r.sync_up(src, str(dst), channels=4)
    assert stats.bytes_resumed > 0  # finished segments were not sent again
    assert stats.bytes_resumed + stats.bytes_sent == 36 * SEG + 7
    for name in ("model.bin", "optim.bin"):
        assert _sha(dst / "ckpt" / name) == _sha(src / "ckpt" / name)
    assert sorted(p.name for p in (dst / "ckpt").iterdir()) == ["model.bin", "optim.bin"]


def test_download_cut_mid_parallel_ranges_resumes_and_verifies(wan, sshd, tmp_path):
    remote_file = tmp_path / "remote" / "model.bin"
    _random_file(remote_file, 24 * SEG + 5)
    want = _sha(remote_file)
    dest = tmp_path / "local" / "model.bin"
    cut = _CutAt(sshd, 0.4)
    with Remote(wan) as r, pytest.raises(TransferError):
        r.download(str(remote_file), dest, sha256=want, channels=4, progress=cut)
    assert cut.fired.is_set() and not dest.exists()
    with Remote(wan) as r:
        stats = r.download(str(remote_file), dest, sha256=want, channels=4)
    assert stats.resumed_from > 0 and stats.sha256 == want
    assert _sha(dest) == want
    assert not dest.with_name("model.bin.partial").exists()


def test_parallel_download_sha_mismatch_keeps_old_copy(remote, tmp_path):
    remote_file = tmp_path / "remote.bin"
    _random_file(remote_file, 3 * SEG)
    dest = tmp_path / "local.bin"
    dest.write_bytes(b"old")
    with pytest.raises(TransferError, match="sha256 mismatch"):
        remote.download(str(remote_file), dest, sha256="0" * 64, channels=3)
    assert dest.read_bytes() == b"old"


def test_download_files_in_parallel_verifies_each(wan, tmp_path):
    rdir = tmp_path / "ckpt"
    for i in range(4):
        _random_file(rdir / f"optim_{i}.pt", SEG // 2 + i)
    _random_file(rdir / "model.pt", 3 * SEG + 1)
    names = sorted(p.name for p in rdir.iterdir())
    local = tmp_path / "local"
    reports: list[TransferProgress] = []
    with Remote(wan) as r:
        stats = r.download_files([(str(rdir / n), local / n, _sha(rdir / n)) for n in names],
                                 progress=reports.append, channels=3)
        assert [s.sha256 for s in stats] == [_sha(rdir / n) for n in names]
        assert all(_sha(local / n) == _sha(rdir / n) for n in names)
        assert reports[-1].files_done == len(names) and reports[-1].bytes_done == reports[-1].bytes_total
        again = r.download_files([(str(rdir / n), local / n, None) for n in names], channels=3)
        assert all(s.skipped for s in again)
        (local / "model.pt").unlink()
        with pytest.raises(TransferError, match="sha256 mismatch"):
            r.download_files([(str(rdir / "model.pt"), local / "model.pt", "0" * 64),
                              (str(rdir / names[1]), local / names[1], None)], channels=2)
    assert not (local / "model.pt").exists()


def test_checkpoint_with_optimizer_shards_comes_down_in_parallel_and_verified(wan, tmp_path, monkeypatch):
    """fetch-best --with-optimizer's downloader over a long link: the weights and 8 optimizer shards
    on several channels at once, one bar over all of them, each file checked against meta.json."""
    import json

    from gpucli.run.files import checkpoints, harvest

    ck_dir = tmp_path / "pod" / "checkpoints" / "step_000100"
    names = ["model.pt"] + [f"optim_rank{i}.pt" for i in range(8)]
    for i, n in enumerate(names):
        _random_file(ck_dir / n, (3 * SEG) // 2 + i)
    files = {n: _sha(ck_dir / n) for n in names}
    (ck_dir / "meta.json").write_text(json.dumps({"step": 100, "files": files}))
    ck = checkpoints.CheckpointInfo("step_000100", str(ck_dir), 100, 1.0, 1.0, "best", files, {})
    pools: list[int] = []
    seen: list[TransferProgress] = []
    target = tmp_path / "local" / "best"
    with Remote(wan) as r:
        real_pool = r._sftp_pool
        monkeypatch.setattr(r, "_sftp_pool", lambda n: pools.append(n) or real_pool(n))
        got, total = harvest.download_checkpoint(r, ck, target, with_optimizer=True, progress=seen.append)
    assert max(pools) >= 2  # more than one channel carried the files
    assert sorted(got) == sorted(names + ["meta.json"])
    for n in names:
        assert _sha(target / n) == files[n]
    size = sum((ck_dir / n).stat().st_size for n in names)
    assert total == size + len((ck_dir / "meta.json").read_bytes())
    assert {p.bytes_total for p in seen} == {size} and seen[-1].bytes_done == size  # one bar, known size
    ck_dir.joinpath("optim_rank3.pt").write_bytes(b"tampered")  # a file that no longer matches meta.json
    with Remote(wan) as r, pytest.raises(TransferError):
        harvest.download_checkpoint(r, ck, tmp_path / "local" / "again", with_optimizer=True)
    assert _sha(target / "optim_rank3.pt") == files["optim_rank3.pt"]  # the good copy is untouched
