import pytest

from gpucli.cli import render
from gpucli.plan import catalog


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    # An emulator pod takes the processes started in it along when it is stopped, terminated or
    # preempted, and the emulator fixtures end every pod on teardown: nothing needs killing here.
    catalog.clear_cache()
    render.reset_consoles()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the trainer subprocesses share two cores with the suite
    monkeypatch.setenv("GPUCLI_PROVIDER_POLL_S", "0.05")  # the emulators' pods start in a few polls
    yield
    render.reset_consoles()
