import pytest

from gpucli import catalog, render


@pytest.fixture(autouse=True)
def fresh_state():
    """Each test sees freshly loaded catalogues and new consoles bound to its captured streams."""
    catalog.clear_cache()
    render.reset_consoles()
    yield
    catalog.clear_cache()
    render.reset_consoles()
