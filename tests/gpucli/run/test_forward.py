"""PortForward against the real sshd fixture: a small HTTP server on the host side stands in for
TensorBoard, reached only through direct-tcpip channels of a Remote's transport."""

from __future__ import annotations

import functools
import http.server
import socket
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpucli.run.files.tensorboard import PortForward, transport_of
from gpucli.ssh.remote import Remote, SshTarget
from tests.support.sshd import free_port


@pytest.fixture
def remote(sshd, client_key):
    target = SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))
    with Remote(target) as r:
        yield r


@pytest.fixture
def web(tmp_path):
    """An HTTP server on 127.0.0.1 (the 'host side') serving a folder with one 1 MB file."""
    (tmp_path / "index.html").write_text("<h1>tensorboard stand-in</h1>")
    (tmp_path / "big.bin").write_bytes(bytes(range(256)) * 4096)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=20) as r:
        return r.read()


def test_forwards_http_through_the_ssh_transport(remote, web):
    with PortForward(transport_of(remote), web) as fwd:
        assert fwd.port != web and fwd.alive
        assert get(fwd.port, "/index.html") == b"<h1>tensorboard stand-in</h1>"
        with ThreadPoolExecutor(6) as pool:  # concurrent connections, each its own channel
            bodies = list(pool.map(lambda _: get(fwd.port, "/big.bin"), range(6)))
        assert all(b == bytes(range(256)) * 4096 for b in bodies)
    with pytest.raises(OSError):  # closed: the local port no longer accepts
        socket.create_connection(("127.0.0.1", fwd.port), timeout=2).recv(1)


def test_a_refused_remote_port_closes_that_connection_only(remote, web):
    dead = free_port()
    with PortForward(transport_of(remote), dead) as fwd:
        with socket.create_connection(("127.0.0.1", fwd.port), timeout=20) as s:
            s.settimeout(20)
            assert s.recv(1) == b""  # closed, not hung
        assert fwd.alive
    with PortForward(transport_of(remote), web, local_port=0) as fwd:
        assert b"stand-in" in get(fwd.port, "/")


def test_wait_returns_when_the_ssh_connection_drops(remote, web):
    fwd = PortForward(transport_of(remote), web)
    done = threading.Event()
    threading.Thread(target=lambda: (fwd.wait(0.1), done.set()), daemon=True).start()
    remote.close()
    assert done.wait(10)
    fwd.close()
