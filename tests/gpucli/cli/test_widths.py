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


@pytest.fixture
def eighty():
    """An 80-column stdout console: what a new user's terminal often is."""
    from rich.console import Console

    render.reset_consoles()
    render._OUT = Console(width=80, highlight=False, soft_wrap=False, force_terminal=False)
    yield
    render.reset_consoles()


@pytest.mark.parametrize("args", [["models"], ["plan", "--model", "1b", "--no-chart"],
                                  ["plan", "--model", "124m", "--no-chart"]])
def test_the_main_tables_fit_80_columns_whole(capsys, eighty, args):
    """At 80 columns the front and the presets drop their least needed columns instead of cutting the
    setup, hours and cost cells (`8x B2…`, `$95…`)."""
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "…" not in out, out
    front = out.split("Pareto front", 1)[-1]
    for column in ("setup", "hours", "cost", "$/h", "tok/s") if args[0] == "plan" else ("model", "params"):
        assert column in front


def test_explain_says_what_fits_once(capsys):
    assert main(["plan", "--model", "1b", "--explain", "8x H100 SXM"]) == 0
    out = capsys.readouterr().out
    assert "fits: fits" not in out and "-> fits" in out


def test_root_help_lists_every_command_whole_at_80_columns():
    """`gpucli --help` gives each command one whole line: click cuts a long first sentence to fit 80
    columns at any terminal width, so every command needs a short line of its own."""
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "gpucli", "--help"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0
    commands = r.stdout.split("Commands:", 1)[1]
    assert "..." not in commands, commands
    for line in commands.splitlines():
        assert len(line) <= 80, line


def test_plain_gpucli_is_help_not_an_error(capsys):
    assert main([]) == 0
    out, err = capsys.readouterr()
    assert "Commands:" in out and "plan" in out
    assert "Error" not in err
