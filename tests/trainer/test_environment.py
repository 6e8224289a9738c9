"""The trainer's environment is declared once (trainer/requirements.txt) and everything agrees with it:
pyproject's `train` extra, scripts/test.sh, the pod's builder; and every trainer module imports under it."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from gpucli.pod import envbuild
from gpucli.runs import trainerenv

ROOT = Path(__file__).resolve().parents[2]
TRAINER_IMPORTS = {"torch", "numpy", "tokenizers", "safetensors", "tensorboard", "pyyaml"}


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirement(text: str) -> tuple[str, str | None]:
    m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*(?:>=\s*([0-9][^,;\s]*))?.*", text)
    assert m, text
    return m.group(1).lower().replace("_", "-"), m.group(2)


def test_the_pin_file_pins_every_package_the_trainer_imports_exactly():
    pins = trainerenv.pins()
    assert set(pins.versions) == TRAINER_IMPORTS
    raw = [ln for ln in pins.path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert all(re.fullmatch(r"[a-z0-9_.-]+==[0-9][0-9A-Za-z.]*", ln) for ln in raw), raw
    assert pins.cuda_builds and all(trainerenv.build_cuda(b) for b in pins.cuda_builds)
    # oldest first, compared per component
    cudas = [trainerenv.cuda_tuple(trainerenv.build_cuda(b) or "") for b in pins.cuda_builds]
    assert cudas == sorted(cudas)
    # the pod's builder reads the very same file the same way
    versions, builds, python = envbuild.read_pins(str(pins.path))
    assert versions == dict(pins.versions) and tuple(builds) == pins.cuda_builds and python == pins.python


def test_pyproject_train_extra_claims_the_pinned_versions_and_ships_the_pin_file():
    project = _pyproject()
    pins = trainerenv.pins().versions
    train = dict(_requirement(r) for r in project["project"]["optional-dependencies"]["train"])
    core = dict(_requirement(r) for r in project["project"]["dependencies"])
    for name, version in pins.items():
        if name in train:
            assert train[name] == version, f"train extra claims {name}>={train[name]}, the tested one is {version}"
        else:  # pyyaml: a dependency of the CLI itself, its minimum at or below the tested version
            assert name in core and core[name] is not None
            assert tuple(map(int, core[name].split("."))) <= tuple(map(int, version.split(".")))
    assert set(train) <= set(pins)
    data = project["tool"]["setuptools"]["package-data"]["trainer"]
    assert trainerenv.PIN_FILE in data


def test_scripts_test_sh_installs_from_the_pin_file():
    text = (ROOT / "scripts" / "test.sh").read_text()
    assert "trainer/requirements.txt" in text and '-r "$PINS"' in text
    assert not re.search(r"torch==[0-9]", text)  # no second copy of the version


def test_the_tests_run_under_the_pinned_versions():
    for name, version in trainerenv.pins().versions.items():
        assert metadata.version(name).split("+")[0] == version, name


def test_every_trainer_module_imports_under_the_pinned_versions():
    # A fresh interpreter: what `python -m trainer.train` on a pod imports, module by module.
    code = ("import importlib, pkgutil, trainer\n"
            "names = [m.name for m in pkgutil.walk_packages(trainer.__path__, 'trainer.')]\n"
            "for n in names: importlib.import_module(n)\n"
            "print(len(names))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) > 30
