"""What the bundled trainer needs on the machine that runs it, checked before it starts.

Without this check a run whose Python lacks torch is reported as started: the trainer dies on its
first import while ``launch`` prints "started run" and exits 0. One interpreter start imports every
package the trainer uses (importing torch alone takes seconds, so never one start per package) and
prints what it found as one JSON line; a missing or broken package ends the launch with the command
that installs it into that very interpreter.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.run.inputs.launch import ResolvedLaunch

# import name -> pip name. torch, numpy and pyyaml always (trainer/__init__.py); tokenizers when
# the run's tokenizer is not the built-in byte one (trainer/data/tokenizer.py imports it on demand).
ALWAYS = {"torch": "torch", "numpy": "numpy", "yaml": "pyyaml"}
FOR_BPE = {"tokenizers": "tokenizers"}
MIN_PYTHON = (3, 10)
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"  # the CPU build; plain `torch` is the CUDA one

# Runs in the interpreter being checked, so it keeps to syntax every Python 3 parses (no f-strings):
# an old interpreter must still answer with its version instead of a syntax error. Packages named on
# its command line are only located, not imported (see check_python's ``imported_already``).
CHECK_SCRIPT = """\
import json, sys
found = {"python": "%d.%d.%d" % tuple(sys.version_info[:3])}
dists = {"yaml": "pyyaml"}
for name in ("torch", "numpy", "yaml", "tokenizers"):
    try:
        if name in sys.argv[1:]:
            import importlib.util
            if importlib.util.find_spec(name) is None:
                raise ImportError("No module named %r" % name)
            try:
                from importlib.metadata import version
                found[name] = version(dists.get(name, name))
            except Exception:
                found[name] = "installed"
        else:
            module = __import__(name)
            found[name] = str(getattr(module, "__version__", "unknown"))
    except BaseException as exc:
        found[name] = None
        found[name + "_error"] = ("%s: %s" % (type(exc).__name__, exc))[:200]
print("GPUCLI-REQUIREMENTS " + json.dumps(found))
"""
_MARK = "GPUCLI-REQUIREMENTS "


@dataclass(frozen=True)
class TrainerPackages:
    """What one interpreter has: its version and each package's version (None: cannot be imported,
    with the import error in ``errors``)."""

    python: str
    versions: Mapping[str, str | None]
    errors: Mapping[str, str]

    def missing(self, *, tokenizers: bool) -> list[str]:
        """The import names the run needs that do not import."""
        need = [*ALWAYS, *(FOR_BPE if tokenizers else ())]
        return [name for name in need if not self.versions.get(name)]

    @property
    def describe(self) -> str:
        found = ", ".join(f"{n} {v}" for n, v in self.versions.items() if v)
        return f"trainer packages: Python {self.python}" + (f", {found}" if found else "")

    @property
    def python_too_old(self) -> bool:
        try:
            return tuple(int(p) for p in self.python.split(".")[:2]) < MIN_PYTHON
        except ValueError:
            return False


def parse_check_output(stdout: str) -> TrainerPackages | None:
    """The check script's JSON line (anything else the interpreter printed is ignored); None if absent."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(_MARK):
            try:
                raw: Any = json.loads(line[len(_MARK):])
            except (ValueError, RecursionError):
                return None
            if not isinstance(raw, dict):
                return None
            names = (*ALWAYS, *FOR_BPE)
            return TrainerPackages(
                python=str(raw.get("python", "")),
                versions={n: str(raw[n]) if isinstance(raw.get(n), str) else None for n in names},
                errors={n: str(raw[f"{n}_error"]) for n in names if isinstance(raw.get(f"{n}_error"), str)})
    return None


def install_command(python: str, missing: list[str], *, pod: bool, cpu: bool) -> str:
    """The command that installs ``missing`` (import names) into ``python``.

    On this machine a CPU run gets torch's CPU build (a plain ``pip install torch`` pulls the
    multi-GB CUDA one); on a pod, what setup_pod.sh installs: the stock packages from PyPI."""
    pip = f"{shlex.quote(python)} -m pip install"
    names = {**ALWAYS, **FOR_BPE}
    rest = [names[m] for m in missing if m != "torch"]
    steps = []
    if "torch" in missing:
        steps.append(f"{pip} torch --index-url {CPU_TORCH_INDEX}" if cpu and not pod else f"{pip} torch")
    if rest:
        steps.append(f"{pip} {' '.join(rest)}")
    return " && ".join(steps)


def check_trainer_requirements(host: Host, resolved: ResolvedLaunch, *, pod: bool,
                               timeout_s: float = 180.0) -> TrainerPackages:
    """Before the trainer starts: import its packages in the run's Python on ``host`` (one
    interpreter start, in the run's folder) and raise a GpucliError naming what is missing and how to
    install it. ``pod``: the host was bootstrapped by setup_pod.sh (the hint names what it installs)."""
    tokenizer = (resolved.trainer_config.get("data") or {}).get("tokenizer", "byte")
    # setup_pod.sh has just checked torch's version in this very interpreter (or installed it there): a
    # second import (seconds) is spared, and torch only located.
    return check_python(host, resolved.python, tokenizers=tokenizer != "byte", pod=pod,
                        cpu=resolved.gpu_id is None, cwd=resolved.workdir, timeout_s=timeout_s,
                        imported_already=("torch",) if pod else ())


def check_python(host: Host, python: str, *, tokenizers: bool, pod: bool, cpu: bool,
                 cwd: str | None = None, timeout_s: float = 180.0,
                 imported_already: tuple[str, ...] = ()) -> TrainerPackages:
    """Import the trainer's packages in ``python`` on ``host`` and raise a GpucliError naming what is
    missing and how to install it. ``cpu``: the run trains on the CPU (torch's CPU build);
    ``imported_already``: packages just imported in that interpreter by someone else, only located."""
    where = "the pod" if pod else "this machine"
    cmd = ((f"cd {shlex.quote(cwd)} && " if cwd else "")
           + " ".join([shlex.quote(python), "-c", shlex.quote(CHECK_SCRIPT), *map(shlex.quote, imported_already)]))
    res = host.run(cmd, timeout_s=timeout_s, check=False)
    found = parse_check_output(res.stdout)
    if found is None:
        detail = (res.stderr or res.stdout).strip().splitlines()
        if res.exit_code == 127:
            raise GpucliError(f"the trainer cannot start: {python} is not found on {where}",
                              hint="pass --python with an interpreter that has torch")
        raise GpucliError(f"the trainer cannot start: checking {python} on {where} failed (exit status "
                          f"{res.exit_code}): {detail[-1][:200] if detail else 'no output'}",
                          hint="pass --python with a Python 3.10+ that has torch")
    if found.python_too_old:
        raise GpucliError(f"the trainer cannot start: {python} on {where} is Python {found.python}; it needs "
                          f"{'.'.join(map(str, MIN_PYTHON))}+", hint="pass --python with a newer interpreter")
    missing = found.missing(tokenizers=tokenizers)
    if missing:
        # A plain "No module named" says nothing the message does not; a broken install's error does.
        why = "; ".join(f"{m}: {found.errors[m]}" for m in missing
                        if m in found.errors and not found.errors[m].startswith("ModuleNotFoundError"))
        after = " after setup_pod.sh" if pod else ""
        raise GpucliError(
            f"the trainer cannot start: {python} on {where} cannot import {', '.join(missing)}{after}"
            + (f" ({why})" if why else ""),
            hint=f"install: {install_command(python, missing, pod=pod, cpu=cpu)}")
    return found
