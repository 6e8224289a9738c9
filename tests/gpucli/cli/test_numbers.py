"""Every number a user types is finite: each float option of every command refuses nan and inf at
parse time with one line and exit 2, before any work (issue: `--budget nan` became a $0.000001 cap)."""

import pytest

from gpucli.cli.app import _command


def float_options():
    found = []
    stack = [((), _command())]
    while stack:
        path, cmd = stack.pop()
        for name, sub in getattr(cmd, "commands", {}).items():
            stack.append(((*path, name), sub))
        for param in cmd.params:
            if getattr(param.type, "name", "") in ("float", "float range") and getattr(param, "opts", None):
                long = max(param.opts, key=len)
                if long.startswith("--"):
                    found.append((" ".join(path), long))
    return sorted(found)


OPTIONS = float_options()


def test_there_are_float_options_to_check():
    # launch's budget/hours/price and plan's budget/price at least: the walk found the commands' options
    names = {opt for _, opt in OPTIONS}
    assert {"--budget", "--price"} <= names, OPTIONS


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "NaN", "1e999"])
@pytest.mark.parametrize("path,option", OPTIONS)
def test_float_option_refuses_non_finite(run, path, option, bad):
    code, out, err = run(*path.split(), f"{option}={bad}")
    assert code == 2, (path, option, bad, err)
    assert "not a finite number" in err or "not in the range" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and "internal error" not in err


def test_parser_errors_are_one_line(run):
    for args in (["plan", "--model", "1b", "--max-gpus", "abc"], ["plan"], ["plann"], ["plan", "--nope"]):
        code, _, err = run(*args)
        assert code == 2, args
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), err
        assert "-h'" in lines[0], err  # says where the help is
