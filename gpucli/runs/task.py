"""``task.yaml``: the options of ``gpucli launch --code DIR --run CMD`` kept in a file in the user's repo.

    run: torchrun --nproc_per_node=$GPUCLI_GPUS train.py --config big.yaml   # required
    code: .                     # folder (relative to this file) or git+https://host/org/repo@ref
    setup: pip install -r requirements.txt
    checkpoints: out/           # relative to the code folder, as the job sees it
    data: ./corpus              # a folder on this machine (relative to this file), synced to $GPUCLI_DATA
    profile: h100
    provider: runpod            # local | ssh | runpod | vast
    name: big-run
    metrics_regex: 'it (?P<step>\\d+) l=(?P<loss>[\\d.]+)'
    spot: false
    grace: 60                   # seconds between SIGTERM and SIGKILL for the job (its own checkpoint)
    limits: {budget: 40, hours: 6, stall_minutes: 30}
    env: {WANDB_MODE: offline}  # plain settings; read again from this file on a resume
    env_from_local: [WANDB_API_KEY, HF_TOKEN]  # secrets by name: values from your environment or `gpucli keys`

Parsed once, here, into the frozen :class:`Task`; every problem is one line naming the file and key
(unknown keys with a suggestion, wrong types, NaN/infinity, zero or negative limits). CLI options
override the file (:func:`with_overrides`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from gpucli.errors import NotFoundError, UsageError
from gpucli.runs.secretenv import check_names
from gpucli.runs.userconfig import provider_problem  # one rule for --provider
from trainer.spec.load import load_yaml

KEYS = ("run", "code", "setup", "checkpoints", "data", "profile", "provider", "name", "metrics_regex", "spot",
        "grace", "limits", "env", "env_from_local", "sweep")
LIMIT_KEYS = {"budget": "budget_usd", "hours": "max_hours", "stall_minutes": "stall_minutes"}
_FLAGS = {"budget_usd": "--budget", "max_hours": "--hours", "stall_minutes": "--stall-minutes", "grace_s": "--grace"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class GitCode:
    """``git+https://host/org/repo@ref``: cloned on the pod instead of uploaded."""

    url: str  # https://host/org/repo
    ref: str | None


@dataclass(frozen=True)
class Task:
    run: str
    code: Path | GitCode = Path(".")
    setup: str | None = None
    checkpoints: str | None = None
    data: Path | None = None
    profile: str | None = None
    provider: str | None = None
    name: str | None = None
    metrics_regex: str | None = None
    spot: bool = False
    budget_usd: float | None = None
    max_hours: float | None = None
    stall_minutes: float | None = None
    grace_s: float | None = None  # SIGTERM to SIGKILL for the job (default: gpucli.run.starting.jobs.own)
    env: tuple[tuple[str, str], ...] = ()
    env_from_local: tuple[str, ...] = ()  # secrets by name (gpucli.runs.secretenv); values never kept
    # `gpucli sweep TASK`: each variable's values (a run per combination; `gpucli launch` ignores it)
    sweep: tuple[tuple[str, tuple[str, ...]], ...] = ()
    source: Path | None = None  # the file it came from

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


class TaskError(UsageError):
    """``task.yaml: key: what is wrong``."""

    def __init__(self, file: str, key: str, problem: str) -> None:
        super().__init__(f"{file}: {key}: {problem}")


def parse_git_code(text: str, *, file: str = "--code", key: str = "code") -> GitCode:
    """``git+https://host/org/repo[@ref]``. Credentials in the URL are refused: they would sit in the
    run record and on the pod's command line (a private repo's token comes from ``gpucli keys``)."""
    url = text.removeprefix("git+")
    ref = None
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.netloc or not parts.path.strip("/"):
        raise TaskError(file, key, f"expected git+https://host/org/repo[@ref], got {text!r}")
    if "@" in parts.netloc:
        raise TaskError(file, key, "no credentials in the URL: store a token with `gpucli keys` instead")
    path = parts.path
    if "@" in path:
        path, ref = path.rsplit("@", 1)
        if not ref:
            raise TaskError(file, key, f"empty ref after '@' in {text!r}")
    return GitCode(url=f"https://{parts.netloc}{path}", ref=ref)


def _string(file: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TaskError(file, key, f"expected a string, got {type(value).__name__} {value!r}")
    if not value.strip():
        raise TaskError(file, key, "must not be empty")
    return value.strip()


def _positive(file: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TaskError(file, key, f"expected a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise TaskError(file, key, f"must be a finite number, got {value}")
    if value <= 0:
        raise TaskError(file, key, f"must be positive, got {value:g}")
    return float(value)


def _unknown(file: str, key: str, valid: tuple[str, ...] | list[str], where: str = "") -> TaskError:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else "valid: " + ", ".join(valid)
    return TaskError(file, f"{where}{key}", f"unknown key ({hint})")


def parse_task(data: Any, *, file: str = "task.yaml", base: Path = Path(".")) -> Task:
    """A :class:`Task` from the parsed YAML of a task file; relative ``code`` and ``data`` paths are taken
    from ``base`` (the file's folder)."""
    if not isinstance(data, Mapping):
        raise TaskError(file, "(top)", f"expected a mapping of keys, got {type(data).__name__}")
    for key in data:
        if not isinstance(key, str) or key not in KEYS:
            raise _unknown(file, str(key), KEYS)
    if "run" not in data:
        raise TaskError(file, "run", "missing: the training command to run")
    fields: dict[str, Any] = {"run": _string(file, "run", data["run"])}
    for key in ("setup", "checkpoints", "profile", "name", "metrics_regex"):
        if data.get(key) is not None:
            fields[key] = _string(file, key, data[key])
    if "metrics_regex" in fields:
        try:
            groups = set(re.compile(fields["metrics_regex"]).groupindex)
        except re.error as exc:
            raise TaskError(file, "metrics_regex", f"does not compile: {exc}") from exc
        if "step" not in groups or not groups & {"loss", "val_loss"}:
            raise TaskError(file, "metrics_regex", "needs named groups (?P<step>...) and (?P<loss>...) or "
                                                   "(?P<val_loss>...)")
    if data.get("provider") is not None:
        provider = _string(file, "provider", data["provider"]).strip().lower()
        if (problem := provider_problem(provider)) is not None:
            raise TaskError(file, "provider", problem)
        fields["provider"] = provider
    if data.get("code") is not None:
        code = _string(file, "code", data["code"])
        fields["code"] = parse_git_code(code, file=file) if code.startswith("git+") else (base / code)
    else:
        fields["code"] = base
    if data.get("data") is not None:
        fields["data"] = base / _string(file, "data", data["data"])
    if data.get("spot") is not None:
        if not isinstance(data["spot"], bool):
            raise TaskError(file, "spot", f"expected true or false, got {data['spot']!r}")
        fields["spot"] = data["spot"]
    if data.get("grace") is not None:
        fields["grace_s"] = _positive(file, "grace", data["grace"])
    limits = data.get("limits")
    if limits is not None:
        if not isinstance(limits, Mapping):
            raise TaskError(file, "limits", f"expected a mapping like {{budget: 40, hours: 6}}, got {limits!r}")
        for key, value in limits.items():
            if key not in LIMIT_KEYS:
                raise _unknown(file, str(key), list(LIMIT_KEYS), where="limits.")
            if value is not None:
                fields[LIMIT_KEYS[key]] = _positive(file, f"limits.{key}", value)
    env = data.get("env")
    if env is not None:
        if not isinstance(env, Mapping):
            raise TaskError(file, "env", f"expected a mapping of NAME: value, got {env!r}")
        pairs = []
        for name, value in env.items():
            if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
                raise TaskError(file, f"env.{name}", "not an environment variable name")
            if name.startswith("GPUCLI_"):
                raise TaskError(file, f"env.{name}", "GPUCLI_* variables are set by gpucli itself")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise TaskError(file, f"env.{name}", f"expected a string or number, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise TaskError(file, f"env.{name}", f"must be a finite number, got {value}")
            pairs.append((name, str(value)))
        fields["env"] = tuple(pairs)
    names = data.get("env_from_local")
    if names is not None:
        if isinstance(names, str) or not isinstance(names, (list, tuple)):
            raise TaskError(file, "env_from_local", f"expected a list of variable names, got {names!r}")
        fields["env_from_local"] = check_names(names, where=f"{file}: env_from_local:")
    if data.get("sweep") is not None:
        fields["sweep"] = _sweep(file, data["sweep"])
    return Task(**fields)


def _sweep(file: str, sweep: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``sweep: {LR: [0.0003, 0.001], LAYERS: [12, 16]}``: environment variables and their values."""
    if not isinstance(sweep, Mapping):
        raise TaskError(file, "sweep", f"expected a mapping of NAME: [values], got {sweep!r}")
    out = []
    for name, values in sweep.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name) or name.startswith("GPUCLI_"):
            raise TaskError(file, f"sweep.{name}", "not an environment variable name (GPUCLI_* are gpucli's)")
        values = list(values) if isinstance(values, (list, tuple)) else [values]
        if not values or any(isinstance(v, bool) or not isinstance(v, (str, int, float)) for v in values):
            raise TaskError(file, f"sweep.{name}", f"expected a list of strings or numbers, got {values!r}")
        out.append((name, tuple(str(v) for v in values)))
    return tuple(out)


def load_task(path: str | Path) -> Task:
    """Read and check a task file (``NotFoundError`` / ``TaskError``, never a traceback)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise NotFoundError(f"task file {path} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read task file {path}: {exc}") from exc
    try:
        data = load_yaml(text)  # 3e-4 is a number, as in YAML 1.2 (trainer.spec.load.NumberLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(top)"
        raise TaskError(path.name, where, f"not valid YAML: {getattr(exc, 'problem', None) or exc}") from exc
    return dataclasses.replace(parse_task(data, file=path.name, base=path.parent), source=path)


def with_overrides(task: Task, *, env: Mapping[str, str] | None = None, **options: Any) -> Task:
    """CLI options over the file: every option that is not None replaces the file's value (``code`` and
    ``data`` strings are taken from the current folder, like any CLI path); ``env`` entries are added
    to the file's, replacing a name both give."""
    known = {f.name for f in dataclasses.fields(Task)} - {"env", "source"}
    changes: dict[str, Any] = {}
    for key, value in options.items():
        if key not in known:
            raise TypeError(f"with_overrides() got an unknown option {key!r}")
        if value is None:
            continue
        if key == "code" and isinstance(value, str):
            value = parse_git_code(value) if value.startswith("git+") else Path(value)
        elif key == "data" and isinstance(value, str):
            value = Path(value)
        elif key in _FLAGS:
            value = _positive("command line", _FLAGS[key], value)
        elif key == "provider":
            value = str(value).strip().lower()
            if (problem := provider_problem(value)) is not None:
                raise TaskError("command line", "--provider", problem)
        changes[key] = value
    if env:
        merged = dict(task.env)
        merged.update({str(k): str(v) for k, v in env.items()})
        changes["env"] = tuple(merged.items())
    return dataclasses.replace(task, **changes)
