"""ruff and mypy run in the suite (their settings are in pyproject.toml): a lint error or a type error
fails the tests like any other defect."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_is_clean():
    if shutil.which("ruff") is None and _run("ruff", "--version").returncode != 0:
        pytest.skip("ruff is not installed (scripts/test.sh installs the test extra)")
    out = _run("ruff", "check", "gpucli", "trainer", "tests", "scripts")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_mypy_is_clean():
    if _run("mypy", "--version").returncode != 0:
        pytest.skip("mypy is not installed (scripts/test.sh installs the test extra)")
    out = _run("mypy")  # files and options from pyproject.toml
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
