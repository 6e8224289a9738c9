"""ssh-config entries used by the real OpenSSH client, a port forwarded over the run's SSH reached with a
real HTTP client, and ``--provider ssh --host NAME`` read from ~/.ssh/config (ProxyJump included)."""

from __future__ import annotations

import functools
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from gpucli.runs.sshconfig import target_from_config
from tests.support.cli import cli, wait_for


def _ssh(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", *args], capture_output=True, text=True,
                          timeout=30)


def test_ssh_config_entry_works_with_the_real_client_and_down_removes_it(capsys, ssh_run, fake_home):
    config = fake_home / ".ssh" / "config"
    config.parent.mkdir()
    config.write_text("Host other\n    User someone\n")
    code, out, err = cli(capsys, "ssh-config", "r1", "--json")
    assert code == 0, err
    entry = json.loads(out)
    assert entry["host"] == "gpucli-r1" and entry["include_added"]
    text = config.read_text()
    assert text.index("Include ") < text.index("Host other")  # at the top, outside any Host block
    assert oct(Path(entry["file"]).stat().st_mode & 0o777) == "0o600"
    res = _ssh(config, "gpucli-r1", "pwd; echo ok-from-pod")
    assert res.returncode == 0, res.stderr
    assert "ok-from-pod" in res.stdout
    # scp by name too
    (fake_home / "f.txt").write_text("payload")
    res = subprocess.run(["scp", "-F", str(config), "-o", "BatchMode=yes", str(fake_home / "f.txt"),
                          f"gpucli-r1:{ssh_run.workdir}/f.txt"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert (Path(ssh_run.workdir) / "f.txt").read_text() == "payload"
    # the pinned key is enforced: a wrong one is refused by ssh itself
    known = Path(entry["known_hosts"])
    good = known.read_text()
    known.write_text(good.split()[0] + " ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
    res = _ssh(config, "gpucli-r1", "true")
    assert res.returncode != 0 and "HOST IDENTIFICATION HAS CHANGED" in res.stderr.upper()
    known.write_text(good)
    # a second ssh-config leaves one Include line
    assert cli(capsys, "ssh-config", "r1")[0] == 0
    assert config.read_text().count("Include ") == 1
    code, out, err = cli(capsys, "down", "r1")
    assert code == 0, err
    assert not Path(entry["file"]).exists() and not known.exists()
    res = _ssh(config, "gpucli-r1", "true")
    assert res.returncode != 0


def test_local_run_has_no_ssh_config(capsys, fake_home):
    from gpucli.runs.records import RunRecord, now_iso

    runs.save(RunRecord(name="loc", provider="local", created_at=now_iso(), profile="cpu", phase="fast",
                        model="tiny", n_gpus=1, gpu=None, workdir="/tmp/x", status="finished"))
    code, out, err = cli(capsys, "ssh-config", "loc")
    assert code != 0 and "this machine" in err and "Traceback" not in err


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # noqa: D401 - keep the test output clean
        pass


def test_forward_reaches_a_server_on_the_host(tmp_path, ssh_run, isolated_home):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("hello from the pod's jupyter")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        local = s.getsockname()[1]
    env = {**os.environ, "GPUCLI_HOME": str(isolated_home), "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen([sys.executable, "-m", "gpucli", "forward", "r1", f"{server.server_port}:{local}", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert json.loads(line)["local_port"] == local, proc.stderr.read() if not line else line
        body = urllib.request.urlopen(f"http://127.0.0.1:{local}/index.html", timeout=20).read().decode()
        assert body == "hello from the pod's jupyter"
        # a second connection over the same tunnel
        assert urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=20).status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        server.shutdown()


@pytest.mark.parametrize("spec, needle", [("abc", "cannot read port"), ("70000", "out of range"),
                                          ("22:99999", "out of range")])
def test_forward_bad_ports_are_one_line(capsys, ssh_run, spec, needle):
    code, out, err = cli(capsys, "forward", "r1", spec)
    assert code != 0 and needle in err and "Traceback" not in err


def test_forward_busy_local_port(capsys, ssh_run):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        code, out, err = cli(capsys, "forward", "r1", f"22:{s.getsockname()[1]}")
    assert code != 0 and "in use" in err


def test_host_name_from_ssh_config_with_proxyjump(capsys, tmp_path, sshd, client_key, fake_home, monkeypatch):
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "0.25")
    ssh_dir = fake_home / ".ssh"
    ssh_dir.mkdir()
    kh = ssh_dir / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(sshd.host_key_pub.split()[:2])}\n")
    config = ssh_dir / "config"
    # "box" is reached through "jumpbox" (the same sshd: a jump to itself is still a real ssh -W hop)
    config.write_text(f"Host jumpbox\n    HostName 127.0.0.1\n    Port {sshd.port}\n    User {sshd.user}\n"
                      f"    IdentityFile {client_key[0]}\n    UserKnownHostsFile {kh}\n\n"
                      f"Host box\n    HostName 127.0.0.1\n    Port {sshd.port}\n    User {sshd.user}\n"
                      f"    IdentityFile {client_key[0]}\n    ProxyJump jumpbox\n")
    target = target_from_config("box")
    assert target is not None and target.user == sshd.user and target.port == sshd.port
    assert target.identity_file == str(client_key[0]) and target.proxy_jump == "jumpbox"
    assert target_from_config("not-in-config") is None
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "job.py").write_text("print('step 1: loss 1.5', flush=True)\n")
    wd = tmp_path / "pod" / "viajump"
    code, out, err = cli(capsys, "launch", "--code", str(code_dir), "--run", f"{sys.executable} job.py",
                         "--name", "viajump", "--provider", "ssh", "--host", "box", "--python", sys.executable,
                         "--workdir", str(wd))
    assert code == 0, err
    record = runs.load("viajump")
    assert record.ssh.proxy_jump == "jumpbox" and record.ssh.user == sshd.user
    wait_for(lambda: (wd / "status.json").exists() and json.loads((wd / "status.json").read_text())["state"]
             == "finished", 60, "the job")
    code, out, err = cli(capsys, "status", "viajump", "--json")
    assert code == 0, err
    assert json.loads(out)["state"] == "finished"


def test_bad_ssh_config_is_one_line(capsys, fake_home):
    (fake_home / ".ssh").mkdir()
    (fake_home / ".ssh" / "config").write_text("Host box\n    Port notanumber\n")
    code, out, err = cli(capsys, "launch", "--code", str(fake_home), "--run", "true", "--provider", "ssh",
                         "--host", "box", "--dry-run")
    assert code != 0 and "Port" in err and "Traceback" not in err
