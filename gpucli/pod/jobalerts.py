"""Telegram messages for a job gpucli does not know, sent from the pod (standard library only).

``jobrun.py`` loads this file from beside it; the sender is the bundled trainer's ``notify.py``, uploaded
there too when Telegram is set up.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any


def load_notifier(env: dict[str, str]) -> Any:
    """The bundled trainer's Telegram sender (``notify.py``, standard library only, uploaded beside this
    file) when a token and chat are in the environment; None otherwise. It sends from a thread of its
    own with timeouts and bounded retries: a slow or dead API never holds the job up."""
    path = Path(__file__).resolve().parent / "notify.py"
    if not (env.get("TELEGRAM_BOT_TOKEN") and env.get("TELEGRAM_CHAT_ID")) or not path.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location("gpucli_pod_notify", path)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module.Notifier(env["TELEGRAM_BOT_TOKEN"], env["TELEGRAM_CHAT_ID"],
                               api_base=env.get("TELEGRAM_API_BASE") or None)
    except Exception as exc:  # noqa: BLE001 - alerts are optional; the job runs without them
        print(f"jobrun: Telegram alerts off ({type(exc).__name__})", file=sys.stderr)
        return None


# The alert vocabulary, copied from trainer/spec/alerts.py (this file is standard library only and cannot
# import the trainer); tests/gpucli/pod/test_alert_vocabulary.py holds the two equal.
ALERT_EVENTS = ("run_started", "checkpoint_saved", "validation_complete", "training_complete", "error_occurred",
                "ppl_spike", "stage_transition", "cost_update", "gate_collapse", "static_memory", "refinement_order")


class Alerts:
    """Telegram messages for a job gpucli does not know: started, finished, failed (last lines), loss
    spike (``ppl_spike``: the perplexity is the loss's exponential), and a cost update every
    ``cost_every_h`` hours when the price is known. Event names are :data:`ALERT_EVENTS`."""

    def __init__(self, notifier: Any, name: str, price_per_hour: float | None, cost_every_h: float) -> None:
        self.n, self.name, self.price, self.every_h = notifier, name, price_per_hour, cost_every_h
        self.t0 = time.monotonic()
        self.next_cost_h = cost_every_h

    def send(self, text: str, event: str, final: bool = False) -> None:
        if self.n is not None:
            self.n.send(text, event=event, final=final)

    def started(self, cmd: str) -> None:
        self.send(f"*{self.name}*: started\n`{cmd[:300].replace('`', chr(39))}`", "run_started")

    def spike(self, step: Any, loss: float, mean: float) -> None:
        self.send(f"*{self.name}*: loss spike at step {step}: {loss:.4f} (> 2x the rolling mean {mean:.4f})",
                  "ppl_spike")

    def tick(self) -> None:
        if self.n is None or not self.price or self.every_h <= 0:
            return
        hours = (time.monotonic() - self.t0) / 3600
        if hours >= self.next_cost_h:
            self.next_cost_h = hours + self.every_h
            self.n.cost_update(hours, self.price)

    def finished(self, state: str, reason: str, step: Any, loss: Any, tail: list[str]) -> None:
        if self.n is None:
            return
        where = f" at step {step}" + (f", loss {loss:.4f}" if isinstance(loss, float) else "") if step is not None else ""
        if state == "failed":
            self.n.error_occurred(f"{self.name}: {reason}", step if isinstance(step, int) else 0,
                                  log_tail="\n".join(tail[-15:]))
        else:
            self.send(f"*{self.name}*: finished ({reason}){where}", "training_complete", final=True)
        self.n.close(wait_s=10.0)
