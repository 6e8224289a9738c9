"""Metrics rows from the console output of a training command gpucli did not write (standard library only).

``jobrun.py`` feeds every console line of the user's command to :class:`LogParser`; what it returns are
rows in the format the bundled trainer writes to ``metrics.jsonl`` (``trainer/watch/metrics.py``), so
``gpucli tail`` and ``status`` read them unchanged:

- ``{"kind": "train", "step": int, "loss": float, "lr"?, "tok_per_s"?, "mfu"? (a fraction), ...}``
- ``{"kind": "val", "step": int, "val_loss": float}`` (nanochat: ``val_bpb`` instead of ``val_loss``)

The formats, as the projects print them (read in their sources):

- nanoGPT ``train.py``: ``iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%``
  and, at each eval, ``step {iter_num}: train loss {..:.4f}, val loss {..:.4f}``. Its ``running_mfu`` starts at
  -1 (``mfu -100.00%`` for the first iterations): a negative MFU is no measurement and is left out.
- nanochat ``scripts/base_train.py``: ``step {step:05d}/{num_iterations:05d} ({pct:.2f}%) | loss: {..:.6f} |
  lrm: {..:.2f} | dt: {..:.2f}ms | tok/sec: {tok_per_sec:,} | mfu: {mfu:.2f} | epoch: .. | total time: ..m``
  (mfu is already a percentage there; ``lrm`` is an LR multiplier, kept as ``lrm``, not ``lr``), and
  ``Step {step:05d} | Validation bpb: {val_bpb:.6f}`` for validation.
- Hugging Face ``Trainer``: ``ProgressCallback.on_log`` writes ``str(logs)`` above its tqdm bar:
  ``{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}`` (recent versions format the
  floats as strings: ``{'loss': '2.31', ...}``), ``{'eval_loss': ...}`` after an evaluation, and a final
  ``{'train_runtime': ..., 'train_loss': ...}`` summary (not a step, skipped). That dict carries no step
  (``Trainer.log`` adds ``step`` only to ``state.log_history``). So the step is taken from the training
  tqdm bar, whose count is ``state.global_step`` (``on_step_end`` updates it by ``global_step -
  current_step``): the first bar seen without a description fixes the training bar's total, and later
  bar lines with that total give the step. Without any bar (``disable_tqdm=True``) the step is the
  number of loss rows logged so far (1, 2, 3, ...: a log index, not the optimizer step).
- PyTorch Lightning's ``TQDMProgressBar``: the training bar's description is ``Epoch {current_epoch}``,
  its count ``batch_idx + 1`` and its postfix ``get_metrics()``: ``v_num=0`` plus whatever was logged with
  ``prog_bar=True`` (``loss=`` in older versions, ``train_loss=``, ``train_loss_step=``, ``val_loss=``).
  The step is batches since the start: the batches of the finished epochs (the bar's total, or the
  last count seen when the total is unknown) plus the count (optimizer steps differ from it with
  ``accumulate_grad_batches``). A train row is made when the step moves; a val row when ``val_loss``
  in the postfix changes. ``Validation DataLoader 0`` bars are not training progress and are skipped.
- LitGPT ``pretrain`` (``litgpt/pretrain.py``, ``fit``): ``Epoch {e} | iter {iter_num} step {step_count} |
  loss train: {loss:.3f}, val: {val} | iter time: {ms:.2f} ms ...``, ``iter {iter_num}: val loss
  {val:.4f}, val time: ..`` after an optimizer step, and ``Final evaluation | val loss: {val:.3f} | ...``.
  The step is ``step_count``, the optimizer step its ``step-NNNNNNNN`` checkpoints carry; a validation
  line names the iteration, moved to its step by the iterations per step the train lines showed.
- Any JSON object line with a step (``step``, ``iter``, ``iteration`` or ``global_step``) and a loss
  (``loss``, ``train_loss``, ``train/loss``) or validation loss (``val_loss``, ``val/loss``,
  ``eval_loss``); a line that already is a ``kind`` row of the trainer's format is passed through.
- A user regex (``--metrics-regex``) with named groups ``step`` and ``loss`` and/or ``val_loss``
  (optional ``lr``, ``tok_per_s``, ``mfu``), tried before the built-in formats.

Console output arrives in chunks with tqdm's carriage-return updates: :func:`split_lines` cuts on
``\\n`` and ``\\r`` both.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections import deque
from typing import Any

Row = dict[str, Any]

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf"

# nanoGPT train.py
_NANOGPT_ITER = re.compile(
    rf"^iter (?P<step>\d+): loss (?P<loss>{_NUM})(?:, time (?P<ms>{_NUM})ms)?(?:, mfu (?P<mfu>{_NUM})%)?")
_NANOGPT_EVAL = re.compile(rf"^step (?P<step>\d+): train loss (?P<loss>{_NUM}), val loss (?P<val>{_NUM})")
# nanochat scripts/base_train.py
_NANOCHAT_STEP = re.compile(rf"^step (?P<step>\d+)/(?P<total>\d+) \((?P<pct>{_NUM})%\) \| loss: (?P<loss>{_NUM})")
# (recent versions print "bf16_mfu: 47.31" and "epoch: 1 pq: 3 rg: 7")
_NANOCHAT_FIELD = re.compile(r"\|\s*(?P<key>lrm|dt|tok/sec|(?:[a-z0-9]+_)?mfu|epoch):\s*(?P<val>[-+0-9.,eE]+)")
_NANOCHAT_VAL = re.compile(rf"^Step (?P<step>\d+) \| Validation bpb: (?P<bpb>{_NUM})")
# LitGPT litgpt/pretrain.py
_LITGPT_TRAIN = re.compile(rf"^Epoch \d+ \| iter (?P<iter>\d+) step (?P<step>\d+) \| loss train: (?P<loss>{_NUM})"
                           rf"(?:.*?\| iter time: (?P<ms>{_NUM}) ms)?")
_LITGPT_VAL = re.compile(rf"^iter (?P<iter>\d+): val loss (?P<val>{_NUM}), val time")
_LITGPT_FINAL = re.compile(rf"^Final evaluation \| val loss: (?P<val>{_NUM})")
# tqdm: "[desc: ]NN%|bar| n/total [elapsed<remaining, rate, k=v, ...]" (total "?" when unknown)
_TQDM = re.compile(r"^(?:(?P<desc>[^|]*?):\s*)?(?:(?P<pct>\d+)%\|[^|]*\|\s*)?(?P<n>\d+)/(?P<total>\d+|\?)\s*"
                   r"\[(?P<inside>[^\]]*)\]")
_LIGHTNING_EPOCH = re.compile(r"^Epoch (?P<epoch>\d+)$")
_KV = re.compile(rf"(?P<key>[A-Za-z_][\w/.]*)=(?P<val>{_NUM})(?=[,\s\]]|$)")
# Lightning's RichProgressBar: "Epoch 3/3  ━━━━━━ 8/8 0:00:00 • 0:00:00 21.91it/s v_num: 0 train_loss: 2.952"
# (metrics that do not fit go on the lines below: "   val_loss: 2.340")
_RICH_EPOCH = re.compile(r"^Epoch (?P<epoch>\d+)(?:/(?:\d+|\?))?\s+[━╸╺╾╼─\-\s]*?(?P<n>\d+)/(?P<total>\d+|\?)\b(?P<rest>.*)$")
_RICH_KV = re.compile(rf"(?P<key>[A-Za-z_][\w/.]*):\s*(?P<val>{_NUM})(?=\s|$)")
_RICH_MORE = re.compile(rf"^(?:[A-Za-z_][\w/.]*:\s*(?:{_NUM})\s*)+$")
# Hugging Face Trainer's str(logs): a Python dict repr, values numbers or formatted numbers
_HF_PAIR = re.compile(rf"'(?P<key>[^']+)':\s*(?:'(?P<q>{_NUM})'|(?:tensor\(|np\.float\d*\()?(?P<v>{_NUM}))")

_STEP_KEYS = ("step", "iter", "iteration", "global_step")
_LOSS_KEYS = ("loss", "train_loss", "train/loss")
_VAL_KEYS = ("val_loss", "val/loss", "eval_loss")
_EXTRA = {"lr": "lr", "learning_rate": "lr", "tok_per_s": "tok_per_s", "tokens_per_s": "tok_per_s",
          "tok/s": "tok_per_s", "mfu": "mfu", "grad_norm": "grad_norm", "epoch": "epoch", "val_bpb": "val_bpb"}


def split_lines(buffer: str) -> tuple[list[str], str]:
    """Complete lines of ``buffer`` (cut at ``\\n`` or ``\\r``) and the unfinished rest."""
    parts = re.split(r"\r\n|\r|\n", buffer)
    rest = parts.pop()
    return [p for p in parts if p.strip()], rest


def _float(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _num(value: Any) -> float | None:
    """A finite number from a JSON value (numbers, or numbers written as strings); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        return _float(value.strip())
    return None


def _step(value: Any) -> int | None:
    v = _num(value)
    return int(v) if v is not None and v >= 0 and v == int(v) else None


def normalize_json_row(obj: Any) -> list[Row]:
    """Rows from one JSON object (a console line or a line of ``$GPUCLI_METRICS``); [] if it has no step
    and loss. A row already in the trainer's format (``kind`` train/val/event) is kept as it is."""
    if not isinstance(obj, dict):
        return []
    if obj.get("kind") in ("train", "val", "event"):
        if obj["kind"] != "event" and _step(obj.get("step")) is None:
            return []
        return [dict(obj)]
    step = next((s for k in _STEP_KEYS if (s := _step(obj.get(k))) is not None), None)
    if step is None:
        return []
    rows: list[Row] = []
    loss = next((v for k in _LOSS_KEYS if (v := _num(obj.get(k))) is not None), None)
    if loss is not None:
        row: Row = {"kind": "train", "step": step, "loss": loss}
        for key, name in _EXTRA.items():
            v = _num(obj.get(key))
            if v is not None and name not in row and name != "val_bpb":
                row[name] = v
        rows.append(row)
    val = next((v for k in _VAL_KEYS if (v := _num(obj.get(k))) is not None), None)
    if val is not None:
        rows.append({"kind": "val", "step": step, "val_loss": val})
    return rows


def compile_metrics_regex(pattern: str) -> re.Pattern[str]:
    """The user's ``--metrics-regex``: it must compile and name ``step`` and ``loss`` or ``val_loss``."""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"--metrics-regex does not compile: {exc}") from exc
    groups = set(rx.groupindex)
    if "step" not in groups or not ({"loss", "val_loss"} & groups):
        raise ValueError("--metrics-regex needs named groups (?P<step>...) and (?P<loss>...) or (?P<val_loss>...)")
    return rx


class LogParser:
    """Feed console lines in order; each :meth:`feed` returns the metrics rows that line completes.

    Stateful for the formats whose step is not on the line itself (Hugging Face, Lightning)."""

    def __init__(self, metrics_regex: str | None = None) -> None:
        self.user_rx = compile_metrics_regex(metrics_regex) if metrics_regex else None
        self.hf_rows = 0  # loss rows of a Hugging Face Trainer seen so far
        self.hf_total: str | None = None  # the total of the HF training bar, once one is seen
        self.hf_step: int | None = None
        self.pl_epoch: int | None = None
        self.pl_offset = 0  # batches of the finished Lightning epochs
        self.pl_last_n = 0
        self.pl_total: int | None = None
        self.pl_step: int | None = None
        self.pl_step_now: int | None = None
        self.pl_held: Row | None = None  # the Lightning train row of the count the bar shows now
        self.pl_val: float | None = None
        self.hf_pending: list[Row] = []  # HF rows waiting for the bar redraw that carries their step
        self.rich_bar = False  # the last line was Lightning's rich bar: "key: value" lines below are its
        self.lit_per_step: int | None = None  # LitGPT's micro-batch iterations per optimizer step
        self.lit_step: int | None = None

    def feed(self, line: str) -> list[Row]:
        text = line.strip()
        if not text:
            return []
        rows: list[dict[str, Any]] | None
        if self.user_rx is not None:
            rows = self._user(text)
            if rows:
                return rows
        rich, self.rich_bar = self.rich_bar, False
        if rich and _RICH_MORE.match(text):
            self.rich_bar = True
            return self._lightning_metrics(self.pl_step_now, _rich_metrics(text), self.pl_epoch or 0)
        for parse in (self._litgpt, self._nanogpt, self._nanochat, self._json, self._hf_dict, self._tqdm, self._rich):
            rows = parse(text)
            if rows is not None:
                return rows
        return []

    def flush(self) -> list[Row]:
        """Rows still held back at the end of the output (a Hugging Face log line with no bar after it)."""
        rows, self.hf_pending = self.hf_pending, []
        for row in rows:
            row["step"] = self.hf_step if self.hf_step is not None else row["step"]
        if self.pl_held is not None:
            rows.append(self.pl_held)
            self.pl_held = None
        return rows

    # -- formats: each returns None when the line is not its format, else the rows (maybe []) -------

    def _user(self, text: str) -> list[Row]:
        assert self.user_rx is not None
        m = self.user_rx.search(text)
        if not m:
            return []
        found = {k: v for k, v in m.groupdict().items() if v is not None}
        step = _step(found.get("step"))
        if step is None:
            return []
        rows: list[Row] = []
        loss = _float(found.get("loss"))
        if loss is not None:
            row: Row = {"kind": "train", "step": step, "loss": loss}
            for key in ("lr", "tok_per_s", "mfu"):
                if (v := _float(found.get(key))) is not None:
                    row[key] = v
            rows.append(row)
        val = _float(found.get("val_loss"))
        if val is not None:
            rows.append({"kind": "val", "step": step, "val_loss": val})
        return rows

    def _nanogpt(self, text: str) -> list[Row] | None:
        m = _NANOGPT_ITER.match(text)
        if m:
            loss = _float(m["loss"])
            if loss is None:
                return []
            row: Row = {"kind": "train", "step": int(m["step"]), "loss": loss}
            mfu = _float(m["mfu"])
            if mfu is not None and mfu >= 0:
                row["mfu"] = mfu / 100
            ms = _float(m["ms"])
            if ms is not None:
                row["dt_ms"] = ms
            return [row]
        m = _NANOGPT_EVAL.match(text)
        if m:
            val, train = _float(m["val"]), _float(m["loss"])
            if val is None:
                return []
            row = {"kind": "val", "step": int(m["step"]), "val_loss": val}
            return [row if train is None else {**row, "train_loss": train}]
        return None

    def _litgpt(self, text: str) -> list[Row] | None:
        m = _LITGPT_TRAIN.match(text)
        if m:
            it, step, loss = int(m["iter"]), int(m["step"]), _float(m["loss"])
            if step > 0:
                self.lit_per_step = max(1, it // step)
            self.lit_step = step
            if loss is None or step == 0:
                return []  # step 0: still accumulating the first step's micro-batches
            row: Row = {"kind": "train", "step": step, "loss": loss}
            ms = _float(m["ms"])
            if ms is not None:
                row["dt_ms"] = ms
            return [row]
        m = _LITGPT_VAL.match(text)
        if m:
            val = _float(m["val"])
            if val is None or self.lit_per_step is None:
                return []
            return [{"kind": "val", "step": int(m["iter"]) // self.lit_per_step, "val_loss": val}]
        m = _LITGPT_FINAL.match(text)
        if m:
            val = _float(m["val"])
            return [] if val is None or self.lit_step is None else [
                {"kind": "val", "step": self.lit_step, "val_loss": val}]
        return None

    def _nanochat(self, text: str) -> list[Row] | None:
        m = _NANOCHAT_STEP.match(text)
        if m:
            loss = _float(m["loss"])
            if loss is None:
                return []
            row: Row = {"kind": "train", "step": int(m["step"]), "loss": loss, "max_steps": int(m["total"])}
            for f in _NANOCHAT_FIELD.finditer(text):
                v = _float(f["val"])
                if v is None:
                    continue
                key = f["key"]
                if key == "tok/sec":
                    row["tok_per_s"] = v
                elif key.endswith("mfu"):
                    row["mfu"] = v / 100
                elif key == "dt":
                    row["dt_ms"] = v
                else:
                    row[key] = v
            return [row]
        m = _NANOCHAT_VAL.match(text)
        if m:
            bpb = _float(m["bpb"])
            return [] if bpb is None else [{"kind": "val", "step": int(m["step"]), "val_bpb": bpb}]
        return None

    def _json(self, text: str) -> list[Row] | None:
        if not (text.startswith("{") and text.endswith("}")):
            return None
        try:
            obj = json.loads(text)
        except ValueError:
            return None  # perhaps a Python dict repr: the Hugging Face parser's turn
        return normalize_json_row(obj)

    def _hf_dict(self, text: str) -> list[Row] | None:
        if not (text.startswith("{'") and text.endswith("}")):
            return None
        values: dict[str, float] = {}
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            values = {str(k): x for k, v in parsed.items() if (x := _num(v)) is not None}
        else:  # tensor(...) or np.float64(...) values: pick the numbers out
            for m in _HF_PAIR.finditer(text):
                v = _float(m["q"] if m["q"] is not None else m["v"])
                if v is not None:
                    values[m["key"]] = v
        rows: list[Row] = []
        if "loss" in values:
            self.hf_rows += 1
        # With a training bar, tqdm.write redraws it right after this line with the step the log is of
        # (the bar drawn before may be stale: tqdm redraws at most every 0.1 s): wait for that redraw.
        step = self.hf_step if self.hf_step is not None else self.hf_rows
        if "loss" in values:
            row: Row = {"kind": "train", "step": step, "loss": values["loss"]}
            for key, name in (("learning_rate", "lr"), ("grad_norm", "grad_norm"), ("epoch", "epoch")):
                if key in values:
                    row[name] = values[key]
            rows.append(row)
        if "eval_loss" in values:
            rows.append({"kind": "val", "step": step, "val_loss": values["eval_loss"]})
        for row in rows:
            row["_held"] = True  # a step gpucli worked out: the framework's own files win over it
        if rows and self.hf_total is not None:
            self.hf_pending.extend(rows)
            return []
        return rows

    def _tqdm(self, text: str) -> list[Row] | None:
        m = _TQDM.match(text)
        if not m:
            return None
        desc = (m["desc"] or "").strip()
        n, total = int(m["n"]), m["total"]
        epoch = _LIGHTNING_EPOCH.match(desc)
        if epoch:
            metrics = {k["key"]: v for k in _KV.finditer(m["inside"]) if (v := _float(k["val"])) is not None}
            return self._lightning(int(epoch["epoch"]), n, None if total == "?" else int(total), metrics)
        if desc:
            return []  # a validation/test/other named bar
        # A bar without a description: Hugging Face's training bar is the first one (eval bars come later).
        if self.hf_total is None:
            self.hf_total = total
        if total == self.hf_total:
            self.hf_step = n
            rows, self.hf_pending = self.hf_pending, []
            for row in rows:
                row["step"] = n
            return rows
        return []

    def _rich(self, text: str) -> list[Row] | None:
        m = _RICH_EPOCH.match(text)
        if not m:
            return None
        self.rich_bar = True
        total = m["total"]
        return self._lightning(int(m["epoch"]), int(m["n"]), None if total == "?" else int(total),
                               _rich_metrics(m["rest"]))

    def _lightning(self, epoch: int, n: int, total: int | None, metrics: dict[str, float]) -> list[Row]:
        if self.pl_epoch is None:
            self.pl_epoch = epoch
        elif epoch != self.pl_epoch:
            self.pl_offset += self.pl_total if self.pl_total else self.pl_last_n
            self.pl_epoch = epoch
        self.pl_last_n, self.pl_total = n, total
        self.pl_step_now = self.pl_offset + n
        return self._lightning_metrics(self.pl_step_now if n > 0 else None, metrics, epoch)

    def _lightning_metrics(self, step: int | None, metrics: dict[str, float], epoch: int) -> list[Row]:
        rows: list[Row] = []
        if step is None:
            return rows
        loss = next((metrics[k] for k in ("loss", "train_loss", "train_loss_step", "train_loss_epoch")
                     if k in metrics), None)
        # The bar is redrawn when its count moves and again when the new loss is logged: the loss a step
        # ended with is the last one drawn at that count, so a train row goes out when the count moves on.
        if step != self.pl_step and self.pl_held is not None:
            rows.append(self.pl_held)
            self.pl_held = None
        if loss is not None:
            self.pl_step = step
            self.pl_held = {"kind": "train", "step": step, "loss": loss, "epoch": float(epoch), "_held": True}
        val = next((metrics[k] for k in ("val_loss", "val_loss_epoch") if k in metrics), None)
        if val is not None and val != self.pl_val:
            self.pl_val = val
            rows.append({"kind": "val", "step": step, "val_loss": val, "_held": True})
        return rows


def _rich_metrics(text: str) -> dict[str, float]:
    return {m["key"]: v for m in _RICH_KV.finditer(text) if (v := _float(m["val"])) is not None}


class LossSpikes:
    """A train loss above ``factor`` x the mean of the last ``window`` losses (the issue's "> 2x rolling
    mean"); the same rule as the bundled trainer's ``SpikeDetector``, applied to the loss itself."""

    def __init__(self, window: int = 20, factor: float = 2.0, min_history: int = 5) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.factor, self.min_history = factor, min_history

    def update(self, loss: float) -> float | None:
        """The rolling mean when ``loss`` is a spike, else None. Spikes do not enter the mean."""
        if not math.isfinite(loss):
            return None
        if len(self.values) >= self.min_history:
            mean = sum(self.values) / len(self.values)
            if mean > 0 and loss > self.factor * mean:
                return mean
        self.values.append(loss)
        return None
