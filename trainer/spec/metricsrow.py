"""One row of ``metrics.jsonl``, typed: what the trainer writes and what gpucli reads back.

The file is one JSON object a line (``trainer/watch/metrics.py`` writes the bundled trainer's; the
own-code runner's ``gpucli/pod/logparse.py`` writes the same shape from a job's console). The fields
every reader uses are typed here, with their units; any other key (``ppl``, ``stage``, ``tcf/...``,
an event's own fields, what an older or newer trainer wrote) is kept in :attr:`MetricsRow.extra`, so
rows written before this type existed, and rows of your own code, read the same way.

:func:`parse_row` never raises: a row from a pod is untrusted, and anything that cannot be a row
(not an object, a ``kind`` that is not a string, a train or validation row without a whole step >= 0)
is None, which readers skip. A typed field with a value of the wrong type (a string loss, an infinite
rate, a list) reads as None. Torch-free, standard library only.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

#: The longest line that can be a row (the trainer's are a few hundred bytes; a validation row with
#: geometry metrics a few KB).
MAX_ROW_BYTES = 1 << 20
STEPPED = ("train", "val")  # kinds whose rows need a step


@dataclass(frozen=True)
class MetricsRow:
    kind: str = ""  # train | val | event (a row of another kind reads too: its fields are in extra)
    step: int | None = None  # optimizer steps done when the row was written
    time: float | None = None  # when it was written: Unix seconds
    loss: float | None = None  # training loss, nats per token (own code: whatever its loss is)
    val_loss: float | None = None  # validation loss, nats per token
    val_bpb: float | None = None  # validation bits per byte (nanochat logs it instead of a loss)
    lr: float | None = None  # the matrix parameters' learning rate
    grad_norm: float | None = None  # the gradient's global L2 norm before clipping
    tok_per_s: float | None = None  # training tokens per second, all GPUs together
    dt_ms: float | None = None  # milliseconds the step took
    mfu: float | None = None  # model FLOPs utilisation: a fraction of the GPUs' bf16 peak (0..1)
    mem_gib: float | None = None  # peak memory, GiB
    elapsed_s: float | None = None  # seconds of training since the run started (resumes included)
    cost_usd: float | None = None  # USD the run has cost so far, metered on the machine
    tokens: int | None = None  # training tokens seen
    seq_len: int | None = None  # tokens per sequence
    max_steps: int | None = None  # the step count the run aims at, where the job says (own code)
    event: str | None = None  # an event row's event: started | resumed | checkpoint | finished | ...
    reason: str | None = None  # a finished event's reason: max_steps | max_hours | max_cost | signal | ...
    extra: Mapping[str, Any] = field(default_factory=dict)  # every other key, as written
    keys: tuple[str, ...] = field(default=(), compare=False, repr=False)  # the keys as read, in their order

    @property
    def step_time_s(self) -> float | None:
        """Seconds the step took."""
        return None if self.dt_ms is None else self.dt_ms / 1000

    def get(self, key: str, default: Any = None) -> Any:
        """A field by its JSON key, typed or extra (for keys only some rows carry)."""
        if key in _TYPED:
            value = getattr(self, key)
            return default if value is None else value
        return self.extra.get(key, default)

    def to_json(self) -> dict[str, Any]:
        """The row as the file holds it: its keys in the order read (a null kept a null), then any set since."""
        out: dict[str, Any] = {}
        if self.kind and "kind" not in self.keys:
            out["kind"] = self.kind
        for key in self.keys:
            if key in _TYPED:
                out[key] = getattr(self, key)
            elif key in self.extra:
                out[key] = self.extra[key]
        out.update({k: getattr(self, k) for k in _TYPED if k not in out and getattr(self, k) is not None})
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out


_TYPED = {f.name: f.type for f in fields(MetricsRow) if f.name not in ("extra", "keys")}
_INTS = {"step", "tokens", "seq_len", "max_steps"}
_STRS = {"kind", "event", "reason"}


def whole_number(value: Any, default: int | None = None) -> int | None:
    """A step or count read from a file: an int (or an integral float) of sane size, else ``default``."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value if abs(value) < 1 << 62 else default
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 62:
        return int(value)
    return default


def finite_number(value: Any) -> float | None:
    """A loss or price read from a file: a finite int or float, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def parse_row(obj: Any) -> MetricsRow | None:
    """The typed row of a decoded JSON value, or None when it cannot be one. Never raises."""
    try:
        return _parse(obj)
    except Exception:  # noqa: BLE001 - a pod's row is untrusted: a bad one is skipped, never fatal
        return None


def _parse(obj: Any) -> MetricsRow | None:
    if not isinstance(obj, Mapping) or not isinstance(obj.get("kind", ""), str):
        return None
    typed: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    keys: list[str] = []
    for key, value in obj.items():
        if not isinstance(key, str):
            continue
        keys.append(key)
        if key not in _TYPED:
            extra[key] = value
            continue
        if value is None:
            continue
        if key in _STRS:
            typed[key] = value if isinstance(value, str) else json.dumps(value, default=str)[:80]
        elif key == "step":
            step = whole_number(value)
            typed[key] = step if step is not None and step >= 0 else None
        elif key in _INTS:
            typed[key] = whole_number(value)
        else:
            typed[key] = finite_number(value)
    if typed.get("kind") in STEPPED and typed.get("step") is None:
        return None
    return MetricsRow(**typed, extra=extra, keys=tuple(keys))


def as_rows(rows: Iterable[Mapping[str, Any] | MetricsRow]) -> list[MetricsRow]:
    """Rows as typed ones: a mapping is parsed, one that cannot be a row is skipped (never an error)."""
    out = []
    for row in rows:
        typed = row if isinstance(row, MetricsRow) else parse_row(row)
        if typed is not None:
            out.append(typed)
    return out


def parse_line(line: bytes | str) -> MetricsRow | None:
    """One line of metrics.jsonl as a row; None for a blank, torn, oversized or malformed line."""
    try:
        if len(line) > MAX_ROW_BYTES or not line.strip():
            return None
        return parse_row(json.loads(line))
    except (ValueError, TypeError, RecursionError):
        return None


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they are written as null (a reader still sees the row)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def encode(row: Mapping[str, Any]) -> str:
    """The line the trainer appends for ``row`` (no newline): written through :class:`MetricsRow`, so
    what is written is what :func:`parse_line` reads; the time is added when the row has none."""
    cleaned = {k: _clean(v) for k, v in row.items()}
    cleaned.setdefault("time", time.time())
    typed = parse_row(cleaned)
    return json.dumps(typed.to_json() if typed is not None else cleaned)
