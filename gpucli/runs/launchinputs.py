"""A run's launch inputs as typed data: what its record keeps (never a secret) to make the same launch
again (``gpucli resume``, ``watch --recover``, a sweep's next run) and what the launch learnt that belongs
to it (the network volume it mounts, the cluster or overlay it rented, the machine it runs on).

It sits below everything that acts on a run (``gpucli/runs``): the providers read their cluster and
volume ids from it, the run floor reads the request. The request itself is
:class:`gpucli.run.inputs.launch.LaunchRequest` in its JSON form, read back only by
``LaunchRequest.from_json``; it is kept as written so that a record reads the same in every version.

Older records hold a dict with any subset of these keys, and some keys beside the request that are no
longer written (``python``, ``image``, ``disk``, ``ready_timeout``, ``ssh``): those, and keys this
version does not know, are kept in :attr:`LaunchInputs.other` and written back unchanged.

For readers written before the type, a :class:`LaunchInputs` also reads as a mapping (read-only) of
:meth:`LaunchInputs.to_dict`; new code reads the fields.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NO_INPUTS", "BoxInputs", "KeptVolume", "LaunchInputs", "OnMachine"]


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"launch.{key} is not a string")
    return str(value)


def _mapping(data: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"launch.{key} is not an object")
    return dict(value)


@dataclass(frozen=True)
class KeptVolume:
    """The network volume the run's folder is on (RunPod: ``NetworkVolume.to_json``), by id: a resume
    mounts this very volume, names need not be unique."""

    id: str
    name: str | None = None
    size_gb: float | None = None
    data_center_id: str | None = None
    created: bool = False  # created by the launch: kept after the run, billed monthly until deleted
    type: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KeptVolume:
        vid = _opt_str(data, "id")
        if not vid:
            raise ValueError("launch.volume has no id")
        size = data.get("size_gb")
        if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float)) or not math.isfinite(size)):
            raise ValueError("launch.volume.size_gb is not a number")
        return cls(id=vid, name=_opt_str(data, "name"), size_gb=size, data_center_id=_opt_str(data, "data_center_id"),
                   created=bool(data.get("created")), type=_opt_str(data, "type"))


@dataclass(frozen=True)
class OnMachine:
    """``launch --on RUN``: the run that rented the machine (its bill), and the run this one came after."""

    machine: str
    after: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OnMachine:
        machine = _opt_str(data, "machine")
        if not machine:
            raise ValueError("launch.on names no machine")
        return cls(machine=machine, after=_opt_str(data, "after"))


@dataclass(frozen=True)
class BoxInputs:
    """A dev box (``gpucli up``): its idle window and what ends it."""

    idle_minutes: float | None = None
    on_end: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BoxInputs:
        idle = data.get("idle_minutes")
        if idle is not None and (isinstance(idle, bool) or not isinstance(idle, (int, float)) or not math.isfinite(idle)):
            raise ValueError("launch.box.idle_minutes is not a number")
        return cls(idle_minutes=idle, on_end=_opt_str(data, "on_end"))


#: The keys written as fields, in the order they are written.
_FIELDS = ("request", "own", "volume", "on", "box", "cluster_id", "vast_cluster_id", "overlay_id", "overlay_name",
           "bandwidth_usd")


@dataclass(frozen=True)
class LaunchInputs(Mapping[str, Any]):
    """What a run record keeps of its launch (``RunRecord.launch``). Every field may be absent: a record
    of an older gpucli holds any subset."""

    #: The launch as asked for (``LaunchRequest.to_json()["request"]``): names of secrets, never values.
    request: Mapping[str, Any] | None = None
    #: Your own code's task (``gpucli.runs.task.task_to_json``); None: the bundled trainer.
    own: Mapping[str, Any] | None = None
    volume: KeptVolume | None = None
    on: OnMachine | None = None
    box: BoxInputs | None = None
    cluster_id: str | None = None  # a RunPod cluster rented for the run's nodes
    vast_cluster_id: str | None = None  # a vast.ai cluster and its overlay network
    overlay_id: str | None = None
    overlay_name: str | None = None
    bandwidth_usd: float | None = None  # what the provider billed for traffic, counted once into the cost
    #: Keys older versions wrote beside the request (python, image, disk, ready_timeout, ssh) and keys this
    #: version does not know: kept as read, written back unchanged.
    other: Mapping[str, Any] = field(default_factory=dict)

    def with_(self, **changes: Any) -> LaunchInputs:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> LaunchInputs | None:
        """From a record's ``launch`` (None stays None); a wrong type is a ValueError naming the key."""
        if data is None:
            return None
        if isinstance(data, LaunchInputs):
            return data
        if not isinstance(data, Mapping):
            raise ValueError("launch is not an object")
        volume, on, box = _mapping(data, "volume"), _mapping(data, "on"), _mapping(data, "box")
        bandwidth = data.get("bandwidth_usd")
        if bandwidth is not None and (isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float))
                                      or not math.isfinite(bandwidth)):
            raise ValueError("launch.bandwidth_usd is not a finite number")
        # A volume or machine written without its id (no version wrote one) is kept as read, not typed.
        other = {k: v for k, v in data.items() if k not in _FIELDS}
        if volume is not None and not volume.get("id"):
            other["volume"], volume = volume, None
        if on is not None and not on.get("machine"):
            other["on"], on = on, None
        return cls(request=_mapping(data, "request"), own=_mapping(data, "own") or None,  # {}: no task
                   volume=KeptVolume.from_dict(volume) if volume else None,
                   on=OnMachine.from_dict(on) if on else None,
                   box=BoxInputs.from_dict(box) if box else None,
                   cluster_id=_opt_str(data, "cluster_id"), vast_cluster_id=_opt_str(data, "vast_cluster_id"),
                   overlay_id=_opt_str(data, "overlay_id"), overlay_name=_opt_str(data, "overlay_name"),
                   bandwidth_usd=None if bandwidth is None else float(bandwidth), other=other)

    def to_dict(self) -> dict[str, Any]:
        """The JSON a record holds: absent fields are not written (records stay as they were)."""
        out: dict[str, Any] = {}
        for key in _FIELDS:
            value = getattr(self, key)
            if value is None:
                continue
            if dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)  # type: ignore[arg-type]
            elif isinstance(value, Mapping):
                value = dict(value)
            out[key] = value
        for key, value in self.other.items():
            out.setdefault(key, value)
        return out

    # -- the read-only mapping of to_dict(), for readers written before the type ----------------------

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    __hash__ = None  # type: ignore[assignment]  # it holds mappings

    @property
    def requested(self) -> Mapping[str, Any]:
        """The request as written (empty when the record has none)."""
        return self.request or {}


NO_INPUTS = LaunchInputs()
