"""``gpucli watch RUN --detach --on user@host``: the run's watcher (recovery of a lost spot pod, the end of
a rented cluster, the store, the mirror) on an always-on machine of yours, over SSH, so that it goes on
with this machine off.

What travels, and why so:

- gpucli itself, as this machine has it (the ``gpucli`` and ``trainer`` packages, synced into
  ``~/.gpucli-watch/RUN/pkg`` and put on ``PYTHONPATH``): the watcher reads the run's record and resumes
  it with the trainer code of the very version that wrote it; an installed gpucli of another version
  there could read the record otherwise. Its dependencies must be there (``pip install gpucli`` once puts
  them there), checked with one line before anything is copied.
- the run's record, in a gpucli home of its own there (``~/.gpucli-watch/RUN/home``), and, for a cloud
  run, gpucli's pod key pair (0600), which the watcher opens the pods with;
- the provider key, the store's credentials, the run's ``--env`` secrets (a recovery's new pod gets them)
  and the endpoints, in a 0600 env file that the detached
  shell sources (``set -a``): never on a command line, in a log or in the record.

The watcher starts in its own session (``setsid nohup``), its pid kept there (``watch.log.pid``) and
here (``GPUCLI_HOME/runs/RUN.remote-watch.json``, no secret in it). ``--status`` shows whether it runs,
the end of its log, and brings the record it keeps back here (a recovery moves the run to a new pod);
``--stop`` ends it, brings the record back and deletes the key and env file there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gpucli
from gpucli.errors import GpucliError, NotFoundError, UsageError
from gpucli.providers.registry import get_target
from gpucli.run.files.store import run_store, store_env
from gpucli.runs import records as runs
from gpucli.runs.notice import StepFn
from gpucli.runs.records import RunRecord
from gpucli.runs.secretenv import lookup
from gpucli.settings import home

PKG_ROOT = Path(gpucli.__file__).resolve().parents[1]  # holds gpucli/ and trainer/
NEEDS = "typer, rich, yaml, requests, paramiko"  # gpucli's dependencies (pyproject.toml), what the watcher imports
#: This machine's settings the watcher keeps; not the ones naming this machine's paths.
LEFT_HERE = {"GPUCLI_HOME", "GPUCLI_CATALOG"}
ENDPOINTS = ("RUNPOD_API_BASE_URL", "RUNPOD_API_V2_URL", "VAST_URL")  # gpucli/providers/credentials.py, clusters.py


@dataclass(frozen=True)
class RemoteWatch:
    run: str
    on: str  # user@host[:port]
    identity: str | None
    folder: str  # absolute, on that host
    pid: int
    started_at: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _state_path(run: str) -> Path:
    return runs.runs_dir() / f"{run}.remote-watch.json"


def load_state(run: str) -> RemoteWatch:
    try:
        data = json.loads(_state_path(run).read_text())
        return RemoteWatch(**data)
    except (OSError, ValueError, TypeError):
        raise NotFoundError(f"run {run} has no watcher on another machine",
                            hint=f"gpucli watch {run} --detach --on USER@HOST") from None


def _open(on: str, identity: str | None) -> Any:
    from gpucli.ssh import Remote, parse_target  # lazy: paramiko

    try:
        remote = Remote(parse_target(on, identity_file=identity), connect_timeout_s=20)
        remote.connect()
    except GpucliError as exc:
        raise UsageError(f"--on {on}: cannot be reached: {exc.message}") from None
    return remote


def _env(record: RunRecord) -> dict[str, str]:
    """What the watcher needs of this machine's secrets and settings, for its 0600 env file."""
    env = {k: v for k, v in os.environ.items() if k.startswith("GPUCLI_") and k not in LEFT_HERE}
    env.update({k: os.environ[k] for k in ENDPOINTS if os.environ.get(k)})
    if get_target(record.provider).cloud:
        from gpucli import settings  # lazy: with the key lookup below, only for a cloud run
        from gpucli.providers.credentials import resolve_key  # lazy: the providers' clients

        env[settings.KEYS[record.provider].env_var] = resolve_key(record.provider).value
    env.update(store_env(run_store(record)))
    for name in record.inputs.requested.get("env_names") or ():  # --env: a recovery's new pod needs them
        hit = lookup(str(name))
        if hit is not None:
            env[str(name)] = hit[0]
    return env


def _with_key(record: RunRecord, key: str | None) -> RunRecord:
    """The record with its pods' identity file at ``key`` (their key pair's path on the other machine)."""
    if key is None:
        return record
    def fix(t: Any) -> Any:
        return (dataclasses.replace(t, identity_file=key) if t is not None and t.identity_file else t)
    return record.with_(ssh=fix(record.ssh), nodes=tuple(n.with_(ssh=fix(n.ssh)) for n in record.nodes))


def detach(run: str | None, on: str, *, identity: str | None, recover: bool, mirror: bool, poll_s: float,
           on_step: StepFn) -> RemoteWatch:
    record = runs.resolve(run)
    if not record.active and record.status in ("finished", "failed", "stopped"):
        raise UsageError(f"run {record.name} is over ({record.status}): there is nothing to watch")
    env = _env(record)  # before anything is copied: a missing key is one line, nothing left there
    remote = _open(on, identity)
    try:
        probe = remote.run(f"python3 -c {shlex.quote('import ' + NEEDS.replace(' ', ''))}", timeout_s=60, check=False)
        if probe.exit_code != 0:
            raise UsageError(f"--on {on}: python3 there lacks gpucli's dependencies ({NEEDS})",
                             hint="pip install gpucli there once (this gpucli itself is copied with the watcher)")
        folder = remote.run(f"mkdir -p .gpucli-watch/{shlex.quote(record.name)}/home/runs && "
                            f"cd .gpucli-watch/{shlex.quote(record.name)} && pwd", timeout_s=60).stdout.strip()
        on_step(f"copying gpucli to {on}:{folder}/pkg")
        for name in ("gpucli", "trainer"):
            remote.sync_up(str(PKG_ROOT / name), f"{folder}/pkg/{name}", excludes=["__pycache__", "*.pyc"])
        key = None
        pair = home() / "id_ed25519"
        if record.ssh is not None and record.ssh.identity_file and Path(record.ssh.identity_file) == pair:
            key = f"{folder}/home/id_ed25519"
            remote.write_file(key, pair.read_bytes(), mode=0o600)
            remote.write_file(key + ".pub", pair.with_suffix(".pub").read_bytes(), mode=0o644)
        data = json.dumps(runs._to_json(_with_key(record, key)), indent=1).encode()
        remote.write_file(f"{folder}/home/runs/{record.name}.json", data, mode=0o600)
        remote.write_env_file(f"{folder}/env", {**env, "GPUCLI_HOME": f"{folder}/home", "PYTHONPATH": f"{folder}/pkg"})
        remote.run(f"rm -f -- {shlex.quote(folder)}/watch.log", timeout_s=30, check=False)  # an earlier watcher's
        args = ["python3", "-m", "gpucli", "watch", record.name, "--poll", f"{poll_s:g}",
                "--mirror" if mirror else "--no-mirror"] + (["--recover"] if recover else [])
        pid = remote.start_detached(" ".join(shlex.quote(a) for a in args), cwd=folder, log_path=f"{folder}/watch.log",
                                    env_file=f"{folder}/env")
    finally:
        remote.close()
    state = RemoteWatch(record.name, on, identity, folder, pid, runs.now_iso())
    _state_path(record.name).write_text(json.dumps(state.to_json(), indent=1))
    on_step(f"watcher of {record.name} started on {on} (pid {pid}); `gpucli watch {record.name} --status` shows it")
    return state


@dataclass(frozen=True)
class WatchStatus:
    state: RemoteWatch
    running: bool
    log_tail: tuple[str, ...]
    record_status: str | None  # the run as the watcher there last saw it


def _bring_back(remote: Any, st: RemoteWatch) -> str | None:
    """The record the watcher keeps there, saved here (its pods' key path made this machine's again)."""
    try:
        with tempfile.TemporaryDirectory(prefix="gpucli-watch-") as tmp:
            path = Path(tmp) / f"{st.run}.json"
            path.write_bytes(remote.read_file(f"{st.folder}/home/runs/{st.run}.json"))
            there = runs._from_json(json.loads(path.read_text()), path)
    except (GpucliError, ValueError, TypeError, KeyError):
        return None
    here = runs.load(st.run)
    if here.ssh is not None and there.ssh is not None and here.ssh.identity_file:
        there = _with_key(there, here.ssh.identity_file)
    runs.save(there)
    return there.status


def _alive(remote: Any, pid: int) -> bool:
    # a zombie (exited, not yet reaped by an init that does not reap) is not running
    return remote.run(f"ps -o stat= -p {int(pid)} | grep -qv '^Z'", timeout_s=30, check=False).exit_code == 0


def status(run: str | None) -> WatchStatus:
    name = runs.resolve(run).name
    st = load_state(name)
    remote = _open(st.on, st.identity)
    try:
        running = _alive(remote, st.pid)
        tail = remote.run(f"tail -n 8 {shlex.quote(st.folder)}/watch.log", timeout_s=30, check=False).stdout
        seen = _bring_back(remote, st)
    finally:
        remote.close()
    return WatchStatus(st, running, tuple(tail.splitlines()), seen)


def stop(run: str | None, *, wait_s: float = 30.0) -> WatchStatus:
    """End the watcher there (its process group), bring its record back, delete its secrets there."""
    name = runs.resolve(run).name
    st = load_state(name)
    remote = _open(st.on, st.identity)
    try:
        remote.run(f"kill -TERM -- -{int(st.pid)} 2>/dev/null", timeout_s=30, check=False)
        deadline = time.monotonic() + wait_s
        while _alive(remote, st.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _alive(remote, st.pid):
            remote.run(f"kill -KILL -- -{int(st.pid)} 2>/dev/null", timeout_s=30, check=False)
        running = _alive(remote, st.pid)
        tail = remote.run(f"tail -n 8 {shlex.quote(st.folder)}/watch.log", timeout_s=30, check=False).stdout
        seen = _bring_back(remote, st)
        q = shlex.quote(st.folder)
        remote.run(f"rm -f -- {q}/env {q}/home/id_ed25519 {q}/home/keys.json", timeout_s=30, check=False)
    finally:
        remote.close()
    if not running:
        _state_path(name).unlink(missing_ok=True)
    return WatchStatus(st, running, tuple(tail.splitlines()), seen)
