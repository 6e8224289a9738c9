"""The registry of run targets: the ``--provider`` name -> the one object that knows that place.

Each target lives in one file of this package and implements ``base.Target``; nothing else in gpucli
compares provider names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucli.errors import UnknownNameError
from gpucli.run.runid import check_folder
from gpucli.run.targets.base import Host, PodState, Provisioner, Stray, Target
from gpucli.run.targets.local import LocalHost, LocalTarget
from gpucli.run.targets.runpod import RunPodTarget
from gpucli.run.targets.ssh import SshServerTarget
from gpucli.run.targets.vast import VastTarget

if TYPE_CHECKING:
    from gpucli.run.records import RunRecord

__all__ = ["TARGETS", "Host", "LocalHost", "PodState", "Provisioner", "Stray", "Target", "get_target",
           "open_host", "target_names"]

TARGETS: dict[str, Target] = {t.name: t for t in (LocalTarget(), SshServerTarget(), RunPodTarget(), VastTarget())}


def target_names() -> list[str]:
    return list(TARGETS)


def get_target(name: str) -> Target:
    target = TARGETS.get(name.strip().lower())
    if target is None:
        raise UnknownNameError("provider", name, list(TARGETS))
    return target


def open_host(record: RunRecord, *, connect_timeout_s: float = 20.0) -> Host:
    """A connected host for a run record (this machine, or SSH with the pinned key), whose run folder
    is this run's (its ``run.id``: :func:`gpucli.run.runid.check_folder`)."""
    host = get_target(record.provider).open(record, connect_timeout_s=connect_timeout_s)
    try:
        check_folder(host, record)
    except BaseException:
        host.__exit__(None, None, None)
        raise
    return host
