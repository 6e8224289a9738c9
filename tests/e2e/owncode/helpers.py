"""Launching the test suite's third-party-style scripts through the whole gpucli loop, as a user would."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.support.cli import cli, rows_of, wait_for
from tests.support.jobscripts import local_text, write_script

# What each script is run with: nanoGPT's reads the text file it is given.
ARGS = {"nanogpt": " input.txt", "nanochat": "", "hf": "", "lightning": "", "jsonfile": "", "graceful": "",
        "stubborn": "", "failing": ""}


def code_dir(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A code folder holding the ``kind`` script (and local text), and the command that runs it."""
    code = tmp_path / f"code-{kind}"
    name = write_script(code, kind)
    (code / "input.txt").write_text(local_text())
    return code, f"{sys.executable} {name}{ARGS[kind]}"


def launch_own(capsys: Any, tmp_path: Path, kind: str, name: str, *extra: str) -> tuple[int, str, str]:
    code, cmd = code_dir(tmp_path, kind)
    return cli(capsys, "launch", "--code", str(code), "--run", cmd, "--name", name, *extra)


def finished_rows(capsys: Any, name: str, timeout_s: float = 120) -> list[dict]:
    """The run's rows once its ``finished`` event is there."""
    return wait_for(lambda: (lambda rows: rows if any(r.get("event") == "finished" for r in rows) else None)(
        rows_of(capsys, name)), timeout_s, f"{name} to finish")


def train_losses(rows: list[dict]) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in rows if r.get("kind") == "train"]


def fetch_best(capsys: Any, name: str, dest: Path) -> dict:
    code, out, err = cli(capsys, "fetch-best", name, "--dest", str(dest), "--json")
    assert code == 0, err
    return json.loads(out)


def status_json(capsys: Any, name: str) -> dict:
    code, out, err = cli(capsys, "status", name, "--json")
    assert code == 0, err
    return json.loads(out)
