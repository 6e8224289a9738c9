"""Remote against a real OpenSSH sshd: commands, deadlines, host-key pinning, detached processes."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpucli.errors import ConnectionFailed, HostKeyError, RemoteCommandError
from gpucli.settings import home
from gpucli.ssh.remote import Remote, SshTarget, parse_target
from tests.support.sshd import SshServer


def test_parse_target():
    t = parse_target("alice@10.0.0.5:2222")
    assert (t.user, t.host, t.port) == ("alice", "10.0.0.5", 2222)
    assert parse_target("gpu.example.org").user == "root"
    assert parse_target("root@[::1]:22").host == "::1"
    assert t.known_hosts_name == "[10.0.0.5]:2222"
    assert str(parse_target("bob@h")) == "bob@h"


def test_run_exit_codes_stderr_input(remote):
    res = remote.run("echo out; echo err >&2; exit 3", timeout_s=10, check=False)
    assert (res.exit_code, res.stdout, res.stderr) == (3, "out\n", "err\n")
    with pytest.raises(RemoteCommandError, match="exit code 3"):
        remote.run("echo boom >&2; exit 3", timeout_s=10)
    assert remote.run("tr a-z A-Z", timeout_s=10, input="hello").stdout == "HELLO"
    big = remote.run("head -c 3000000 /dev/zero", timeout_s=20)
    assert len(big.stdout) == 3_000_000


def test_run_deadline(remote):
    with pytest.raises(RemoteCommandError, match="did not finish within"):
        remote.run("sleep 20", timeout_s=0.5)
    assert remote.run("echo still-usable", timeout_s=10).stdout == "still-usable\n"


def test_host_key_first_use_recorded_then_change_refused(sshd, client_key, tmp_path_factory):
    target = SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))
    known = home() / "known_hosts"
    assert not known.exists()
    with Remote(target) as r:
        first_key = r.host_key
    assert first_key and first_key.split()[1] == sshd.host_key_pub.split()[1]
    assert f"[127.0.0.1]:{sshd.port} {first_key}" in known.read_text()
    assert stat.S_IMODE(known.stat().st_mode) == 0o600
    with Remote(target) as r:  # pinned key matches: connects, no duplicate line
        r.run("true", timeout_s=10)
    assert len(known.read_text().splitlines()) == 1

    # The machine is "re-created": same address, new host key.
    sshd.stop()
    for p in sshd.root.glob("ssh_host_ed25519_key*"):
        p.unlink()
    new = SshServer.start(sshd.root, authorized_keys=[client_key[1]], port=sshd.port)
    try:
        with pytest.raises(HostKeyError) as err:
            Remote(target).connect()
        msg = str(err.value)
        assert "changed" in msg and f"{known} line 1" in msg and "delete that line" in msg
        # An explicit pin (from a run record) that does not match is refused too.
        with pytest.raises(HostKeyError, match="does not match"):
            Remote(SshTarget(**{**target.__dict__, "host_key": first_key}),
                   known_hosts=tmp_path_factory.mktemp("kh") / "kh").connect()
        # ... and one that matches connects even with an empty known_hosts.
        good = SshTarget(**{**target.__dict__, "host_key": new.host_key_pub})
        with Remote(good, known_hosts=tmp_path_factory.mktemp("kh2") / "kh") as r:
            assert r.run("echo ok", timeout_s=10).stdout == "ok\n"
    finally:
        new.stop()


def test_bad_identity_and_unreachable(sshd, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    with pytest.raises(ConnectionFailed, match="authentication"):
        Remote(SshTarget(sshd.host, sshd.port, sshd.user, identity_file=str(other))).connect()
    sock_port = sshd.port + 1 if sshd.port < 65000 else sshd.port - 1
    with pytest.raises(ConnectionFailed, match="cannot reach"):
        Remote(SshTarget("127.0.0.1", sock_port, "x"), connect_timeout_s=2).connect()


def test_detached_survives_disconnect_and_secret_stays_off_command_lines(sshd, remote, target, tmp_path):
    work = tmp_path / "run"
    work.mkdir()
    secret = "s3cr3t-token-value-42"
    env_path = str(work / "env")
    remote.write_env_file(env_path, {"GPUCLI_TEST_SECRET": secret, "OTHER": "it's quoted"})
    assert stat.S_IMODE(os.stat(env_path).st_mode) == 0o600
    # Written aside and renamed: a read never lands between the shell's truncation and its write.
    cmd = ('while true; do printf "%s|%s\\n" "$GPUCLI_TEST_SECRET" "$OTHER" > seen.tmp'
           ' && mv -f seen.tmp seen.txt; sleep 0.2; done')
    pid = remote.start_detached(cmd, cwd=str(work), log_path=str(work / "train.log"), env_file=env_path)
    assert pid > 0 and remote.is_running(pid)

    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    assert secret not in ps
    assert str(pid) in ps

    assert sshd.kill_sessions() >= 1  # cut every SSH connection
    time.sleep(0.5)
    deadline = time.monotonic() + 5
    while not (work / "seen.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (work / "seen.txt").read_text() == f"{secret}|it's quoted\n"
    os.kill(pid, 0)  # still alive after the sessions died
    assert os.getsid(pid) == pid  # its own session

    with Remote(target) as again:
        assert again.is_running(pid)
        assert again.signal(pid, "TERM")
        deadline = time.monotonic() + 5
        while again.is_running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not again.is_running(pid)


def test_small_file_ops_and_follow(remote, tmp_path):
    path = str(tmp_path / "cfg" / "run.yaml")
    os.makedirs(os.path.dirname(path))
    remote.write_file(path, b"a: 1\n", mode=0o640)
    assert remote.read_file(path) == b"a: 1\n"
    st = remote.stat(path)
    assert st is not None and st.size == 5 and st.mode == 0o640 and not st.is_dir
    assert remote.exists(path) and not remote.exists(path + ".nope")
    assert remote.stat(str(tmp_path)).is_dir
    assert not list(tmp_path.glob("cfg/.*tmp"))

    log = tmp_path / "metrics.jsonl"
    assert remote.read_from(str(log), 0) == (b"", 0)  # not created yet

    def writer():
        with open(log, "ab", buffering=0) as fh:
            for i in range(5):
                fh.write(b'{"step": %d,' % i)
                time.sleep(0.05)
                fh.write(b' "loss": 1.0}\n')
                time.sleep(0.05)

    th = threading.Thread(target=writer)
    th.start()
    lines: list[bytes] = []
    deadline = time.monotonic() + 15
    for line in remote.follow(str(log), poll_s=0.05, stop=lambda: len(lines) >= 5 or time.monotonic() > deadline):
        lines.append(line)
        if len(lines) >= 5:
            break
    th.join()
    assert lines == [b'{"step": %d, "loss": 1.0}\n' % i for i in range(5)]
    data, off = remote.read_from(str(log), 0)
    assert off == log.stat().st_size and data == log.read_bytes()
    assert remote.read_from(str(log), off) == (b"", off)


def test_remote_module_stays_out_of_the_cli():
    code = ("import sys, gpucli.ssh.remote; bad = [m for m in ('typer', 'rich', 'gpucli.cli.app', 'gpucli.cli.commands',"
            " 'gpucli.cli.render') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    package = Path(__file__).resolve().parents[3] / "gpucli" / "ssh"
    sources = sorted(package.glob("*.py"))
    assert len(sources) >= 8
    for path in sources:
        assert not re.search(r"(?<![\w.])print\(", path.read_text()), path.name

