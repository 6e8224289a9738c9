"""``gpucli exec RUN -- CMD``: a command on a run's machine, in the run's folder (``<run>/code``, where its job
runs), with the run's environment: the 0600 env file sourced by the remote shell (secrets reach the process,
never a command line or a log line of gpucli's), the run's own venv first on PATH where its job has one,
and ``GPUCLI_RUN`` / ``GPUCLI_RUN_DIR``.

Every command is started detached in its own session (``Host.start_detached``: the same path on this
machine, an SSH host and a pod) with its output in ``<run>/exec/<id>.out`` (and ``.err``) and its exit
status in ``<id>.rc``; an attached exec follows those files, so a dropped connection never kills the
command and a reconnect picks up at the same byte. The remote shell keeps the status of a command killed by
signal N as 128+N (the shell's own convention), and that is what ``gpucli exec`` exits with. Ctrl-C here
sends SIGINT to the command's process group there, then SIGTERM and SIGKILL if it will not end (a
command a remote shell started in the background may ignore SIGINT: SIGTERM follows in seconds).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import posixpath
import secrets
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucli.errors import ConnectionFailed, GpucliError, TransferError, UsageError
from gpucli.providers.registry import get_target

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.runs.records import RunRecord

EXEC_DIR = "exec"  # in the run folder
POLL_S = 0.2
STOP_GRACE_S = 10.0  # SIGTERM -> SIGKILL
INT_GRACE_S = 3.0  # SIGINT -> SIGTERM: a command started in the background by a non-interactive shell ignores
# SIGINT (POSIX, "Signals and Error Handling": async lists ignore SIGINT and SIGQUIT), which setsid keeps
LOST = 255  # the status when the command is gone without one (killed with its shell): ssh's own for "no status"


@dataclass(frozen=True)
class ExecStarted:
    """A command started on a run's machine: where its output and status go."""

    run: str
    exec_id: str
    pid: int  # its process group there
    out: str  # stdout (and stderr, detached)
    err: str | None  # stderr, attached
    rc: str  # the exit status, written when it ends


def command_line(argv: Sequence[str]) -> str:
    """One argument is a shell line as written (pipes, ``&&``); several are quoted one by one."""
    if not argv or not any(a.strip() for a in argv):
        raise UsageError("gpucli exec needs a command after --", hint="gpucli exec RUN -- nvidia-smi")
    return argv[0] if len(argv) == 1 else shlex.join(argv)


def new_id() -> str:
    return f"{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def check_id(exec_id: str) -> str:
    if not exec_id or not all(c.isalnum() or c == "-" for c in exec_id):
        raise UsageError(f"not an exec id: {exec_id!r}", hint="the id `gpucli exec --detach` printed")
    return exec_id


def exec_log(record: RunRecord, exec_id: str) -> str:
    """The output file of a detached exec (``gpucli logs RUN --exec ID``)."""
    return f"{record.workdir.rstrip('/')}/{EXEC_DIR}/{check_id(exec_id)}.out"


def venv_of(record: RunRecord) -> str | None:
    """The venv the run's own code runs in on a local or SSH host (gpucli.run.starting.jobs.own.venv_dir)."""
    own = record.inputs.own
    if own is None or get_target(record.provider).cloud:
        return None
    code = own.get("code")
    if isinstance(code, dict) and code.get("url"):
        source = f"{code['url']}@{code.get('ref') or ''}"
    elif isinstance(code, str):
        source = code
    else:
        return None
    digest = hashlib.sha256(f"{source}\0{record.python}".encode()).hexdigest()[:16]
    return f"{posixpath.dirname(record.workdir.rstrip('/'))}/.venvs/{digest}"


def start(host: Host, record: RunRecord, argv: Sequence[str], *, detach: bool) -> ExecStarted:
    """Start the command on the run's machine and return at once."""
    line = command_line(argv)
    wd = record.workdir.rstrip("/")
    if not host.exists(wd):
        raise GpucliError(f"run {record.name}'s folder {wd} is not on its machine",
                          hint="the run never started there, or its folder was removed")
    exec_id = new_id()
    base = f"{wd}/{EXEC_DIR}/{exec_id}"
    out, err, rc = f"{base}.out", (None if detach else f"{base}.err"), f"{base}.rc"
    host.run(f"mkdir -p -- {shlex.quote(f'{wd}/{EXEC_DIR}')}", timeout_s=60)
    cwd = f"{wd}/code" if host.exists(f"{wd}/code") else wd
    env_file = f"{wd}/env" if host.exists(f"{wd}/env") else None
    venv = venv_of(record)
    if venv is not None and not host.exists(f"{venv}/bin"):
        venv = None
    path = (f"VIRTUAL_ENV={shlex.quote(venv)}; PATH={shlex.quote(venv + '/bin')}:\"$PATH\"; "
            "export VIRTUAL_ENV PATH; ") if venv else ""
    # A trap (not an ignore) in the waiting shell: the command gets SIGINT's default action, the shell lives
    # on to write the status (128+N for a command killed by signal N).
    script = (f"trap : INT TERM HUP; {path}GPUCLI_RUN={shlex.quote(record.name)}; "
              f"GPUCLI_RUN_DIR={shlex.quote(wd)}; export GPUCLI_RUN GPUCLI_RUN_DIR; "
              f"( {line}\n) < /dev/null" + (f" 2>> {shlex.quote(err)}" if err else "")
              + f"; echo $? > {shlex.quote(rc + '.tmp')} && mv -f -- {shlex.quote(rc + '.tmp')} {shlex.quote(rc)}")
    pid = host.start_detached(script, cwd=cwd, log_path=out, env_file=env_file)
    return ExecStarted(record.name, exec_id, pid, out, err, rc)


def status_of(host: Host, started: ExecStarted) -> int | None:
    """The command's exit status once it wrote one; None while it runs."""
    if not host.exists(started.rc):
        return None
    text = host.read_file(started.rc).decode(errors="replace").strip()
    try:
        return int(text)
    except ValueError:
        return LOST


def follow(host: Host, started: ExecStarted, *, on_out: Callable[[bytes], None], on_err: Callable[[bytes], None],
           on_note: Callable[[str], None] = lambda t: None, poll_s: float = POLL_S,
           sleep: Callable[[float], None] = time.sleep) -> int:
    """Stream the command's output until it ends; its exit status. Ctrl-C (KeyboardInterrupt) here ends the
    command there (SIGINT, then SIGTERM, then SIGKILL, :data:`STOP_GRACE_S` apart) and still returns its
    status."""
    offsets = {"out": 0, "err": 0}
    stopping: list[tuple[float, str]] = []  # (when sent, signal)
    checked = time.monotonic()

    def drain() -> bool:
        got = False
        for key, path, sink in (("out", started.out, on_out), ("err", started.err, on_err)):
            if path is None:
                continue
            while True:
                data, offsets[key] = host.read_from(path, offsets[key])
                if not data:
                    break
                got = True
                sink(data)
        return got

    while True:
        try:
            got = drain()
            rc = status_of(host, started)
            if rc is not None:
                drain()  # what it wrote as it ended
                return rc
            if time.monotonic() - checked >= 2.0:
                checked = time.monotonic()
                if not host.is_running(started.pid):
                    time.sleep(0.2)
                    rc = status_of(host, started)
                    drain()
                    if rc is None:
                        on_note(f"the command's shell on {started.run}'s machine ended without a status")
                    return LOST if rc is None else rc
            if stopping and time.monotonic() - stopping[-1][0] >= (INT_GRACE_S if stopping[-1][1] == "INT"
                                                                   else STOP_GRACE_S):
                nxt = {"INT": "TERM", "TERM": "KILL"}.get(stopping[-1][1])
                if nxt is None:
                    return LOST
                on_note(f"the command did not end on SIG{stopping[-1][1]}: sending SIG{nxt}")
                host.signal(started.pid, nxt)
                stopping.append((time.monotonic(), nxt))
            if not got:
                sleep(poll_s)
        except KeyboardInterrupt:
            if stopping:
                continue  # a second Ctrl-C: the escalation above goes on
            on_note(f"interrupted: ending the command on {started.run}'s machine")
            host.signal(started.pid, "INT")
            stopping.append((time.monotonic(), "INT"))
        except (ConnectionFailed, TransferError) as exc:
            raise ConnectionFailed(f"lost {started.run}'s machine while following exec {started.exec_id} ({exc})",
                                   hint=f"it goes on there: `gpucli logs {started.run} --exec {started.exec_id}`") from exc
