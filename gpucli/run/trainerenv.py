"""The environment the bundled trainer is tested with, as gpucli reads it: the pin file
``trainer/requirements.txt`` (the one place its versions are declared, shipped inside the trainer
package), what a pod's driver must run for it, and what setup_pod.sh reports after building it.

On the pod, gpucli/pod/envbuild.py does the work (the image's Python when it already has the pins, else
a venv on the run's volume keyed by the pin file's hash); here are the command that starts it and the
reading of its answer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpucli.errors import GpucliError

PIN_FILE = "requirements.txt"  # inside the trainer package
ENV_BUILDER = Path(__file__).resolve().parents[1] / "pod" / "envbuild.py"
#: Where a run's venvs live, from its run folder: beside the run folders on the same disk (the pod's
#: volume), so a resume, a restart and the next run there reuse them.
ENV_ROOT = "../.gpucli-envs"
#: What setup_pod.sh's caller forwards to the pod (gpucli/pod/envbuild.py reads them): the wheel source
#: and the installer, so a mirror or an offline wheel folder can stand in for PyTorch's index.
FORWARDED = ("GPUCLI_TORCH_INDEX", "GPUCLI_ENV_INSTALLER", "GPUCLI_TORCH_BUILD")
_MARK = "GPUCLI-ENV "


@dataclass(frozen=True)
class Pins:
    """The pin file: package -> exact version, torch's CUDA builds (oldest first), the minimum Python."""

    versions: Mapping[str, str]
    cuda_builds: tuple[str, ...]
    python: str
    path: Path

    @property
    def torch(self) -> str:
        return self.versions["torch"]


def cuda_tuple(text: str | float) -> tuple[int, ...]:
    """A CUDA version as numbers, compared per component ("12.10" is above "12.4"). vast reports
    ``cuda_max_good`` as a JSON number (12.8), RunPod ``cudaVersions`` as strings ("12.8")."""
    return tuple(int(p) for p in re.findall(r"\d+", str(text)))


def build_cuda(build: str) -> str | None:
    """"cu128" -> "12.8"; None for a CPU build."""
    m = re.fullmatch(r"cu(\d+)(\d)", build)
    return f"{int(m.group(1))}.{m.group(2)}" if m else None


def pin_path() -> Path:
    spec = importlib.util.find_spec("trainer")
    if spec is None or not spec.origin:
        raise GpucliError("the bundled trainer package is not installed", hint="reinstall gpucli")
    return Path(spec.origin).resolve().parent / PIN_FILE


@lru_cache(maxsize=4)
def _read(path: Path) -> Pins:
    versions: dict[str, str] = {}
    builds: tuple[str, ...] = ()
    python = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("# cuda-builds:"):
            builds = tuple(line.split(":", 1)[1].split())
        elif line.startswith("# python:"):
            python = line.split(":", 1)[1].strip()
        elif line and not line.startswith("#"):
            name, _, version = line.split(";")[0].partition("==")
            versions[name.strip().lower()] = version.strip()
    return Pins(versions=versions, cuda_builds=builds, python=python, path=path)


def pins() -> Pins:
    return _read(pin_path())


def wheel_min_cuda(need: str | None, floor: str | None = None) -> str | None:
    """The host CUDA a pod must run for the trainer: the oldest torch build in the pin file that serves
    both ``need`` (the GPU's: gpus.yaml ``min_cuda``) and ``floor`` (the image's). None: no constraint."""
    wanted = max((cuda_tuple(v) for v in (need, floor) if v), default=None)
    if wanted is None:
        return None
    for build in pins().cuda_builds:
        cuda = build_cuda(build)
        if cuda and cuda_tuple(cuda) >= wanted:
            return cuda
    return ".".join(map(str, wanted))


@dataclass(frozen=True)
class EnvResult:
    """What setup_pod.sh did: the Python the trainer runs with and where it came from."""

    python: str
    source: str  # image | reused | built
    build: str  # cpu | cu126 | cu128 | ...
    seconds: float
    driver_cuda: str | None = None

    @property
    def describe(self) -> str:
        what = {"image": "the image's Python has it", "reused": "reused the venv on the volume",
                "built": "built a venv on the volume"}.get(self.source, self.source)
        driver = f", driver CUDA {self.driver_cuda}" if self.driver_cuda else ""
        return f"trainer environment ({pins().torch}, {self.build}{driver}): {what} in {self.seconds:.0f} s"


def parse_result(stdout: str) -> EnvResult | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(_MARK):
            try:
                raw: Any = json.loads(line[len(_MARK):])
                return EnvResult(python=str(raw["python"]), source=str(raw["source"]), build=str(raw["build"]),
                                 seconds=float(raw["seconds"]),
                                 driver_cuda=str(raw["driver_cuda"]) if raw.get("driver_cuda") else None)
            except (ValueError, KeyError, TypeError, RecursionError):
                return None
    return None


def setup_command(workdir: str, python: str) -> str:
    """The line that runs setup_pod.sh in the run folder (where it, envbuild.py and the pin file were
    written), with the wheel-source settings of this machine's environment."""
    env = " ".join(f"{k}={shlex.quote(os.environ[k])}" for k in FORWARDED if os.environ.get(k, "").strip())
    return (f"cd {shlex.quote(workdir)} && {env + ' ' if env else ''}sh ./setup_pod.sh "
            f"{shlex.quote(python)} {ENV_ROOT}")
