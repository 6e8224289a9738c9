"""Shell completion: the scripts typer generates for bash and zsh, checked with a real bash
``complete`` call (commands and run names), and ``python -m gpucli``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def gpucli_on_path(tmp_path, isolated_home):
    """A ``gpucli`` executable (this checkout, as ``python -m gpucli``) and two runs to complete."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "gpucli"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpucli "$@"\n')
    exe.chmod(0o755)
    runs = isolated_home / "runs"
    runs.mkdir(exist_ok=True)
    for name in ("run-alpha", "run-beta", "other"):
        (runs / f"{name}.json").write_text("{}")
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO),
            "GPUCLI_HOME": str(isolated_home)}


def _bash(env: dict, script: str) -> str:
    res = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _complete(*words: str) -> str:
    """A bash completion call as the shell makes it on Tab after ``words`` (the last one being typed)."""
    quoted = " ".join(f"'{w}'" for w in words)
    return (f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
            '_gpucli_completion gpucli; printf "%s\\n" "${COMPREPLY[@]}"; echo ---; ')


def test_bash_completion_of_commands_and_run_names(gpucli_on_path):
    script = "source <(gpucli --show-completion bash) && complete -p gpucli && echo --- && "
    out = _bash(gpucli_on_path, script + _complete("gpucli", "sta") + _complete("gpucli", "status", "run-")
                + _complete("gpucli", "forward", "") + _complete("gpucli", "logs", "o"))
    registration, commands, runs, forward, logs, _ = out.split("---\n")
    assert "complete -o default -F _gpucli_completion gpucli" in registration
    assert {"status"} <= set(commands.split())
    assert set(runs.split()) == {"run-alpha", "run-beta"}
    assert set(forward.split()) == {"run-alpha", "run-beta", "other"}
    assert logs.split() == ["other"]


def test_zsh_script_and_its_answers(gpucli_on_path):
    env = {**gpucli_on_path, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    script = subprocess.run(["gpucli", "--show-completion", "zsh"], env=env, capture_output=True, text=True,
                            timeout=60).stdout
    assert script.startswith("#compdef gpucli") and "_GPUCLI_COMPLETE=complete_zsh" in script
    answer = subprocess.run(["gpucli"], env={**gpucli_on_path, "_TYPER_COMPLETE_ARGS": "gpucli ssh-config run-b",
                                             "_GPUCLI_COMPLETE": "complete_zsh"},
                            capture_output=True, text=True, timeout=60).stdout
    assert '"run-beta"' in answer and "run-alpha" not in answer


def test_python_dash_m(gpucli_on_path):
    res = subprocess.run([sys.executable, "-m", "gpucli", "--version"], env=gpucli_on_path, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.startswith("gpucli ")
    res = subprocess.run([sys.executable, "-m", "gpucli", "status", "no-such-run"], env=gpucli_on_path,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "Traceback" not in res.stderr
