"""The environment the bundled trainer is tested with, as gpucli reads it: the pin file
``trainer/requirements.txt`` (the one place its versions are declared, shipped inside the trainer
package), what a pod's driver must run for it, and what setup_pod.sh reports after building it.

On the pod, gpucli/pod/envbuild.py does the work (the image's Python when it already has the pins, else
a venv on the run's volume keyed by the pin file's hash); here are the command that starts it and the
reading of its answer.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from typing import Any

from gpucli.runs import podfiles
from trainer.spec.environment import PIN_FILE, Pins, build_cuda, cuda_tuple, pin_path, pins, wheel_min_cuda

ENV_BUILDER = podfiles.ENVIRONMENT.file("envbuild.py").path
#: Where a run's venvs live, from its run folder: beside the run folders on the same disk (the pod's
#: volume), so a resume, a restart and the next run there reuse them.
ENV_ROOT = "../.gpucli-envs"
#: What setup_pod.sh's caller forwards to the pod (gpucli/pod/envbuild.py reads them): the wheel source
#: and the installer, so a mirror or an offline wheel folder can stand in for PyTorch's index.
FORWARDED = ("GPUCLI_TORCH_INDEX", "GPUCLI_ENV_INSTALLER", "GPUCLI_TORCH_BUILD")
_MARK = "GPUCLI-ENV "
__all__ = ["ENV_BUILDER", "ENV_ROOT", "PIN_FILE", "EnvResult", "Pins", "build_cuda", "cuda_tuple", "parse_result",
           "pin_path", "pins", "setup_command", "wheel_min_cuda"]


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
