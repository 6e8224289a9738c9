"""The bundled trainer's pinned environment on the machine that runs it. Standard library only: uploaded
beside the run folder with the pin file (``trainer/requirements.txt``) and run by setup_pod.sh in the
image's Python::

    python envbuild.py --pins requirements.txt --root ENV_ROOT

1. What the host can run: ``nvidia-smi``'s "CUDA Version" (the newest CUDA its driver runs) and the
   GPU's compute capability; no ``nvidia-smi`` (or no GPU) means torch's CPU build.
2. Which torch build: the newest of the pin file's ``cuda-builds`` the driver runs (a cu128 wheel needs a
   driver with CUDA >= 12.8); a GPU that needs a newer build than the driver allows (a Blackwell GPU on a
   CUDA 12.6 driver) is refused here, in the first minute, with what to change.
3. The image's Python as it is, when every pinned package is there at its pinned version and its torch has
   kernels for the GPU. Else a venv ``ENV_ROOT/trainer-<hash of the pin file>-<build>``: reused when it is
   whole (a resume, a restart, a second run on the same volume), else built with uv when the host has it
   (pip otherwise): torch from PyTorch's index for the build, the rest from the default index. An image
   whose torch is the pinned one and fits the GPU lends it (``--system-site-packages``) and the venv
   gets only the other packages. A tag file written last marks a venv whole: an interrupted build is
   built again, never used.

The last line printed is ``GPUCLI-ENV {json}``: the Python to run the trainer with, where it came from
(``image`` | ``reused`` | ``built``), the torch build, torch's version and the seconds it took.

Overrides (environment): ``GPUCLI_TORCH_INDEX`` the base of PyTorch's wheel index (the build is
appended; ``none``: the installer's own configured sources, e.g. a local wheel folder),
``GPUCLI_ENV_INSTALLER`` ``uv`` | ``pip``, ``GPUCLI_TORCH_BUILD`` a build to take (``cpu``, ``cu128``).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

TORCH_INDEX = "https://download.pytorch.org/whl"
MARK = "GPUCLI-ENV "
TAG = ".gpucli-build"  # inside a finished venv: "<pin hash> <build>", written last
#: Compute capability -> the oldest CUDA with kernels for it (NVIDIA's CUDA toolkit release notes: sm_100
#: and sm_120 from CUDA 12.8, sm_103 from 12.9). Anything older runs on every build in the pin file.
ARCH_MIN_CUDA: dict[tuple[int, ...], tuple[int, ...]] = {(10, 0): (12, 8), (10, 3): (12, 9), (12, 0): (12, 8)}


class EnvError(Exception):
    """One line for the launch: what cannot be built and what to change."""


def version_tuple(text: str) -> tuple[int, ...]:
    """"12.10" -> (12, 10): CUDA versions compare per component, never as decimals."""
    return tuple(int(p) for p in re.findall(r"\d+", text))


def build_cuda(build: str) -> tuple[int, ...] | None:
    """"cu128" -> (12, 8), "cu130" -> (13, 0); None for "cpu"."""
    m = re.fullmatch(r"cu(\d+)(\d)", build)
    return (int(m.group(1)), int(m.group(2))) if m else None


def read_pins(path: str) -> tuple[dict[str, str], list[str], str]:
    """(package -> version, the CUDA builds, the minimum Python) from the pin file."""
    pins: dict[str, str] = {}
    builds: list[str] = []
    python = ""
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            line = raw.strip()
            if line.startswith("# cuda-builds:"):
                builds = line.split(":", 1)[1].split()
            elif line.startswith("# python:"):
                python = line.split(":", 1)[1].strip()
            elif line and not line.startswith("#"):
                name, _, version = line.split(";")[0].partition("==")
                pins[name.strip().lower()] = version.strip()
    return pins, builds, python


def pin_hash(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()[:16]


def host_gpu(nvidia_smi: str = "nvidia-smi") -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(the driver's CUDA version, the first GPU's compute capability); (None, None) without a GPU."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        return None, None
    try:
        head = subprocess.run([exe], capture_output=True, text=True, timeout=60).stdout
        cap = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None, None
    m = re.search(r"CUDA Version:\s*([\d.]+)", head)
    if not m or not cap:
        return None, None
    try:
        return version_tuple(m.group(1)), version_tuple(cap[0])
    except ValueError:
        return version_tuple(m.group(1)), None


def choose_build(builds: list[str], driver: tuple[int, ...] | None, cap: tuple[int, ...] | None) -> str:
    """The newest CUDA build the driver runs ("cpu" without a GPU); EnvError when none fits the GPU."""
    forced = os.environ.get("GPUCLI_TORCH_BUILD", "").strip()
    if forced:
        return forced
    if driver is None:
        return "cpu"
    runs = [b for b in builds if (build_cuda(b) or (99,)) <= driver]
    need = ARCH_MIN_CUDA.get(cap[:2]) if cap else None
    fits = [b for b in runs if need is None or (build_cuda(b) or (0,)) >= need]
    if fits:
        return fits[-1]
    shown = ".".join(map(str, driver))
    if need is not None:
        gpu = "sm_" + "".join(map(str, cap[:2])) if cap else "this GPU"
        raise EnvError(f"the GPU ({gpu}) needs a torch build for CUDA {'.'.join(map(str, need))} or newer and "
                       f"this host's driver runs CUDA {shown} at most: rent a host whose driver has CUDA "
                       f"{'.'.join(map(str, need))}+ (vast: cuda_max_good, RunPod: minCudaVersion)")
    raise EnvError(f"this host's driver runs CUDA {shown} at most; the trainer's torch is built for "
                   f"{', '.join(builds)}: rent a host with a newer driver")


#: Run in the image's Python: which pins it has at their version (importlib.metadata, no import), and
#: whether its torch has kernels for the GPU (argv[2]: "major.minor", or "" without one).
IMAGE_CHECK = r"""
import json, sys
from importlib import metadata
pins = json.loads(sys.argv[1])
have = {}
for name, want in pins.items():
    try:
        have[name] = metadata.version(name).split("+")[0] == want
    except Exception:
        have[name] = False
arch_ok = True
if have.get("torch") and sys.argv[2]:
    try:
        import torch
        major, minor = (int(p) for p in sys.argv[2].split(".")[:2])
        archs = torch.cuda.get_arch_list() if torch.cuda.is_available() else []
        arch_ok = any(a.startswith("sm_") and a[3:-1] == str(major) and int(a[-1]) <= minor for a in archs)
    except Exception:
        arch_ok = False
print(json.dumps({"have": have, "arch_ok": arch_ok, "python": list(sys.version_info[:2])}))
"""


def image_has(python: str, pins: dict[str, str], cap: tuple[int, ...] | None) -> tuple[bool, bool, tuple[int, ...]]:
    """(every pin is in the image's Python, its torch is the pinned one and runs the GPU, its version)."""
    arg = ".".join(map(str, cap[:2])) if cap else ""
    res = subprocess.run([python, "-c", IMAGE_CHECK, json.dumps(pins), arg], capture_output=True, text=True,
                         timeout=300)
    try:
        found = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise EnvError(f"{python} cannot check its packages: {(res.stderr or res.stdout).strip()[-300:]}") from None
    torch_ok = bool(found["have"].get("torch")) and bool(found["arch_ok"])
    return torch_ok and all(found["have"].values()), torch_ok, tuple(found["python"])


def installer() -> str:
    chosen = os.environ.get("GPUCLI_ENV_INSTALLER", "").strip()
    if chosen in ("uv", "pip"):
        return chosen
    return "uv" if shutil.which("uv") else "pip"


def _run(argv: list[str], what: str) -> None:
    print(f"setup_pod: {what}", flush=True)
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise EnvError(f"{what} failed: {' | '.join(tail)[-400:]}")


def build_venv(python: str, folder: str, pins_path: str, pins: dict[str, str], build: str,
               *, lend_torch: bool, tool: str, new_python: str | None = None) -> None:
    """A venv in ``folder`` with the pins: torch from PyTorch's index for ``build`` (unless the image
    lends its own), then the rest. ``new_python``: the image's Python is older than the pins need, and
    uv is to find or fetch one (a version request such as ">=3.11")."""
    system = ["--system-site-packages"] if lend_torch else []
    if tool == "uv":
        _run(["uv", "venv", "--quiet", "--seed", "--python", new_python or python, *system, folder],
             "creating the venv (uv)")
    elif new_python:
        raise EnvError(f"the trainer's packages need Python {new_python} and {python} is older: use an image "
                       "with a newer Python, or one with uv (it fetches one)")
    vpy = os.path.join(folder, "bin", "python")
    install = ["uv", "pip", "install", "--quiet", "--python", vpy]
    if tool == "pip":
        install = [vpy, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        try:
            _run([python, "-m", "venv", *system, folder], "creating the venv")
        except EnvError:
            # Debian's and Ubuntu's own Python lacks ensurepip without python3-venv: a venv without pip,
            # filled by the image's pip (its --python option, pip 22.3+)
            shutil.rmtree(folder, ignore_errors=True)
            _run([python, "-m", "venv", "--without-pip", *system, folder], "creating the venv (no ensurepip)")
            install = [python, "-m", "pip", "--python", vpy, "install", "--quiet", "--disable-pip-version-check"]
    if not lend_torch:
        base = os.environ.get("GPUCLI_TORCH_INDEX", TORCH_INDEX).strip()
        index = [] if base == "none" else ["--index-url", f"{base.rstrip('/')}/{build}"]
        _run([*install, f"torch=={pins['torch']}", *index], f"installing torch {pins['torch']} ({build})")
    _run([*install, "-r", pins_path], "installing the pinned packages")


def ensure(python: str, pins_path: str, root: str) -> dict[str, object]:
    """The environment for the trainer (see the module docstring); raises EnvError."""
    t0 = time.monotonic()
    pins, builds, min_python = read_pins(pins_path)
    driver, cap = host_gpu()
    build = choose_build(builds, driver, cap)
    # one venv per pin file and build: a volume moved to a host with another driver keeps the other's
    folder = os.path.join(os.path.abspath(root), f"trainer-{pin_hash(pins_path)}-{build}")
    tag = f"{pin_hash(pins_path)} {build}"
    vpy = os.path.join(folder, "bin", "python")
    source, chosen = "image", python
    if _tag(folder) == tag and os.access(vpy, os.X_OK):
        source, chosen = "reused", vpy
    else:
        whole, torch_ok, version = image_has(python, pins, cap)
        old_python = bool(min_python) and version < version_tuple(min_python)
        if not whole:
            os.makedirs(os.path.dirname(folder), exist_ok=True)
            # Built where it stays (a venv's scripts name their folder); the tag, written last, marks it
            # whole; a lock keeps two launches on one volume from building it at once.
            with open(f"{folder}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                source, chosen = ("reused", vpy) if _tag(folder) == tag else ("built", vpy)
                if source == "built":
                    shutil.rmtree(folder, ignore_errors=True)  # an interrupted build's remains
                    build_venv(python, folder, pins_path, pins, build, lend_torch=torch_ok and not old_python,
                               tool=installer(), new_python=min_python if old_python else None)
                    with open(os.path.join(folder, TAG), "w", encoding="utf-8") as fh:
                        fh.write(tag + "\n")
    return {"python": chosen, "source": source, "build": build, "seconds": round(time.monotonic() - t0, 1),
            "driver_cuda": ".".join(map(str, driver)) if driver else None,
            "compute_capability": ".".join(map(str, cap)) if cap else None}


def _tag(folder: str) -> str | None:
    try:
        with open(os.path.join(folder, TAG), encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pins", required=True)
    ap.add_argument("--root", required=True, help="where the venvs live (the run's volume)")
    ap.add_argument("--python", default=sys.executable, help="the image's Python")
    args = ap.parse_args(argv)
    try:
        result = ensure(args.python, args.pins, args.root)
    except EnvError as exc:
        print(f"setup_pod: {exc}", file=sys.stderr)
        return 3
    print(MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
