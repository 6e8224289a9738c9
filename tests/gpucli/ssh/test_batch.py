"""SFTP requests sent together (gpucli.ssh.batch) against the real sshd: the same outcomes as one
request at a time, every request on the wire before the first reply is read, folders made in one
batch, and the public-API fallback where paramiko lacks the hooks."""

from __future__ import annotations

import os
import stat

import pytest

from gpucli.errors import TransferError
from gpucli.ssh import _paramiko, batch
from gpucli.ssh.transfer import LocalFile, part_name


@pytest.fixture(params=["pipelined", "one by one"])
def mode(request, monkeypatch):
    if request.param == "one by one":
        monkeypatch.setattr(_paramiko, "pipelined", lambda sftp, reqs: None)
    return request.param


def test_batch_replies_match_each_request(remote, tmp_path, mode):
    (tmp_path / "a.txt").write_bytes(b"hello")
    sftp = remote._sftp_client()
    got = (batch.Batch(sftp).stat(str(tmp_path / "a.txt")).stat(str(tmp_path / "missing"))
           .setstat(str(tmp_path / "a.txt"), mode=0o640, times=(1_000_000, 1_200_000))
           .rename(str(tmp_path / "a.txt"), str(tmp_path / "b.txt")).remove(str(tmp_path / "nope")).run())
    assert [r.ok for r in got] == [True, False, True, True, False]
    assert got[0].attrs.st_size == 5
    assert isinstance(got[1].error, FileNotFoundError) and isinstance(got[4].error, FileNotFoundError)
    st = (tmp_path / "b.txt").stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and int(st.st_mtime) == 1_200_000
    assert not (tmp_path / "a.txt").exists()


def test_every_request_is_sent_before_the_first_reply_is_read(remote, tmp_path, monkeypatch):
    sftp = remote._sftp_client()
    real = sftp._read_response
    waiting: list[int] = []

    def read(*a):
        waiting.append(len(sftp._expecting))  # requests on the wire, replies not yet read
        return real(*a)

    monkeypatch.setattr(sftp, "_read_response", read)
    b = batch.Batch(sftp)
    for i in range(20):
        b.stat(str(tmp_path)) if i % 2 else b.mkdir(str(tmp_path / f"d{i}"))
    assert all(r.ok for r in b.run())
    assert waiting[0] == 20 and len(waiting) == 20


def test_makedirs_makes_the_tree_and_names_a_file_in_the_way(remote, tmp_path, mode):
    sftp = remote._sftp_client()
    root = str(tmp_path / "x" / "y")
    batch.makedirs(sftp, root, ["a/b/c", "a/d", ""])
    assert (tmp_path / "x/y/a/b/c").is_dir() and (tmp_path / "x/y/a/d").is_dir()
    batch.makedirs(sftp, root, ["a/b/c"])  # all there already: nothing changes, no error
    (tmp_path / "x/y/file").write_text("in the way")
    with pytest.raises(OSError):
        batch.makedirs(sftp, root, ["file/sub"])
    assert (tmp_path / "x/y/file").read_text() == "in the way"


def test_put_small_writes_and_renames_over(remote, tmp_path, mode):
    sftp = remote._sftp_client()
    (tmp_path / "rec.json").write_text("old")
    big = os.urandom(100_000)  # several writes of the chunk size
    batch.put_small(sftp, [(str(tmp_path / "rec.tmp"), b"new", str(tmp_path / "rec.json")),
                           (str(tmp_path / "empty"), b"", None), (str(tmp_path / "big"), big, None)])
    assert (tmp_path / "rec.json").read_bytes() == b"new" and not (tmp_path / "rec.tmp").exists()
    assert (tmp_path / "empty").read_bytes() == b"" and (tmp_path / "big").read_bytes() == big
    with pytest.raises(FileNotFoundError):
        batch.put_small(sftp, [(str(tmp_path / "no/such/dir/f"), b"x", None)])


def test_finish_parts_checks_size_sets_mode_and_time_and_renames(remote, tmp_path, mode):
    sftp = remote._sftp_client()
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 1000)
    f = LocalFile("out.bin", str(src), 1000, 1_500_000, 0o600)
    rdir = tmp_path / "dst"
    rdir.mkdir()
    part = rdir / part_name(f.rel, f.size, f.mtime)
    part.write_bytes(b"x" * 1000)
    side = rdir / "side"
    side.write_text("{}")
    done: list[tuple[int, str, bool]] = []
    batch.finish_parts(sftp, str(rdir), [f], lambda *a: done.append(a), sidecars={f.rel: str(side)})
    out = rdir / "out.bin"
    assert out.read_bytes() == b"x" * 1000 and not part.exists() and not side.exists()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and int(out.stat().st_mtime) == 1_500_000
    assert done == [(0, "out.bin", True)]
    part.write_bytes(b"short")  # a part that does not match the local file is not put in place
    with pytest.raises(TransferError, match="uploaded 5 bytes, expected 1000"):
        batch.finish_parts(sftp, str(rdir), [f], lambda *a: None, sidecars={})
    assert part.exists() and out.read_bytes() == b"x" * 1000


def test_prefetched_pool_is_used_and_close_during_prefetch_leaks_nothing(remote, target):
    from gpucli.ssh.remote import Remote

    remote.prefetch_pool(lambda rtt: 3)
    pool = remote._sftp_pool(3)
    assert len(pool) == 3 and all(not s.get_channel().closed for s in pool)
    with Remote(target) as r:
        r.prefetch_pool(lambda rtt: 4)
        r.close()  # while channels may still be opening
        assert r._prefetch is None and r._pool == []
