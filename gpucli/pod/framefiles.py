"""Metrics from the files training frameworks write (standard library only).

What a framework records is more exact than what it prints: the step is its own, and nothing is lost
to progress-bar redraws. ``jobrun.py`` scans the code folder (and ``--logdir``) for these files, written
since the job started, and reads what each gained since the last look:

- **TensorBoard event files** (``events.out.tfevents.*``: the Hugging Face Trainer's ``runs/``,
  Lightning's ``TensorBoardLogger``, anything on ``torch.utils.tensorboard`` or ``tensorboardX``):
  TFRecord framing (a little-endian u64 length, a u32 CRC, the bytes, a u32 CRC) around ``Event``
  protobufs, read here with a small protobuf decoder (``Event.step`` = 2, ``Event.summary`` = 5,
  ``Summary.value`` = 1, ``Value.tag`` = 1, ``Value.simple_value`` = 2, ``Value.tensor`` = 8,
  ``TensorProto.dtype`` = 1, ``tensor_content`` = 4, ``float_val`` = 5, ``double_val`` = 6; field numbers
  from tensorboard's ``event.proto``, ``summary.proto`` and ``tensor.proto``). A record cut at the end
  of the file is read once it is complete.
- **Hugging Face ``trainer_state.json``** (in each ``checkpoint-N/`` and, after ``save_state()``, the
  output folder): ``log_history`` entries with ``step`` and ``loss`` or ``eval_loss``.
- **Lightning's ``CSVLogger``** ``metrics.csv`` (``step`` column and one column a logged name).

Each source turns into rows of the trainer's format with ``source`` set to ``tensorboard``,
``trainer_state`` or ``csv``; steps are the framework's optimizer steps done when the value was
measured, the count its checkpoints carry (:class:`StepKeying`: Lightning's 0-based logger step, LitGPT's
micro-batch iteration).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import struct
import time
from pathlib import Path
from typing import Any

Row = dict[str, Any]

TRAIN_TAGS = ("train/loss", "loss", "train_loss", "train_loss_step", "train/loss_step", "loss/train",
              "Loss/train", "train/lm_loss", "training_loss")
VAL_TAGS = ("eval/loss", "val_loss", "val/loss", "eval_loss", "validation/loss", "valid/loss", "loss/val",
            "Loss/val", "Loss/validation", "val_loss_epoch", "eval/val_loss")
BPB_TAGS = ("val/bpb", "val_bpb", "eval/bpb")
EXTRA_TAGS = {"train/learning_rate": "lr", "learning_rate": "lr", "lr": "lr", "train/lr": "lr",
              "train/grad_norm": "grad_norm", "grad_norm": "grad_norm", "train/epoch": "epoch", "epoch": "epoch"}
SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "wandb", "venv", "env", ".git"}
MAX_ENTRIES = 20000  # a scan looks at this many names at most (a code folder holding a dataset)
MAX_DEPTH = 8


# ---- protobuf, the little that Event needs -------------------------------------------------------


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of a protobuf message: ints for varints, bytes otherwise."""
    out, i, n = [], 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.append((num, wire, value))
    return out


def _tensor_value(buf: bytes) -> float | None:
    dtype, values = 0, []
    content = b""
    for num, wire, value in fields(buf):
        if num == 1 and wire == 0:
            dtype = value
        elif num == 4 and wire == 2:
            content = value
        elif num == 5:
            values += list(struct.unpack(f"<{len(value) // 4}f", value)) if wire in (2, 5) else []
        elif num == 6:
            values += list(struct.unpack(f"<{len(value) // 8}d", value)) if wire in (1, 2) else []
    if not values and content:
        if dtype == 1 and len(content) >= 4:
            values = [struct.unpack("<f", content[:4])[0]]
        elif dtype == 2 and len(content) >= 8:
            values = [struct.unpack("<d", content[:8])[0]]
    return float(values[0]) if len(values) == 1 else None


def event_scalars(record: bytes) -> tuple[int | None, dict[str, float], float | None]:
    """(step, {tag: value}, wall time) of one Event's scalar summaries."""
    step: int | None = None
    wall: float | None = None
    scalars: dict[str, float] = {}
    for num, wire, value in fields(record):
        if num == 1 and wire == 1:
            wall = struct.unpack("<d", value)[0]
        elif num == 2 and wire == 0:
            step = value if value < (1 << 63) else value - (1 << 64)
        elif num == 5 and wire == 2:
            for vnum, vwire, item in fields(value):
                if vnum != 1 or vwire != 2:
                    continue
                tag, number = None, None
                for fnum, fwire, f in fields(item):
                    if fnum == 1 and fwire == 2:
                        tag = f.decode("utf-8", "replace")
                    elif fnum == 2 and fwire == 5:
                        number = struct.unpack("<f", f)[0]
                    elif fnum == 8 and fwire == 2:
                        number = _tensor_value(f)
                if tag is not None and number is not None and math.isfinite(number):
                    scalars[tag] = number
    return step, scalars, wall


def scalar_rows(step: int, scalars: dict[str, float]) -> list[Row]:
    """Train/val rows from one step's scalars (by the tags frameworks use)."""
    rows: list[Row] = []
    loss = next((scalars[t] for t in TRAIN_TAGS if t in scalars), None)
    if loss is not None:
        row: Row = {"kind": "train", "step": step, "loss": loss}
        for tag, name in EXTRA_TAGS.items():
            if tag in scalars and name not in row:
                row[name] = scalars[tag]
        rows.append(row)
    val = next((scalars[t] for t in VAL_TAGS if t in scalars), None)
    bpb = next((scalars[t] for t in BPB_TAGS if t in scalars), None)
    if val is not None or bpb is not None:
        vrow: Row = {"kind": "val", "step": step}
        if val is not None:
            vrow["val_loss"] = val
        if bpb is not None:
            vrow["val_bpb"] = bpb
        rows.append(vrow)
    return rows


# ---- the readers -----------------------------------------------------------------------------------


class EventFile:
    """One TensorBoard event file, read from where the last read stopped."""

    source = "tensorboard"

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.step: int | None = None
        self.wall: float | None = None
        self.scalars: dict[str, float] = {}
        self.keying = StepKeying(lightning_folder(path))

    def _flush(self) -> list[Row]:
        step = self.keying.step(self.step, self.scalars) if self.step is not None else None
        rows = scalar_rows(step, self.scalars) if step is not None else []
        for row in rows:
            if self.wall is not None:
                row["logged_at"] = self.wall  # when the framework wrote it (the event's wall_time)
        self.scalars = {}
        return rows

    def poll(self) -> list[Row]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(8 << 20)
        except OSError:
            return []
        rows: list[Row] = []
        i = 0
        while len(data) - i >= 12:
            (size,) = struct.unpack_from("<Q", data, i)
            if size > 64 << 20:  # not an event file (or a corrupt one): stop reading it
                self.offset = 1 << 62
                return rows
            end = i + 12 + size + 4
            if end > len(data):
                break
            try:
                step, scalars, wall = event_scalars(data[i + 12:i + 12 + size])
            except (ValueError, IndexError, struct.error):
                step, scalars, wall = None, {}, None
            i = end
            if step is None or not scalars:
                continue
            if step != self.step:
                rows += self._flush()
                self.step = step
            self.scalars.update(scalars)
            self.wall = wall
        self.offset += i
        if len(data) - i < 12 or i == 0:  # everything complete was read: the step's values are in
            rows += self._flush()
        return rows


def lightning_folder(path: Path) -> bool:
    """Whether a logger file sits where Lightning's loggers put theirs: ``<save_dir>/<name>/version_N/``."""
    return path.parent.name.startswith("version_") and path.parent.name[8:].isdigit()


class StepKeying:
    """The framework's optimizer step of a logged row, from the step the logger was given:

    - LitGPT's ``pretrain`` logs with ``fabric.log_dict(metrics, step=state["iter_num"] - 1)``, the
      micro-batch iteration less one, and puts ``iter`` (= ``iter_num``) and ``step`` (= ``step_count``,
      the optimizer step) in the train metrics (``litgpt/pretrain.py``, ``fit``). A train row takes its
      ``step`` value; the validation rows carry neither and are logged at ``iter_num - 1`` after an
      optimizer step (``iter_num`` a multiple of the accumulation), or at ``iter_num`` for the final
      one: they are moved by the iterations per step the train rows showed. In a CSV the logger
      overwrites the ``step`` column with its own (``lightning/fabric/loggers/csv_logs.py``,
      ``log_metrics``), so the optimizer step is not in the file: such a file is not read (the console
      line ``iter 160 step 80 | loss train: ...`` is).
    - Lightning's ``Trainer`` logs at ``_batches_that_stepped`` before its increment (0-based: the loss
      of the first step at 0, the last of 160 steps at 159, while the checkpoint is ``step=160``): one
      is added, so the step is the optimizer steps done when it was measured, as Hugging Face and the
      checkpoints count.
    """

    def __init__(self, lightning: bool) -> None:
        self.lightning = lightning
        self.per_step: int | None = None  # micro-batch iterations per optimizer step (LitGPT)
        self.by_iteration = False

    def step(self, logged: int, scalars: dict[str, float]) -> int | None:
        it, own = scalars.get("iter"), scalars.get("step")
        if it is not None and int(it) == logged + 1:
            self.by_iteration = True
            if own is not None and own >= 1 and it >= own and it == int(it) and own == int(own):
                self.per_step = max(1, int(it) // int(own))
                return int(own)
            return None
        if self.by_iteration:
            if self.per_step is None:
                return None
            after = logged + 1
            return after // self.per_step if after % self.per_step == 0 else logged // self.per_step
        return logged + 1 if self.lightning else logged


class _ChangedFile:
    """A file read whole again each time its size or mtime changes (a framework rewrites it in place)."""

    def __init__(self, path: Path) -> None:
        self.path, self.stamp = path, (0, 0.0)

    def changed_text(self) -> str | None:
        """The file's text when it changed since the last read, else None (or unreadable now)."""
        try:
            st = self.path.stat()
            if (st.st_size, st.st_mtime) == self.stamp:
                return None
            text = self.path.read_text(errors="replace")
        except OSError:
            return None
        self.stamp = (st.st_size, st.st_mtime)
        return text


class TrainerState(_ChangedFile):
    """A Hugging Face ``trainer_state.json``: its ``log_history``, read again when it changes."""

    source = "trainer_state"

    def poll(self) -> list[Row]:
        text = self.changed_text()
        if text is None:
            return []
        try:
            data = json.loads(text)
        except ValueError:
            self.stamp = (0, 0.0)  # being written: the next look reads it whole
            return []
        rows: list[Row] = []
        for entry in data.get("log_history") or [] if isinstance(data, dict) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
                continue
            if isinstance(entry.get("loss"), (int, float)):
                row: Row = {"kind": "train", "step": entry["step"], "loss": float(entry["loss"])}
                for key, name in (("learning_rate", "lr"), ("grad_norm", "grad_norm"), ("epoch", "epoch")):
                    if isinstance(entry.get(key), (int, float)):
                        row[name] = float(entry[key])
                rows.append(row)
            if isinstance(entry.get("eval_loss"), (int, float)):
                rows.append({"kind": "val", "step": entry["step"], "val_loss": float(entry["eval_loss"])})
        return rows


class CsvMetrics(_ChangedFile):
    """Lightning's ``metrics.csv`` (``step`` plus a column per logged name), read again when it changes."""

    source = "csv"

    def poll(self) -> list[Row]:
        text = self.changed_text()
        if text is None:
            return []
        if not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]
        rows: list[Row] = []
        keying = StepKeying(lightning_folder(self.path))  # the file is read whole: its keying too
        for rec in csv.DictReader(io.StringIO(text)):
            try:
                step = int(float(rec.get("step") or ""))
            except ValueError:
                continue
            scalars = {}
            for key, value in rec.items():
                try:
                    scalars[key] = float(value) if value not in (None, "") else math.nan
                except (TypeError, ValueError):
                    continue
            found = {k: v for k, v in scalars.items() if math.isfinite(v) and k != "step"}
            own = keying.step(step, found)
            if keying.by_iteration:
                return []  # keyed by the iteration, its optimizer step overwritten: see StepKeying
            if own is not None:
                rows += scalar_rows(own, found)
        return rows


def reader_for(path: Path) -> EventFile | TrainerState | CsvMetrics | None:
    name = path.name
    if name.startswith("events.out.tfevents."):
        return EventFile(path)
    if name == "trainer_state.json":
        return TrainerState(path)
    if name == "metrics.csv":
        try:
            with open(path, errors="replace") as fh:
                header = fh.readline()
        except OSError:
            return None
        return CsvMetrics(path) if "step" in header.strip().split(",") else None
    return None


class FrameworkFiles:
    """The framework files under ``roots`` written since ``since``: :meth:`poll` returns their new rows
    (each with its ``source``). The folders are walked again every ``scan_s``."""

    def __init__(self, roots: list[Path], since: float, scan_s: float = 2.0) -> None:
        self.roots, self.since, self.scan_s = roots, since, scan_s
        self.readers: dict[Path, Any] = {}
        self.last_scan = -math.inf

    def _walk(self) -> None:
        seen = 0
        stack = [(root, 0) for root in self.roots]
        while stack and seen < MAX_ENTRIES:
            folder, depth = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                seen += 1
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if depth < MAX_DEPTH and not entry.name.startswith(".") and entry.name not in SKIP_DIRS:
                            stack.append((Path(entry.path), depth + 1))
                        continue
                    path = Path(entry.path)
                    if path in self.readers or entry.stat().st_mtime < self.since:
                        continue
                except OSError:
                    continue
                reader = reader_for(path)
                if reader is not None:
                    self.readers[path] = reader

    def poll(self, now: float | None = None) -> list[Row]:
        now = time.monotonic() if now is None else now
        if now - self.last_scan >= self.scan_s:
            self.last_scan = now
            self._walk()
        rows: list[Row] = []
        for reader in list(self.readers.values()):
            for row in reader.poll():
                row["source"] = reader.source
                rows.append(row)
        return rows


class Merge:
    """One row per (kind, step) from all sources. Rows whose step gpucli worked out from a progress bar
    (``_held``) wait ``hold_s``. The framework's own files are its record, but a framework writes them
    seldom (a Hugging Face ``trainer_state.json`` only at a checkpoint, Lightning's CSV every 100 steps):
    a console row of a kind goes out while it is ahead of the files' last step of that kind, so the
    live loss keeps moving between writes; one at or behind it is dropped (the files have that stretch),
    and a file row of a step the console already gave is the same measurement, dropped as well."""

    def __init__(self, hold_s: float = 2.0) -> None:
        self.hold_s = hold_s
        self.seen: set[tuple[str, int]] = set()
        self.file_step: dict[str, int] = {}  # kind -> the last step the framework's files gave
        self.held: list[tuple[float, Row]] = []

    def _behind_files(self, row: Row) -> bool:
        last = self.file_step.get(str(row.get("kind")))
        step = row.get("step")
        return last is not None and isinstance(step, int) and step <= last

    def _take(self, row: Row) -> list[Row]:
        key = (str(row.get("kind")), row.get("step"))
        if row.get("kind") in ("train", "val"):
            if key in self.seen:  # type: ignore[comparison-overlap]
                return []
            self.seen.add(key)  # type: ignore[arg-type]
        return [row]

    def add(self, rows: list[Row], now: float) -> list[Row]:
        out: list[Row] = []
        for row in rows:
            held = row.pop("_held", False)
            source = row.setdefault("source", "console")
            kind = row.get("kind")
            if source in ("tensorboard", "trainer_state", "csv") and kind in ("train", "val"):
                if isinstance(row.get("step"), int):
                    self.file_step[kind] = max(self.file_step.get(kind, row["step"]), row["step"])
                self.held = [(t, r) for t, r in self.held if not self._behind_files(r)]
            elif kind in ("train", "val") and self._behind_files(row):
                continue
            elif held:
                self.held.append((now, row))
                continue
            out += self._take(row)
        return out

    def due(self, now: float, final: bool = False) -> list[Row]:
        """Held rows whose wait is over (all of them at the end)."""
        out: list[Row] = []
        keep = []
        for t, row in self.held:
            if self._behind_files(row):
                continue
            if final or now - t >= self.hold_s:
                out += self._take(row)
            else:
                keep.append((t, row))
        self.held = keep
        return out
