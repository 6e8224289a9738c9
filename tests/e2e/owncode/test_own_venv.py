"""Your own code sees your environment: gpucli installed in a venv, as users install it.

The venv is real (``python -m venv`` without the system's packages, gpucli installed into it editable from
this checkout, a module only it has). A job launched by that gpucli on ``local``, or on ``ssh`` with
``--python`` naming that venv's Python, imports the venv's packages (the job venv used to be made with
``--system-site-packages`` from the *base* interpreter: nanoGPT's train.py found no torch); what the job's
``--setup`` installs lands in the job's own venv and never in gpucli's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucli.runs import records as runs
from tests.e2e.owncode.helpers import finished_rows
from tests.support.cli import cli

ROOT = Path(__file__).resolve().parents[3]
PROBE = "import gpucli, userprobe, sys; print('probe', userprobe.WHERE, sys.prefix, flush=True)"
SETUP_PROBE = "import setupprobe; print('setup', setupprobe.__file__, flush=True)"


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("uservenv")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    # gpucli from this checkout with its CLI dependencies, as `pip install -e .` does for a user
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-e", str(ROOT)],
                   check=True, timeout=900, capture_output=True)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "userprobe.py").write_text(f"WHERE = {str(venv)!r}\n")  # only this venv has it
    return py


@pytest.fixture(scope="module")
def setup_wheel(tmp_path_factory) -> Path:
    """A wheel of a one-module package, for --setup to install (offline: --no-index --find-links)."""
    src = tmp_path_factory.mktemp("setupprobe")
    (src / "setupprobe.py").write_text("X = 1\n")
    (src / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                                        '"setuptools.build_meta"\n[project]\nname = "setupprobe"\nversion = "1.0"\n'
                                        '[tool.setuptools]\npy-modules = ["setupprobe"]\n')
    wheels = src / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(src)], check=True, timeout=300, capture_output=True)
    return wheels


def _code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(f"{PROBE}\n{SETUP_PROBE}\n")
    return code


def _setup(wheels: Path) -> str:
    return f"python -m pip install -q --no-index --find-links {wheels} setupprobe"


def _assert_saw_the_venv(log: str, user_py: Path) -> None:
    probe = next(line for line in log.splitlines() if line.startswith("probe "))
    _, where, prefix = probe.split()
    assert where == str(user_py.parent.parent)  # the user's venv's own module
    assert Path(prefix).parent.name == ".venvs"  # from the job's venv, on top of it
    setup = next(line for line in log.splitlines() if line.startswith("setup "))
    assert setup.split()[1].startswith(prefix)  # --setup installed into the job venv


def _gpucli_env_unchanged(user_py: Path) -> None:
    res = subprocess.run([str(user_py), "-c", "import setupprobe"], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "No module named 'setupprobe'" in res.stderr
    assert subprocess.run([sys.executable, "-c", "import setupprobe"], capture_output=True).returncode != 0


def test_local_own_code_sees_the_venv_gpucli_runs_in(user_venv, setup_wheel, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "0.25")
    code = _code(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    gpucli = [str(user_venv), "-m", "gpucli"]
    res = subprocess.run([*gpucli, "launch", "--provider", "local", "--code", str(code), "--run", "python train.py",
                          "--setup", _setup(setup_wheel), "--name", "venv-local"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        st = json.loads(subprocess.run([*gpucli, "status", "venv-local", "--json"], capture_output=True, text=True,
                                       env=env, timeout=120).stdout)
        if st["state"] in ("finished", "failed", "crashed", "stopped"):
            break
        time.sleep(1)
    log = (Path(runs.load("venv-local").workdir) / "train.log").read_text()
    assert st["state"] == "finished", log[-2000:]
    _assert_saw_the_venv(log, user_venv)
    _gpucli_env_unchanged(user_venv)


def test_ssh_own_code_sees_the_packages_of_python(user_venv, setup_wheel, capsys, tmp_path, sshd, client_key,
                                                  monkeypatch):
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "0.25")
    code = _code(tmp_path)
    rc, out, err = cli(capsys, "launch", "--provider", "ssh", "--host", f"{sshd.user}@127.0.0.1:{sshd.port}",
                       "--identity", str(client_key[0]), "--python", str(user_venv),
                       "--workdir", str(tmp_path / "host" / "venv-ssh"), "--code", str(code), "--run", "python train.py",
                       "--setup", _setup(setup_wheel), "--name", "venv-ssh")
    assert rc == 0, err
    finished_rows(capsys, "venv-ssh", timeout_s=300)
    log = (tmp_path / "host" / "venv-ssh" / "train.log").read_text()
    _assert_saw_the_venv(log, user_venv)
    _gpucli_env_unchanged(user_venv)
