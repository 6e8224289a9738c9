import pytest

from gpucli.cli import render
from gpucli.plan import catalog


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    catalog.clear_cache()
    render.reset_consoles()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the trainer subprocesses share two cores with the suite
    yield
    render.reset_consoles()
