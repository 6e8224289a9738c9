"""gpucli/pod/envbuild.py: which torch build a host gets, and when the image's Python is used as it is.

The GPU hosts are this machine with an ``nvidia-smi`` of the test's on PATH, printing what the real one
prints (its header's "CUDA Version" and ``--query-gpu=compute_cap``); the interpreters are real.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucli.pod import envbuild
from gpucli.runs import trainerenv

BUILDS = ["cu126", "cu128", "cu130"]


@pytest.mark.parametrize("driver, cap, want", [
    (None, None, "cpu"),                 # no GPU: the CPU index
    ((12, 8), (9, 0), "cu128"),          # the newest build the driver runs
    ((13, 0), (9, 0), "cu130"),
    ((12, 10), (8, 0), "cu128"),         # 12.10 is above 12.8 and below 13.0, per component
    ((12, 6), (8, 9), "cu126"),
    ((12, 8), (10, 0), "cu128"),         # B200 (sm_100): from CUDA 12.8
    ((12, 9), (12, 0), "cu128"),         # RTX 5090 (sm_120)
    ((13, 0), (10, 3), "cu130"),         # B300 (sm_103): 12.9 at least, so cu130
])
def test_the_newest_build_the_driver_runs_that_has_kernels_for_the_gpu(driver, cap, want, monkeypatch):
    monkeypatch.delenv("GPUCLI_TORCH_BUILD", raising=False)
    assert envbuild.choose_build(BUILDS, driver, cap) == want


@pytest.mark.parametrize("driver, cap, said", [
    ((12, 6), (12, 0), "needs a torch build for CUDA 12.8 or newer"),  # a Blackwell card on an old driver
    ((12, 8), (10, 3), "needs a torch build for CUDA 12.9 or newer"),
    ((12, 4), (8, 0), "runs CUDA 12.4 at most"),
])
def test_a_host_no_build_fits_is_refused_with_what_to_rent(driver, cap, said, monkeypatch):
    monkeypatch.delenv("GPUCLI_TORCH_BUILD", raising=False)
    with pytest.raises(envbuild.EnvError, match=said):
        envbuild.choose_build(BUILDS, driver, cap)


def _fake_nvidia_smi(folder: Path, cuda: str, cap: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "nvidia-smi"
    exe.write_text("#!/bin/sh\n"
                   f'if [ "$1" = "--query-gpu=compute_cap" ]; then echo {cap}; exit 0; fi\n'
                   "echo '| NVIDIA-SMI 570.124.06   Driver Version: 570.124.06   "
                   f"CUDA Version: {cuda}     |'\n")
    exe.chmod(0o755)


def test_the_driver_and_gpu_are_read_from_nvidia_smi(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path / "bin", "12.8", "10.0")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert envbuild.host_gpu() == ((12, 8), (10, 0))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert envbuild.host_gpu() == (None, None)


def test_the_image_is_used_as_it_is_only_when_it_has_every_pin_and_its_torch_runs_the_gpu():
    pins = dict(trainerenv.pins().versions)
    # this Python has every pinned version: on a CPU host it is the environment
    assert envbuild.image_has(sys.executable, pins, None)[:2] == (True, True)
    # its torch is a CPU build: on a GPU host it has no kernels, so it is neither used nor lent
    assert envbuild.image_has(sys.executable, pins, (9, 0))[:2] == (False, False)
    other = {**pins, "numpy": "1.0.0"}
    assert envbuild.image_has(sys.executable, other, None)[:2] == (False, True)  # torch still lendable


@pytest.mark.parametrize("ensurepip", [True, False])
def test_an_image_whose_torch_is_the_pinned_one_lends_it_to_the_venv(tmp_path, monkeypatch, ensurepip):
    """numpy at another version in the image (a dist-info of 1.0 first on its path): a venv is built on
    top of the image (--system-site-packages), its torch not downloaded again. Without ensurepip (Debian's
    Python without python3-venv: `-m venv` fails unless --without-pip) the image's pip fills the venv."""
    shadow = tmp_path / "shadow" / "numpy-1.0.0.dist-info"
    shadow.mkdir(parents=True)
    (shadow / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 1.0.0\n")
    image = tmp_path / "python-image"
    refuse = ('case "$*" in *"-m venv"*--without-pip*) ;; *"-m venv"*) echo "The virtual environment was not '
              'created successfully because ensurepip is not available." >&2; exit 1 ;; esac\n')
    image.write_text(f'#!/bin/sh\n{"" if ensurepip else refuse}PYTHONPATH={shadow.parent} exec {sys.executable} "$@"\n')
    image.chmod(0o755)
    monkeypatch.setenv("GPUCLI_ENV_INSTALLER", "pip")
    monkeypatch.setenv("GPUCLI_TORCH_INDEX", "none")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi: a CPU host
    got = envbuild.ensure(str(image), str(trainerenv.pin_path()), str(tmp_path / "envs"))
    venv = Path(got["python"]).parent.parent
    assert got["source"] == "built" and venv.parent == tmp_path / "envs"
    assert "include-system-site-packages = true" in (venv / "pyvenv.cfg").read_text()
    assert not list(venv.glob("lib/python*/site-packages/torch"))  # lent by the image, not installed
    assert (venv / "bin" / "pip").exists() == ensurepip
    out = subprocess.run([got["python"], "-c", "import torch, numpy; print(torch.__version__, numpy.__version__)"],
                         capture_output=True, text=True, timeout=300).stdout.split()
    assert out[0].split("+")[0] == trainerenv.pins().torch and out[1] == trainerenv.pins().versions["numpy"]
    again = envbuild.ensure(str(image), str(trainerenv.pin_path()), str(tmp_path / "envs"))
    assert again["source"] == "reused" and again["python"] == got["python"]
    if ensurepip:  # a build that never wrote its tag (interrupted) is built again, never used
        (venv / envbuild.TAG).unlink()
        assert envbuild.ensure(str(image), str(trainerenv.pin_path()), str(tmp_path / "envs"))["source"] == "built"
        assert (venv / envbuild.TAG).exists()
