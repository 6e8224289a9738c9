"""Tables fit a 100-column terminal: no number is cut (`$75…`, `h100-pc…`), long sources become
footnotes, and user output never names our own notes ("the $1000 8x H100 setup guide")."""


import pytest

from gpucli.cli import render
from gpucli.cli.app import main


@pytest.fixture
def narrow():
    """A 100-column stdout console, as a terminal of that width gets (the modules that print hold
    `render.out` by name, so the console itself is swapped, not the function)."""
    from rich.console import Console

    render.reset_consoles()
    render._OUT = Console(width=100, highlight=False, soft_wrap=False, force_terminal=False)  # writes to sys.stdout of the moment
    yield
    render.reset_consoles()


@pytest.mark.parametrize("args", [
    ["gpus"], ["models"], ["profiles"],
    ["plan", "--model", "1b", "--no-chart"],
    ["plan", "--model", "d64", "--gpu", "h100-pcie", "--price", "4", "--budget", "1000", "--no-chart"],
    ["plan", "--model", "7b", "--workload", "generate", "--tokens", "12.3M", "--no-chart"],
])
def test_tables_fit_100_columns(capsys, narrow, args):
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.strip()
    for line in out.splitlines():
        assert len(line) <= 100, line
        assert "…" not in line, f"a cut cell in `gpucli {' '.join(args)}`: {line}"
    assert "seed 0" not in out.lower(), "user output names our notes"
