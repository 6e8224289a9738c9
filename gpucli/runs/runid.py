"""One run folder on a host belongs to one run.

A new launch of a name that an earlier run used on the same host must never be answered by the
earlier run's files (its metrics said ``finished``, step 30, for a new run whose trainer failed at
import). So each run has an id (``RunRecord.run_id``); the launch writes it into the run folder as
``run.id`` before anything else is there, moving a folder that holds another run's files aside (never
deleting it), and every command that opens the folder checks the id (:func:`check_folder`).
"""

from __future__ import annotations

import shlex
import uuid
from typing import TYPE_CHECKING, Protocol

from gpucli.errors import GpucliError, NotFoundError

if TYPE_CHECKING:
    from gpucli.runs.records import RunRecord


class _Reads(Protocol):  # what of a Host (gpucli.providers.target) is used here
    def read_from(self, remote_path: str, offset: int, max_bytes: int = ...) -> tuple[bytes, int]: ...

RUN_ID_FILE = "run.id"
#: What marks a folder as a gpucli run folder written before run ids existed.
RUN_FILES = ("metrics.jsonl", "run.yaml", "watchdog.json", "console.log")


class ForeignFolder(NotFoundError):
    """The run folder on the host holds another run's id."""


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def claim_command(workdir: str, run_id: str, stamp: str) -> str:
    """Shell that makes ``workdir`` this run's: a folder holding another run's id (or a run folder from
    before ids) is moved aside to ``<workdir>.earlier-<stamp>`` (printed as ``MOVED <path>``), then the
    id is written. A folder of the same id (a resume on the same host) is kept as it is."""
    wd, rid = shlex.quote(workdir), shlex.quote(run_id)
    aside = shlex.quote(f"{workdir}.earlier-{stamp}")
    marks = " -o ".join(f"-e {wd}/{name}" for name in RUN_FILES)
    return (f"if [ -d {wd} ]; then have=$(head -c 64 {wd}/{RUN_ID_FILE} 2>/dev/null); "
            f"if [ -n \"$have\" ] && [ \"$have\" != {rid} ] || {{ [ -z \"$have\" ] && [ {marks} ]; }}; then "
            f"mv -- {wd} {aside} && echo MOVED {aside}; fi; fi; "
            f"mkdir -p -- {wd} && printf %s {rid} > {wd}/{RUN_ID_FILE}")


def check_folder(host: _Reads, record: RunRecord) -> None:
    """Raise :class:`ForeignFolder` when the run folder holds another run's id. A record without an id
    (written before ids) and a folder without one (the launch has not written it yet, or the host is
    gone to a new pod) pass: only a different id proves a different run."""
    if not record.run_id:
        return
    try:
        data, _ = host.read_from(f"{record.workdir}/{RUN_ID_FILE}", 0, 64)
    except (GpucliError, OSError):  # unreadable: the command's own reads say what is wrong
        return
    have = data.decode(errors="replace").strip()
    if have and have != record.run_id:
        raise ForeignFolder(f"the folder {record.workdir} on the host belongs to another run (id {have[:16]}, "
                            f"this run is {record.run_id})",
                            hint="a later launch of the same name used it; nothing of it is read as this run's")
