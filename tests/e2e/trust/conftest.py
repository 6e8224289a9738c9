import pytest

from gpucli.cli import render
from gpucli.plan import catalog


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    catalog.clear_cache()
    render.reset_consoles()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("GPUCLI_PROVIDER_POLL_S", "0.05")
    yield
    render.reset_consoles()
