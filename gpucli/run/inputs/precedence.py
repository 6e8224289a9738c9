"""The one precedence rule for a launch's inputs: the command line, then task.yaml, then your config
(``gpucli config``, its provider's section first), then the built-in defaults (:mod:`gpucli.runs.defaults`,
applied where the launch is resolved). ``launch`` (and ``sweep``, through it), ``resume`` and library
callers take their inputs from here; each value comes back with where it came from.

A resume reads neither task.yaml nor your config again: the run's launch inputs hold what they gave at
launch, and only resume's own command line overrides them (:func:`resume_choices`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucli.errors import UsageError
from gpucli.providers.registry import get_target
from gpucli.runs import userconfig
from gpucli.runs.task import Task, load_task, with_overrides

__all__ = ["CLI", "CONFIG", "DEFAULT", "MACHINE", "RECORDED", "TASK", "Choices", "first_given", "launch_choices",
           "resume_choices"]

CLI, MACHINE, TASK, CONFIG, DEFAULT = "command line", "--on machine", "task.yaml", "config", "default"
RECORDED = "the run's launch"

#: What your config may give a launch, and whether it is looked up in the provider's section first.
_FROM_CONFIG = ("profile", "phase", "model", "disk", "image", "ready_timeout", "python", "on_end", "spot", "store")
#: What the command line overrides in task.yaml (the launch's names; task.yaml's differ for three).
_TASK_KEYS = {"profile": "profile", "provider": "provider", "name": "name", "data": "data", "spot": "spot",
              "budget": "budget_usd", "hours": "max_hours", "stall_minutes": "stall_minutes"}
#: Your own code's options: they only go into the task.
_OWN_ONLY = ("run", "code", "setup", "checkpoints", "metrics_regex", "grace")


def _given(value: Any) -> bool:
    """A value counts when it is there: None, an empty string and an unset flag (False) are not."""
    return value is not None and value is not False and value != "" and value != ()


def first_given(name: str, layers: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple[Any, str]:
    """The rule itself: the first layer that gives ``name`` wins; (None, "default") when none does."""
    for source, values in layers:
        if _given(value := values.get(name)):
            return value, source
    return None, DEFAULT


@dataclass(frozen=True)
class Choices:
    """The inputs chosen, and for each where it came from (:data:`CLI`, :data:`TASK`, ...). A value left
    None takes the built-in default when the launch is resolved."""

    values: Mapping[str, Any]
    sources: Mapping[str, str]
    task: Task | None = None  # your own code's task, with the command line over task.yaml

    def __getitem__(self, key: str) -> Any:
        return self.values.get(key)

    def pick(self, *keys: str) -> tuple[Any, ...]:
        return tuple(self.values.get(k) for k in keys)


def launch_choices(cli: Mapping[str, Any], *, task_file: Path | None = None, machine: Any = None,
                   config: Mapping[str, Any] | None = None) -> Choices:
    """The launch's inputs: ``cli`` holds the command line's values (None or False: not given), ``machine``
    the run whose machine ``--on`` names (its provider, profile, hosts and key come next), ``task_file``
    your own code's task.yaml, ``config`` your config (read when None)."""
    mine = userconfig.load() if config is None else config
    values: dict[str, Any] = {k: v for k, v in cli.items() if _given(v)}
    sources = {k: CLI for k in values}
    if machine is not None:  # the machine of a run: its provider, endpoint and profile unless given
        on = {"provider": machine.provider, "profile": machine.profile, "host": tuple(machine.hosts),
              "identity": machine.identity}
        for key, value in on.items():
            if key not in values and _given(value):
                values[key], sources[key] = value, MACHINE
    task = None
    if task_file is not None or _given(cli.get("code")) or _given(cli.get("run")):
        if task_file is None and not _given(cli.get("run")):
            raise UsageError("--code needs --run CMD (the training command to run)")
        base = load_task(task_file) if task_file is not None else Task(run=cli["run"])
        options: dict[str, Any] = {k: values.get(k) for k in _OWN_ONLY if k != "grace"}
        options.update({t: (str(values[k]) if k == "data" else values[k]) if k in values else None
                        for k, t in _TASK_KEYS.items()})
        task = with_overrides(base, grace_s=values.get("grace"), **options)
        for key, tkey in _TASK_KEYS.items():  # task.yaml's value where the command line gave none
            value = getattr(task, tkey)
            if key not in values and _given(value):
                values[key], sources[key] = (str(value) if key == "data" else value), TASK
        if "profile" not in values:  # nothing is rented on local and ssh hosts: the profile only names the machine
            provider = values.get("provider") or userconfig.get(dict(mine), "provider")
            if get_target(provider or "local").cloud:
                _from_config(values, sources, mine, "provider", None)
                _from_config(values, sources, mine, "profile", provider)
            else:
                values["profile"], sources["profile"] = "cpu", DEFAULT
    _from_config(values, sources, mine, "provider", None)
    for key in _FROM_CONFIG:
        if key == "model" and task is not None:
            continue  # your own code: --model only sizes the estimate, no preset from your config
        _from_config(values, sources, mine, key, values.get("provider"))
    return Choices(values=values, sources=sources, task=task)


def _from_config(values: dict[str, Any], sources: dict[str, str], mine: Mapping[str, Any], key: str,
                 provider: str | None) -> None:
    if key not in values:
        value, source = first_given(key, [(CONFIG, {key: userconfig.get(dict(mine), key, provider)})])
        if source == CONFIG:
            values[key], sources[key] = value, source


def resume_choices(recorded: Mapping[str, Any], *, provider: str | None = None, nodes: int | None = None) -> Choices:
    """A resume's inputs: its command line (``--provider``, ``--nodes``) over what the run's launch holds
    (``recorded``: the provider it ran on, its nodes); task.yaml and your config are not read again."""
    asked = {"provider": provider.strip().lower() if provider else None, "nodes": nodes}
    values, sources = {}, {}
    for key in asked:
        values[key], sources[key] = first_given(key, [(CLI, asked), (RECORDED, recorded)])
    return Choices(values=values, sources=sources)
