"""CLI tests run ``gpucli.cli.app.main`` in-process against the provider emulators.

Each test gets fresh consoles (bound to its captured streams), a freshly loaded catalogue, and a HOME
of its own so a key file the developer has (``~/.runpod/config.toml``, ``~/.vast_api_key``) never leaks
into a test.
"""

import pytest

from gpucli.cli import render
from gpucli.plan import catalog


@pytest.fixture(autouse=True)
def fresh_state(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("user_home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    catalog.clear_cache()
    render.reset_consoles()
    yield home
    catalog.clear_cache()
    render.reset_consoles()


@pytest.fixture
def run(capsys):
    """``run(*args) -> (exit code, stdout, stderr)`` through the real entry point."""
    from gpucli.cli.app import main

    def _run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return _run
