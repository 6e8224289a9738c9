"""Local run records: one JSON file per run under ``GPUCLI_HOME/runs``, written atomically.

A record is written before anything waits (so a pod id is never only in memory), and updated as
the run moves on. It never holds a secret: API keys and tokens live in keys.json or the
environment, and reach the pod only through its 0600 env file.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from gpucli.errors import NotFoundError, UnknownNameError, UsageError
from gpucli.runs.health import Preflight
from gpucli.runs.launchinputs import NO_INPUTS, LaunchInputs
from gpucli.runs.limits import ZERO_OFF, Limits
from gpucli.settings import home
from gpucli.ssh import SshTarget

__all__ = ["TRANSITIONS", "BadTransition", "LinkPair", "LinkProbe", "Limits", "NodeRecord", "PlannedSpeed",
           "RunRecord", "RunState", "check_name", "check_transition", "list_runs", "load", "now_iso", "parse_iso",
           "resolve", "runs_dir", "save", "unique_name"]

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class RunState(str, Enum):
    """Where a run is in its life. A ``str`` so that records, JSON and the tables read as before."""

    PROVISIONING = "provisioning"  # renting or reaching its machine
    STARTING = "starting"  # the machine answers; the environment, code and data are being put there
    RUNNING = "running"  # the job was started (its pid is recorded)
    FINISHED = "finished"  # it ended by itself: its steps, a cap, or its own code's exit 0
    FAILED = "failed"  # it, or its launch, failed
    STOPPED = "stopped"  # ended from outside: `gpucli down`, or its pod gone
    TERMINATE_PENDING = "terminate pending"  # ended here, but the provider has not confirmed the pod gone

    def __str__(self) -> str:  # "running", never "RunState.RUNNING", wherever a record is shown
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __hash__(self) -> int:  # Enum hashes the member's name: a dict keyed by "running" must find it
        return hash(self.value)

    @property
    def active(self) -> bool:
        return self in _ACTIVE


_ACTIVE = frozenset({RunState.PROVISIONING, RunState.STARTING, RunState.RUNNING})
_ENDED = frozenset({RunState.FINISHED, RunState.FAILED, RunState.STOPPED})
ACTIVE_STATES = tuple(s.value for s in RunState if s in _ACTIVE)

#: Every state a run may move to from each state (a save to the same state is always allowed). A run
#: that has ended never comes back to life but through a new launch on it (`resume`, `--recover`:
#: provisioning); between the ended states it may move, as what ended it becomes known (a `down` that
#: crossed the run's own finish, its own end record read later), and to an unconfirmed terminate.
_AFTER_END = _ENDED | {RunState.PROVISIONING, RunState.TERMINATE_PENDING}
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.PROVISIONING: _ACTIVE | _AFTER_END,
    RunState.STARTING: frozenset({RunState.RUNNING}) | _AFTER_END,
    RunState.RUNNING: _AFTER_END,
    RunState.FINISHED: _AFTER_END,
    RunState.FAILED: _AFTER_END,
    RunState.STOPPED: _AFTER_END,
    RunState.TERMINATE_PENDING: _AFTER_END,
}


class BadTransition(UsageError):
    """A save that would move a run where its life does not go (a bug, or two gpucli commands racing)."""


def check_transition(old: RunState | str | None, new: RunState | str) -> RunState:
    """``new`` as a RunState, after checking that a run in ``old`` (None: a new record) may move there."""
    try:
        state = RunState(new)
    except ValueError:
        raise BadTransition(f"not a run state: {new!r} (one of: {', '.join(s.value for s in RunState)})") from None
    if old is None or RunState(old) == state or state in TRANSITIONS[RunState(old)]:
        return state
    raise BadTransition(f"a {RunState(old).value} run cannot become {state.value}")


@dataclass(frozen=True)
class PlannedSpeed:
    """What the planner said before the run, for plan-against-actual in status."""

    tokens_per_s: float | None = None
    hours: float | None = None
    cost_usd: float | None = None
    source: str | None = None


@dataclass(frozen=True)
class LinkPair:
    """One node's link to rank 0 as measured at launch (gpucli/run/host/linkprobe.py)."""

    rank: int
    gbps: float
    bytes: int
    seconds: float


@dataclass(frozen=True)
class LinkProbe:
    """The nodes' link measured at launch: every pair to rank 0; the slowest sets the plan's pace."""

    gbps: float  # the slowest pair's
    pairs: tuple[LinkPair, ...]
    source: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinkProbe:
        return cls(gbps=float(data["gbps"]), source=str(data["source"]),
                   pairs=tuple(LinkPair(**p) for p in data.get("pairs") or ()))


@dataclass(frozen=True)
class NodeRecord:
    """One more node of a run over several machines (rank 0 is the run record itself): where its run
    folder is and what runs there, recorded as soon as it is known (gpucli.run.host.nodes)."""

    rank: int
    workdir: str
    ssh: SshTarget | None = None
    instance_id: str | None = None
    pid: int | None = None
    pid_ident: str | None = None
    watchdog_pid: int | None = None
    watchdog_ident: str | None = None

    def with_(self, **changes: Any) -> NodeRecord:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeRecord:
        ssh = None
        if data.get("ssh"):
            ssh = SshTarget(**data["ssh"])
        known = {f.name for f in dataclasses.fields(cls)} - {"ssh"}
        return cls(ssh=ssh, **{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class RunRecord:
    name: str
    provider: str  # local | ssh | runpod | vast
    created_at: str  # ISO 8601, UTC
    profile: str
    phase: str
    model: str
    n_gpus: int
    gpu: str | None
    workdir: str  # the run's folder on the pod (or on this machine for local)
    status: RunState = RunState.PROVISIONING
    instance_id: str | None = None
    label: str | None = None  # gpucli-<name>
    ssh: SshTarget | None = None  # host_key is pinned at first contact; identity_file is a path, never a key
    pid: int | None = None  # the trainer's process group on the host
    watchdog_pid: int | None = None
    # What identifies those processes beyond their pid (gpucli/pod/procid.py): taken when they start and
    # checked on the host before any signal, so a stale record never signals a process that reused the pid.
    pid_ident: str | None = None
    watchdog_ident: str | None = None
    cost_usd: float | None = None  # metered: elapsed on the host x price, recorded when the run ends
    limits: Limits = field(default_factory=Limits)  # with the machine's price per hour
    planned: PlannedSpeed = field(default_factory=PlannedSpeed)
    python: str = "python3"
    started_at: str | None = None
    ended_at: str | None = None
    end_reason: str | None = None
    message: str | None = None
    launch: LaunchInputs | None = None  # the launch's own inputs (no secrets), for `gpucli resume`
    previous_instances: tuple[str, ...] = ()  # pods this run had before a resume
    step: int | None = None  # the last training step seen, kept when the run ends (for `ls`)
    loss: float | None = None  # the training loss at that step
    best_val_loss: float | None = None  # the lowest validation loss (nanochat: val_bpb) seen, kept for `ls`
    best_val_step: int | None = None  # the step it was measured at
    # ``<pid>:<identity>`` of the process launching it, while the launch owns the pod (gpucli/run/host/owner.py).
    launcher: str | None = None
    #: This run's identity, written into its folder on the host (``run.id``) by the launch and checked by
    #: every command that opens the folder: a folder of an earlier run of the same name never answers.
    run_id: str | None = None
    nodes: tuple[NodeRecord, ...] = ()  # ranks 1..N-1 of a run over N machines (gpucli.run.host.nodes)
    link: LinkProbe | None = None  # the nodes' link as measured at launch (ssh hosts without --link-gbps)
    env_build_s: float | None = None  # seconds setup_pod.sh took for the trainer's environment (built or reused)
    preflight: Preflight | None = None  # the machine checked before the run was detached (gpucli/run/starting/preflight.py)
    attempts: tuple[dict[str, Any], ...] = ()  # a launch across providers: each offer tried (gpucli/run/life/failover.py)
    ended_by: str | None = None  # the path that ended the pod, as its watchdog.json says (gpucli/runs/endedby.py)

    def __post_init__(self) -> None:
        if self.launch is not None and not isinstance(self.launch, LaunchInputs):  # a dict: typed here, once
            object.__setattr__(self, "launch", LaunchInputs.from_dict(self.launch))

    def with_(self, **changes: Any) -> RunRecord:
        return dataclasses.replace(self, **changes)

    @property
    def active(self) -> bool:
        return RunState(self.status).active

    @property
    def inputs(self) -> LaunchInputs:
        """The launch inputs (empty for a record of a gpucli that kept none)."""
        return self.launch if self.launch is not None else NO_INPUTS

    @property
    def price_per_hour_usd(self) -> float | None:
        return self.limits.price_per_hour_usd

    def cost_until_now(self) -> float | None:
        """What the machine has billed from its creation (provisioning included) until now."""
        created = parse_iso(self.created_at)
        if not self.price_per_hour_usd or created is None:
            return None
        return (dt.datetime.now(dt.timezone.utc) - created).total_seconds() / 3600 * self.price_per_hour_usd


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def parse_iso(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return None


def runs_dir() -> Path:
    d = home() / "runs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise UsageError(f"run name '{name}' is not valid",
                         hint="use lower-case letters, digits and '-', at most 63 characters")
    return name


def _to_json(record: RunRecord) -> dict[str, Any]:
    data = dataclasses.asdict(record)
    if not record.nodes:
        del data["nodes"]  # records of one-machine runs stay as they were
    if record.link is None:
        del data["link"]
    if not record.attempts:
        del data["attempts"]
    if record.preflight is None:
        del data["preflight"]  # records without a preflight stay as they were
    else:
        data["preflight"] = record.preflight.to_json()
    data["launch"] = record.launch.to_dict() if record.launch is not None else None
    return data


class BadRecord(UsageError):
    """A run record that cannot be read as one (not JSON, not UTF-8, wrong shape or types)."""


_STR = ("name", "provider", "created_at", "profile", "phase", "model", "workdir", "status", "python")
_OPT_STR = ("gpu", "instance_id", "label", "started_at", "ended_at", "end_reason", "message", "pid_ident",
            "watchdog_ident", "launcher", "run_id")
_OPT_POS_INT = ("pid", "watchdog_pid", "n_gpus")
_OPT_NUMBER = ("cost_usd", "loss", "env_build_s", "best_val_loss",
               "price_per_hour_usd")  # the last: records before limits held it


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _problem(data: Any) -> str | None:
    """What makes ``data`` not a run record (types and shape only), or None."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key in _STR:
        if key in data and not isinstance(data[key], str):
            return f"'{key}' is not a string"
    for key in ("name", "provider", "created_at", "profile", "phase", "model", "workdir"):
        if key not in data:
            return f"no '{key}'"
    if not NAME_RE.match(data["name"]):
        return f"run name {data['name']!r} is not valid"
    if "status" in data and data["status"] not in {s.value for s in RunState}:
        return f"'status' {data['status'][:40]!r} is not a run state"
    for key in _OPT_STR:
        if data.get(key) is not None and not isinstance(data[key], str):
            return f"'{key}' is not a string"
    for key in _OPT_POS_INT:
        if (data.get(key) is not None or key == "n_gpus") and not (_is_int(data.get(key)) and data[key] > 0):
            return f"'{key}' is not a positive whole number"
    for key in ("step", "best_val_step"):
        if data.get(key) is not None and not (_is_int(data[key]) and data[key] >= 0):
            return f"'{key}' is not a whole number"
    for key in _OPT_NUMBER:
        if data.get(key) is not None and not _is_number(data[key]):
            return f"'{key}' is not a finite number"
    for key in ("ssh", "limits", "planned", "launch", "link", "preflight"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            return f"'{key}' is not an object"
    ssh = data.get("ssh") or {}
    if ssh and not (isinstance(ssh.get("host"), str) and _is_int(ssh.get("port", 22))
                    and isinstance(ssh.get("user", "root"), str)
                    and all(ssh.get(k) is None or isinstance(ssh[k], str) for k in ("identity_file", "host_key", "proxy_jump"))
                    and (ssh.get("via") is None or isinstance(ssh["via"], dict))):
        return "'ssh' is not an SSH endpoint"
    limits = data.get("limits") or {}
    for key, value in limits.items():
        if key == "replace_slow":  # a flag; idle_stop_minutes and slow_below take 0 (off)
            if not isinstance(value, bool):
                return "limits.replace_slow is not true or false"
        elif value is not None and not (_is_number(value) and (value > 0 or (value == 0 and key in ZERO_OFF))):
            return f"limits.{key} is not a positive number"
    for key, value in (data.get("planned") or {}).items():
        if value is not None and not (_is_number(value) or (key == "source" and isinstance(value, str))):
            return f"planned.{key} is not a number"
    nodes = data.get("nodes")
    if nodes is not None and not (isinstance(nodes, list) and all(
            isinstance(n, dict) and _is_int(n.get("rank")) and isinstance(n.get("workdir"), str) for n in nodes)):
        return "'nodes' is not a list of nodes"
    prev = data.get("previous_instances")
    if prev is not None and not (isinstance(prev, list) and all(isinstance(p, str) for p in prev)):
        return "'previous_instances' is not a list of pod ids"
    return None


def _from_json(data: Any, path: Path) -> RunRecord:
    problem = _problem(data)
    if problem:
        raise BadRecord(f"{path}: not a gpucli run record ({problem})")
    if data["name"] != path.stem:
        raise BadRecord(f"{path}: not a gpucli run record (it names run '{data['name']}')")
    try:
        ssh = None
        if data.get("ssh"):
            ssh = SshTarget(**data["ssh"])
        limits = Limits.from_json(data.get("limits"))
        if limits.price_per_hour_usd is None and data.get("price_per_hour_usd") is not None:
            limits = limits.with_(price_per_hour_usd=data["price_per_hour_usd"])  # records before the move
        planned = PlannedSpeed(**(data.get("planned") or {}))
        known = {f.name for f in dataclasses.fields(RunRecord)}
        rest = {k: v for k, v in data.items() if k in known and k not in ("ssh", "limits", "planned", "link", "preflight")}
        link = LinkProbe.from_json(data["link"]) if data.get("link") else None
        rest["preflight"] = Preflight.from_json(data["preflight"]) if data.get("preflight") else None
        rest["nodes"] = tuple(NodeRecord.from_json(n) for n in rest.get("nodes") or ())
        rest["attempts"] = tuple(a for a in rest.get("attempts") or () if isinstance(a, dict))
        rest["ended_by"] = rest.get("ended_by") if isinstance(rest.get("ended_by"), str) else None
        if "previous_instances" in rest:
            rest["previous_instances"] = tuple(rest["previous_instances"] or ())
        rest["status"] = RunState(rest.get("status", RunState.PROVISIONING))
        rest["launch"] = LaunchInputs.from_dict(rest.get("launch"))
        return RunRecord(ssh=ssh, limits=limits, planned=planned, link=link, **rest)
    except (TypeError, KeyError, ValueError) as exc:
        raise BadRecord(f"{path}: not a gpucli run record ({exc})") from exc


def _read(path: Path) -> RunRecord:
    """The record in ``path``, or a one-line :class:`BadRecord` naming the file."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise BadRecord(f"{path}: not a gpucli run record (not UTF-8 text)") from None
    except OSError as exc:
        raise BadRecord(f"{path}: not a gpucli run record ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise BadRecord(f"{path}: corrupt run record (nested too deep)") from None
    except ValueError as exc:
        raise BadRecord(f"{path}: corrupt run record ({getattr(exc, 'msg', exc)})") from None
    return _from_json(data, path)


def save(record: RunRecord) -> Path:
    """Write the record atomically (temp file + rename): a crash never leaves half a record. Its state
    must be one a run in the saved record's state may move to (:data:`TRANSITIONS`)."""
    path = runs_dir() / f"{record.name}.json"
    try:
        before: RunState | None = _read(path).status if path.exists() else None
    except BadRecord:
        before = None  # a corrupt record is replaced whole
    record = record.with_(status=check_transition(before, record.status))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(_to_json(record), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def load(name: str) -> RunRecord:
    check_name(name)  # `status ../../x` never reads outside the runs folder
    path = runs_dir() / f"{name}.json"
    if not path.exists():
        names = [r.name for r in list_runs()]
        if names:
            raise UnknownNameError("run", name, names)
        raise NotFoundError(f"no run named '{name}'", hint="start one with `gpucli launch`")
    return _read(path)


def list_runs(on_bad: Callable[[str], None] | None = None) -> list[RunRecord]:
    """Every run, oldest first. A record that cannot be read is skipped, and ``on_bad`` gets one line
    naming its file: one broken file never hides the other runs."""
    out = []
    for path in runs_dir().glob("*.json"):
        try:
            out.append(_read(path))
        except BadRecord as exc:
            if on_bad is not None:
                on_bad(f"skipped {exc}")
    return sorted(out, key=lambda r: (r.created_at, r.name))


def resolve(name: str | None, on_bad: Callable[[str], None] | None = None) -> RunRecord:
    """The named run, or the newest one when no name is given. An empty name is not "no name"."""
    if name is not None:
        return load(name)
    runs = list_runs(on_bad)
    if not runs:
        raise NotFoundError("no runs yet", hint="start one with `gpucli launch`")
    return runs[-1]


def _base_name(base: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")[:50] or "run"


def _taken(name: str) -> bool:
    d = runs_dir()
    return (d / f"{name}.json").exists() or (d / ".reserved" / name).exists()


def unique_name(base: str) -> str:
    """The first free name of ``base``, ``base-2``, ... (what a launch would get; nothing reserved)."""
    base = _base_name(base)
    if not _taken(base):
        return base
    i = 2
    while _taken(f"{base}-{i}"):
        i += 1
    return f"{base}-{i}"


def reserve_name(base: str, *, exact: bool = False) -> str:
    """Claim a run name for one launch, atomically: the first free one of ``base``, ``base-2``, ...
    (only ``base`` itself when ``exact``). The claim is a file created exclusively (O_CREAT|O_EXCL),
    so two launches at once never get the same name and never write into one folder; the record, once
    saved, holds the name, and :func:`release_name` drops the claim."""
    name = check_name(base) if exact else _base_name(base)
    d = runs_dir() / ".reserved"
    d.mkdir(exist_ok=True)
    i = 1
    while True:
        candidate = name if i == 1 else f"{name}-{i}"
        try:
            fd = os.open(d / candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            claimed = True
        else:
            os.write(fd, f"{os.getpid()}\n".encode())
            os.close(fd)
            # A record saved before this claim (or by a launch whose claim is already released) holds it.
            claimed = (runs_dir() / f"{candidate}.json").exists()
            if claimed:
                release_name(candidate)
        if not claimed:
            return candidate
        if exact:
            raise UsageError(f"a run named '{name}' exists", hint="pick another --name")
        i += 1


def release_name(name: str) -> None:
    (runs_dir() / ".reserved" / name).unlink(missing_ok=True)
