"""The environment the bundled trainer is tested with, read from its pin file ``trainer/requirements.txt``
(the one place its versions are declared; shipped inside the package). Torch-free: the planner, the
launch and the tests read it; gpucli/pod/envbuild.py reads the same file on the pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PIN_FILE = "requirements.txt"  # inside the trainer package


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
    return Path(__file__).resolve().parents[1] / PIN_FILE


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


def newest_build_cuda() -> str | None:
    """The newest CUDA any of torch's pinned builds is made for ("13.0"): a GPU needing more has none."""
    cudas = [c for c in (build_cuda(b) for b in pins().cuda_builds) if c]
    return max(cudas, key=cuda_tuple, default=None)
