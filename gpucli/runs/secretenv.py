"""Secrets by name: ``gpucli launch --env WANDB_API_KEY`` and task.yaml ``env_from_local: [HF_TOKEN]``.

A secret reaches the pod by its name only. Its value is read here, on this machine, at the moment the
pod's 0600 env file is written (and once before anything is rented, so a missing one fails the launch
early); it is never on a command line, in task.yaml, in the run record or in any output. Where a value
comes from, first found wins:

1. this machine's environment (``NAME``);
2. ``gpucli keys``: a known key whose variable is ``NAME`` (``hf`` for ``HF_TOKEN``, ``wandb`` for
   ``WANDB_API_KEY``), else a key stored under the name itself (``gpucli keys set MY_TOKEN``);
3. for ``HF_TOKEN`` only: the token file ``hf auth login`` writes (``$HF_TOKEN_PATH``, else
   ``$HF_HOME/token``, else ``~/.cache/huggingface/token``, as huggingface_hub's constants read them).

The run record keeps the names (a resume reads the values again). A task's plain ``env:`` values are
the user's non-secret settings, yet they too stay out of the record: a resume reads them again from
the task file (:func:`task_env_names`; :func:`gpucli.run.starting.jobs.own.task_env_from_names` reads them back).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpucli.errors import UsageError
from gpucli.settings import KEYS, load_keys
from trainer.spec.config import TRACKERS

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HF_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# gpucli's own variables in the env file: a name the user asks for must not replace them
RESERVED = ("TELEGRAM_API_BASE",)


def check_name(name: str, *, where: str = "--env") -> str:
    """``name`` if it can be a secret's name, else a one-line UsageError (a value is refused: it would
    sit in the shell history and the process table)."""
    if not isinstance(name, str):
        raise UsageError(f"{where}: expected a variable name, got {name!r}")
    if "=" in name:
        raise UsageError(f"{where} {name.split('=', 1)[0]}=...: give the name only",
                         hint="the value is read from your environment or `gpucli keys set NAME`, never from "
                              "the command line or task.yaml")
    if not _NAME.fullmatch(name):
        raise UsageError(f"{where} {name!r}: not an environment variable name")
    if name.startswith("GPUCLI_") or name in RESERVED:
        raise UsageError(f"{where} {name}: GPUCLI_* variables are set by gpucli itself")
    return name


def check_names(names: Iterable[str], *, where: str = "--env") -> tuple[str, ...]:
    """The names checked, duplicates dropped, order kept."""
    out: list[str] = []
    for name in names:
        if check_name(name, where=where) not in out:
            out.append(name)
    return tuple(out)


def hf_token_file() -> Path:
    """Where ``hf auth login`` keeps the token (huggingface_hub.constants: HF_TOKEN_PATH, HF_HOME)."""
    explicit = os.environ.get("HF_TOKEN_PATH", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    hf_home = os.environ.get("HF_HOME", "").strip()
    if hf_home:
        return Path(hf_home).expanduser() / "token"
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "huggingface" / "token"


def _read_token(path: Path) -> str | None:
    try:
        if not path.is_file():
            return None
        with path.open("rb") as fh:
            text = fh.read(64 << 10).decode("utf-8", errors="replace").strip()
    except OSError:
        return None
    return text.splitlines()[0].strip() if text else None


def lookup(name: str) -> tuple[str, str] | None:
    """``(value, where it came from)`` of the secret ``name``, or None."""
    value = os.environ.get(name, "")
    if value.strip():
        return value, f"env {name}"
    stored = load_keys()
    for spec in KEYS.values():
        if spec.env_var == name and stored.get(spec.name, "").strip():
            return stored[spec.name].strip(), f"gpucli keys ({spec.name})"
    if stored.get(name, "").strip():
        return stored[name].strip(), f"gpucli keys ({name})"
    if name in HF_NAMES:
        token = _read_token(hf_token_file())
        if token:
            return token, "the `hf auth login` token file"
    return None


def resolve(names: Sequence[str]) -> dict[str, str]:
    """Every named secret's value; a UsageError naming all that are missing."""
    found: dict[str, str] = {}
    missing = []
    for name in names:
        hit = lookup(name)
        if hit is None:
            missing.append(name)
        else:
            found[name] = hit[0]
    if missing:
        listed = ", ".join(missing)
        raise UsageError(f"--env {listed}: not set in this environment nor in `gpucli keys`",
                         hint=f"export {missing[0]}=... or run `gpucli keys set {missing[0]}`"
                              + (" (or `hf auth login`)" if missing[0] in HF_NAMES else ""))
    return found


def task_env_names(pairs: Iterable[tuple[str, str]]) -> list[str]:
    """What the run record keeps of a task's ``env:``: the names."""
    return [name for name, _ in pairs]


def tracker_settings(tracker: str, *, own: bool, env: Sequence[str]) -> tuple[list[str], list[str]]:
    """``launch --tracker wandb|trackio``: the trainer override, and the ``--env`` names with
    WANDB_API_KEY added for wandb when this machine has it (``wandb login``'s netrc is not read)."""
    name = tracker.strip().lower()
    if name not in TRACKERS or name == "none":
        raise UsageError(f"--tracker must be wandb or trackio, got {tracker!r}")
    if own:
        raise UsageError("--tracker is for the bundled trainer; your own code logs to its tracker itself",
                         hint="pass its key by name: --env WANDB_API_KEY")
    names = list(env)
    if name == "wandb" and "WANDB_API_KEY" not in names and lookup("WANDB_API_KEY") is not None:
        names.append("WANDB_API_KEY")
    return [f"tracking.backend={name}"], names
