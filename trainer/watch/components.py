"""What sits around the training loop: alerts, cost updates, high-loss provenance and the fault hook.

Each is built once, before the loop, as a real object or a null one with the same methods (the way
nanochat swaps in a do-nothing wandb run when logging is off), so the loop calls them without asking
whether they are on, which rank it is, or what the environment says.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from trainer.data.loader import TokenSplit
from trainer.model.gpt import GPT
from trainer.model.memory import MemoryState, MemoryWatch
from trainer.model.refine import RefineWatch, summarize
from trainer.spec.config import Config, FaultsConfig, expand_env
from trainer.watch.metrics import MetricsLogger, safe_exp
from trainer.watch.notify import Notifier
from trainer.watch.tcf import MemoryTCF
from trainer.watch.webhook import Fanout, WebhookNotifier

# ------------------------------------------------------------------------------------------ alerts


class Alerts(Protocol):
    """The events the loop reports (:class:`trainer.watch.notify.Notifier` sends them to Telegram)."""

    def checkpoint_saved(self, step: int, loss: float | None, ppl: float | None, kind: str | None = None) -> bool: ...
    def validation_complete(self, step: int, val_loss: float, best_val_loss: float | None) -> bool: ...
    def training_complete(self, total_steps: int, final_ppl: float | None, duration_hours: float,
                          reason: str | None = None, cost_usd: float | None = None) -> bool: ...
    def error_occurred(self, error: str, step: int, log_tail: str | None = None) -> bool: ...
    def ppl_spike(self, step: int, ppl: float, avg_ppl: float) -> bool: ...
    def stage_transition(self, stage: int, step: int, seq_len: int | None = None,
                         chunk_size: int | None = None) -> bool: ...
    def cost_update(self, hours_elapsed: float, hourly_rate: float | None) -> bool: ...
    def gate_collapse(self, step: int, layer: int, share: float, detail: str) -> bool: ...
    def static_memory(self, step: int, layer: int, m_std: float, detail: str) -> bool: ...
    def refinement_order(self, step: int, line: str) -> bool: ...
    def close(self, wait_s: float = 5.0) -> None: ...
    def summary(self) -> str | None: ...


class NoAlerts:
    """Alerts off (or not rank 0): every event is dropped here."""

    def checkpoint_saved(self, step: int, loss: float | None, ppl: float | None, kind: str | None = None) -> bool:
        return False

    def validation_complete(self, step: int, val_loss: float, best_val_loss: float | None) -> bool:
        return False

    def training_complete(self, total_steps: int, final_ppl: float | None, duration_hours: float,
                          reason: str | None = None, cost_usd: float | None = None) -> bool:
        return False

    def error_occurred(self, error: str, step: int, log_tail: str | None = None) -> bool:
        return False

    def ppl_spike(self, step: int, ppl: float, avg_ppl: float) -> bool:
        return False

    def stage_transition(self, stage: int, step: int, seq_len: int | None = None,
                         chunk_size: int | None = None) -> bool:
        return False

    def cost_update(self, hours_elapsed: float, hourly_rate: float | None) -> bool:
        return False

    def gate_collapse(self, step: int, layer: int, share: float, detail: str) -> bool:
        return False

    def static_memory(self, step: int, layer: int, m_std: float, detail: str) -> bool:
        return False

    def refinement_order(self, step: int, line: str) -> bool:
        return False

    def close(self, wait_s: float = 5.0) -> None:
        return None

    def summary(self) -> str | None:
        return None


def make_alerts(cfg: Config, master: bool) -> Alerts:
    """Telegram on rank 0 when enabled and a token and chat id are set, and a webhook when one is
    configured (both at once through :class:`trainer.watch.webhook.Fanout`); otherwise :class:`NoAlerts`."""
    tg = cfg.notifications.telegram
    if not master:
        return NoAlerts()
    senders: list[Any] = []
    if tg.enabled:
        n = Notifier(expand_env(tg.bot_token), expand_env(tg.chat_id), enabled=True,
                     events=cfg.notifications.events, timeout_s=tg.timeout_s)
        senders += [n] if n.enabled else []

    hook = WebhookNotifier(expand_env(cfg.notifications.webhook_url), events=cfg.notifications.events,
                           timeout_s=tg.timeout_s)  # $GPUCLI_WEBHOOK_URL when the config names none
    senders += [hook] if hook.enabled else []
    if not senders:
        return NoAlerts()
    return senders[0] if len(senders) == 1 else Fanout(senders)  # type: ignore[return-value]


class CostUpdates:
    """The Atlas 1B build plan's cost update: elapsed hours and $ so far, every ``notifications.cost_update_hours``."""

    def __init__(self, every_h: float, price_per_hour_usd: float | None, alerts: Alerts) -> None:
        self.every_h, self.price, self.alerts = every_h, price_per_hour_usd, alerts
        self.next_h = math.inf

    def start(self, elapsed_s: float) -> None:
        """The next update after ``elapsed_s``: a resumed run does not repeat the one it already sent."""
        self.next_h = (math.floor(elapsed_s / 3600 / self.every_h) + 1) * self.every_h

    def tick(self, elapsed_s: float) -> None:
        hours = elapsed_s / 3600
        if hours >= self.next_h:
            self.alerts.cost_update(hours, self.price)
            self.next_h = (math.floor(hours / self.every_h) + 1) * self.every_h


class NoCostUpdates:
    def start(self, elapsed_s: float) -> None:
        return None

    def tick(self, elapsed_s: float) -> None:
        return None


def make_cost_updates(cfg: Config, alerts: Alerts) -> CostUpdates | NoCostUpdates:
    every = cfg.notifications.cost_update_hours
    if every is None or isinstance(alerts, NoAlerts):
        return NoCostUpdates()
    return CostUpdates(every, cfg.limits.price_per_hour_usd, alerts)


# ------------------------------------------------------------------------------------- high losses


class HighLossLog:
    """Micro-batches whose loss passed ``training.high_loss_threshold``, with the source file and line
    of each sequence, appended to high_loss.jsonl. The losses stay on the device until :meth:`flush`
    (at each log row), so checking them costs one sync per log interval, not one per micro-batch."""

    def __init__(self, threshold: float, split: TokenSplit, rank: int, out_dir: Path) -> None:
        self.threshold, self.split, self.rank = threshold, split, rank
        self.path = out_dir / "high_loss.jsonl"
        self.pending: list[tuple[int, torch.Tensor, np.ndarray]] = []

    def add(self, step: int, loss: torch.Tensor, starts: np.ndarray) -> None:
        self.pending.append((step, loss, starts))

    def flush(self) -> None:
        if not self.pending:
            return
        values = torch.stack([v.float() for _, v, _ in self.pending]).tolist()
        rows = []
        for (step, _, starts), v in zip(self.pending, values, strict=True):
            if v > self.threshold:
                srcs = [f"{f}:{line}" for f, line in (self.split.source(int(s)) for s in starts)]
                rows.append({"step": step, "loss": v, "ppl": safe_exp(v), "rank": self.rank,
                             "sources": srcs, "time": time.time()})
        self.pending.clear()
        if rows:
            # Every rank appends its own lines (each line is one small write, so lines never interleave).
            with open(self.path, "a") as fh:
                for r in rows:
                    fh.write(json.dumps(r) + "\n")


class NoHighLossLog:
    def add(self, step: int, loss: torch.Tensor, starts: np.ndarray) -> None:
        return None

    def flush(self) -> None:
        return None


def make_high_loss_log(cfg: Config, split: TokenSplit, rank: int, out_dir: Path) -> HighLossLog | NoHighLossLog:
    thr = cfg.training.high_loss_threshold
    return NoHighLossLog() if thr is None else HighLossLog(thr, split, rank, out_dir)


# -------------------------------------------------------------------------------------- fault hook


class FaultHook:
    """``faults.*_at_step``: test hooks that make the run fail right after a given step."""

    def __init__(self, faults: FaultsConfig) -> None:
        self.kill_at, self.raise_at, self.hang_at = faults.kill_at_step, faults.raise_at_step, faults.hang_at_step

    def after_step(self, step: int) -> None:
        if self.kill_at and step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.raise_at and step == self.raise_at:
            raise RuntimeError(f"fault injected by faults.raise_at_step at step {step}")
        if self.hang_at and step == self.hang_at:
            while True:  # a wedged collective or data loader, as the watchdog sees it
                time.sleep(3600)


class NoFaults:
    def after_step(self, step: int) -> None:
        return None


def make_fault_hook(faults: FaultsConfig) -> FaultHook | NoFaults:
    if not (faults.kill_at_step or faults.raise_at_step or faults.hang_at_step):
        return NoFaults()
    return FaultHook(faults)


# ------------------------------------------------------------------- memory and refinement watch


class ModelWatch:
    """What a validation reports about the seeds' research models, and the alerts on it.

    Memory (the Atlas 1B build plan §2.1, Appendix A): per layer the gate's mean memory share over the validation
    batches, M_norm, M_std, S_norm and the TCF metrics of M and S from the first batch's final
    state (:class:`trainer.watch.tcf.MemoryTCF`); gate_collapse and static_memory alerts
    (:class:`trainer.model.memory.MemoryWatch`). Refinement (the cloud training guide): each step's mean loss, the order,
    the refinement %; an alert when the order breaks. Each alert is also a metrics event."""

    def __init__(self, cfg: Config, memory: bool, refine: bool, metrics: MetricsLogger, alerts: Alerts,
                 master: bool, log: Callable[[str], None]) -> None:
        m = cfg.training.memory
        self.memory = MemoryWatch(m.gate_collapse_share, m.gate_collapse_validations, m.gate_collapse_drop,
                                  m.static_validations, m.static_tolerance, m.max_norm) if memory else None
        self.tcf = MemoryTCF()
        self.refine = RefineWatch() if refine else None
        self.metrics, self.alerts, self.master, self.log = metrics, alerts, master, log
        self.begin()

    def begin(self) -> None:
        self.shares: torch.Tensor | None = None
        self.refine_sum: torch.Tensor | None = None
        self.n = 0
        self.probe: list[MemoryState] = []

    def after_batch(self, raw: GPT) -> None:
        """Called after each validation forward: what the model left behind."""
        self.n += 1
        if self.memory is not None and raw.gate_shares:
            shares = torch.stack(raw.gate_shares)
            self.shares = shares if self.shares is None else self.shares + shares
            if not self.probe:
                self.probe = list(raw.memory_out)
        if self.refine is not None and raw.refine_losses is not None:
            r = raw.refine_losses
            self.refine_sum = r if self.refine_sum is None else self.refine_sum + r

    def finish(self, step: int, mean: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
        """The validation row's ``memory`` and ``refine`` entries; alerts and events for what started.
        Every rank calls it (the means are collectives); rank 0 reports."""
        row: dict[str, Any] = {}
        if self.memory is not None and self.shares is not None:
            shares = mean(self.shares / self.n).tolist()
            layers = self.tcf.compute([(s.M, s.S) for s in self.probe], shares) if self.master else {}
            if self.master:
                row["memory"] = {k: {n: _finite(v) for n, v in d.items()} for k, d in layers.items()}
                row["memory_gate_mean"] = sum(shares) / len(shares)
                alerts = self.memory.update(shares, [v["M_std"] for v in layers.values()],
                                            [v["M_norm"] for v in layers.values()])
                for a in alerts:
                    self.log(f"step {step} {a.kind} layer {a.layer}: {a.detail}")
                    layer = layers[f"layer_{a.layer:02d}"]
                    self.metrics.event(a.kind, step=step, layer=a.layer, memory_share=layer["gate"],
                                       M_std=layer["M_std"], M_norm=layer["M_norm"], detail=a.detail)
                    if a.kind == "gate_collapse":
                        self.alerts.gate_collapse(step, a.layer, a.value, a.detail)
                    else:
                        self.alerts.static_memory(step, a.layer, a.value, a.detail)
        if self.refine is not None and self.refine_sum is not None:
            summary = summarize(mean(self.refine_sum / self.n).tolist())
            row["refine"] = summary.row()
            if self.master:
                self.log(f"step {step} refinement {summary.line()}")
                if self.refine.update(summary):
                    self.metrics.event("refinement_order", step=step, losses=list(summary.losses),
                                       line=summary.line())
                    self.alerts.refinement_order(step, summary.line())
        self.begin()
        return row

    def state_dict(self) -> dict[str, Any]:
        return {"memory": self.memory.state_dict() if self.memory else None,
                "refine": self.refine.state_dict() if self.refine else None}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        state = state or {}
        if self.memory is not None and state.get("memory"):
            self.memory.load_state_dict(state["memory"])
        if self.refine is not None and state.get("refine"):
            self.refine.load_state_dict(state["refine"])


def _finite(v: Any) -> Any:
    """JSON has no inf or NaN (a collapse beta can be inf): null instead, as MetricsLogger does at the top level."""
    return None if isinstance(v, float) and not math.isfinite(v) else v
