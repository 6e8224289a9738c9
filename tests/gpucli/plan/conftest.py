import pytest

from gpucli.cli import render
from gpucli.plan import catalog


@pytest.fixture(autouse=True)
def fresh_state():
    """Each test sees freshly loaded catalogues and new consoles bound to its captured streams."""
    catalog.clear_cache()
    render.reset_consoles()
    yield
    catalog.clear_cache()
    render.reset_consoles()
