"""The batched AES-GCM channel writer against a real sshd: the bytes arrive intact across a key
re-exchange, other ciphers take paramiko's own path, and a stalled or closed channel fails fast."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import gpucli.ssh.connection as connection_mod
import gpucli.ssh.wire as sshwire
from gpucli.ssh.remote import Remote


def _cat_into(remote: Remote, path: Path, data: bytes) -> None:
    chan = remote._transport().open_session()
    chan.settimeout(30)
    chan.exec_command(f"cat > {path}")
    sshwire.send_all(chan, data)
    chan.shutdown_write()
    assert chan.recv_exit_status() == 0
    chan.close()


def _counting(monkeypatch, name: str) -> list:
    seen: list = []
    real = getattr(sshwire, name)

    def wrapper(*args, **kwargs):
        result = real(*args, **kwargs)
        seen.append(result)
        return result

    monkeypatch.setattr(sshwire, name, wrapper)
    return seen


def test_gcm_batches_arrive_intact_across_a_rekey(remote, tmp_path, monkeypatch):
    t = remote._transport()
    assert t.local_cipher.startswith("aes128-gcm")
    pk = t.packetizer
    pk.REKEY_BYTES = 3 << 20  # rekey every 3 MiB instead of every 512 MiB
    rekeys = []
    real_trigger = pk._trigger_rekey
    monkeypatch.setattr(pk, "_trigger_rekey", lambda: (rekeys.append(1), real_trigger()))
    batches = _counting(monkeypatch, "_send_gcm_batch")
    data = os.urandom(20 << 20) + b"tail"  # not a multiple of any packet or batch size
    _cat_into(remote, tmp_path / "out.bin", data)
    assert hashlib.sha256((tmp_path / "out.bin").read_bytes()).digest() == hashlib.sha256(data).digest()
    assert len(rekeys) >= 3 and batches and all(batches)
    assert remote.run("echo still-here", timeout_s=10).stdout.strip() == "still-here"


def test_other_ciphers_take_paramikos_path(target, tmp_path, monkeypatch):
    monkeypatch.setattr(connection_mod, "CIPHERS", ("aes128-ctr",))
    each = _counting(monkeypatch, "_send_each")
    batches = _counting(monkeypatch, "_send_gcm_batch")
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom((5 << 20) + 3)
    (src / "big.bin").write_bytes(data)
    (src / "small.txt").write_bytes(b"hello\n")
    with Remote(target) as r:
        assert r._transport().local_cipher == "aes128-ctr"
        r.sync_up(src, str(tmp_path / "dst"), excludes=())
    assert (tmp_path / "dst" / "big.bin").read_bytes() == data
    assert (tmp_path / "dst" / "small.txt").read_bytes() == b"hello\n"
    assert each and batches and not any(batches)


def test_a_stalled_window_times_out_and_a_closed_channel_refuses(remote):
    chan = remote._transport().open_session()
    chan.exec_command("sleep 30")  # never reads: sshd's 2 MiB window fills and stays shut
    chan.settimeout(0.5)
    with pytest.raises(TimeoutError):  # the window stayed shut: the send gave up instead of waiting on
        sshwire.send_all(chan, bytes(8 << 20))
    chan.close()
    with pytest.raises(OSError):
        sshwire.send_all(chan, b"more")


def test_a_close_that_crosses_a_key_exchange_does_not_stall_the_connection(remote):
    """paramiko/paramiko#822: a channel's close that arrives after our KEXINIT is handled on the
    transport's thread, whose reply would wait for an exchange only that thread can finish (30 s,
    then "Key-exchange timed out"). Here an exchange is held open by hand (clear_to_send cleared, as
    paramiko's _send_kex_init does) while one channel closes and another still has output coming:
    the close is handled, the other channel's output still arrives, the held reply goes out once the
    exchange is over, and the connection keeps working."""
    t = remote._transport()
    closing, talking = t.open_session(), t.open_session()
    closing.exec_command("sleep 2")
    talking.exec_command("sleep 4; echo still-reading")
    talking.settimeout(60)
    with t.clear_to_send_lock:
        t.clear_to_send.clear()  # from here on, as during a key exchange
    try:
        got = b""
        while b"still-reading" not in got:  # the transport thread must still read: not stuck on the close
            chunk = talking.recv(100)
            assert chunk, "the channel closed without its output"
            got += chunk
        assert closing.closed and getattr(t, "gpucli_held_over_kex", 0) >= 1
    finally:
        with t.clear_to_send_lock:
            t.clear_to_send.set()  # the exchange is over: the held reply goes out
    assert closing.recv_exit_status() == 0 and talking.recv_exit_status() == 0
    assert remote.run("echo still-here", timeout_s=30).stdout.strip() == "still-here"
