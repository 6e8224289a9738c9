"""`gpucli --help` is answered without importing Typer from a generated text; it must stay Typer's."""

import subprocess
import sys

from gpucli.cli._help import ROOT_HELP
from gpucli.cli.entry import render_root_help


def test_the_cached_root_help_is_typers_own():
    assert ROOT_HELP == render_root_help(), (
        "gpucli/_help.py is out of date: run `python -m gpucli.cli.entry --write-help-cache`")


def test_console_entry_answers_help_without_typer():
    code = ("import sys; sys.argv = ['gpucli', '--help']\n"
            "from gpucli.cli.entry import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "assert 'typer' not in sys.modules, 'typer was imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ROOT_HELP


def test_other_arguments_go_through_typer():
    out = subprocess.run([sys.executable, "-m", "gpucli.cli.entry", "plan", "--model", "nope"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "unknown model 'nope'" in out.stderr
