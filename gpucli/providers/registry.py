"""The registry of run targets: the ``--provider`` name -> the one object that knows that place.

Each target lives in one file of this package and implements ``base.Target``; nothing else in gpucli
compares provider names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from gpucli.errors import UnknownNameError
from gpucli.providers.local.target import LocalHost
from gpucli.providers.target import Capabilities, Host, PodState, Provisioner, Stray, Target
from gpucli.runs.runid import check_folder

if TYPE_CHECKING:
    from gpucli.runs.records import RunRecord

__all__ = ["Capabilities", "Host", "LocalHost", "PodState", "Provisioner", "Stray", "Target", "all_targets",
           "get_target", "open_host", "target_names"]

#: Where each target's class lives. A target's module is imported the first time it is asked for, so a
#: command reading a local run never loads the cloud providers' clients (``gpucli status`` imports only
#: what it shows).
_WHERE = {"local": ("gpucli.providers.local.target", "LocalTarget"), "ssh": ("gpucli.providers.ssh.target", "SshServerTarget"),
          "runpod": ("gpucli.providers.runpod.target", "RunPodTarget"), "vast": ("gpucli.providers.vast.target", "VastTarget")}
_LOADED: dict[str, Target] = {}


def target_names() -> list[str]:
    return list(_WHERE)


def get_target(name: str) -> Target:
    key = name.strip().lower()
    target = _LOADED.get(key)
    if target is None:
        if key not in _WHERE:
            raise UnknownNameError("provider", name, list(_WHERE))
        module, cls = _WHERE[key]
        target = _LOADED.setdefault(key, getattr(importlib.import_module(module), cls)())
    return target


def all_targets() -> list[Target]:
    """Every target, each loaded (for what asks every provider: strays, doctor)."""
    return [get_target(n) for n in _WHERE]


def __getattr__(name: str) -> object:
    if name == "TARGETS":  # the former eager registry: name -> target, every one loaded
        return {t.name: t for t in all_targets()}
    raise AttributeError(name)


def open_host(record: RunRecord, *, connect_timeout_s: float = 20.0) -> Host:
    """A connected host for a run record (this machine, or SSH with the pinned key), whose run folder
    is this run's (its ``run.id``: :func:`gpucli.runs.runid.check_folder`)."""
    host = get_target(record.provider).open(record, connect_timeout_s=connect_timeout_s)
    try:
        check_folder(host, record)
    except BaseException:
        host.__exit__(None, None, None)
        raise
    return host
