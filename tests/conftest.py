"""Shared fixtures: every test gets its own GPUCLI_HOME so no test reads or writes real user state."""

from __future__ import annotations

import os
import signal

import pytest

# One math thread per process: the suite runs several workers on a 2-core machine, and each torch
# (OpenMP) process spinning a thread per core slowed CPU-bound tests up to 7x (a 10 s test took 78 s).
# Set before torch is imported here, and inherited by the trainers the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

# A suite started where SIGINT is ignored (a background job of a shell without job control, `nohup`)
# would hand that on to every process it starts, and the tests of what Ctrl-C does to gpucli would see it
# do nothing (8 such failures in one run). A handler of its own here means each child starts with the
# default, as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from tests.support.sshd import SshServer, make_keypair

# The RunPod and vast.ai emulator fixtures (runpod_emulator, vast_emulator) for every test directory.
pytest_plugins = ["tests.support.emulators.fixtures", "tests.support.telegram"]


@pytest.fixture(scope="session", autouse=True)
def stale_pyenv_lock_reaper():
    """On machines whose login shells run `pyenv init` (a pyenv-managed Python, as on these dev and CI
    machines), every SSH login of the test servers runs `pyenv rehash`, which takes a lock file. A login
    shell killed mid-rehash (an emulator pod being terminated) leaves the lock behind, and every later
    login then waits pyenv's 60 s for it: commands time out all over the suite. A rehash holds the lock
    well under a second, so a lock older than 10 s is stale: remove it while the tests run."""
    import os
    import threading
    import time
    from pathlib import Path

    lock = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "shims" / ".pyenv-shim"
    if not lock.parent.is_dir():
        yield
        return
    stop = threading.Event()

    def reap() -> None:
        while not stop.wait(2.0):
            try:
                if time.time() - lock.stat().st_mtime > 10:
                    lock.unlink()
            except OSError:
                pass

    thread = threading.Thread(target=reap, name="pyenv-lock-reaper", daemon=True)
    thread.start()
    yield
    stop.set()


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("gpucli_home")
    monkeypatch.setenv("GPUCLI_HOME", str(home))
    for var in ("GPUCLI_CATALOG", "RUNPOD_API_KEY", "VAST_API_KEY", "TELEGRAM_BOT_TOKEN",
                "TELEGRAM_CHAT_ID", "RUNPOD_API_BASE_URL", "VAST_URL", "TELEGRAM_API_BASE"):
        monkeypatch.delenv(var, raising=False)
    return home


@pytest.fixture
def client_key(tmp_path_factory):
    """An ed25519 key pair for the SSH client side: (private key path, public key text)."""
    return make_keypair(tmp_path_factory.mktemp("client_key") / "id_ed25519")


@pytest.fixture
def sshd(tmp_path_factory, client_key):
    """A real OpenSSH sshd on 127.0.0.1 that accepts ``client_key``."""
    server = SshServer.start(tmp_path_factory.mktemp("sshd"), authorized_keys=[client_key[1]])
    yield server
    server.stop()
