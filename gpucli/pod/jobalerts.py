"""Alerts for a job gpucli does not know, sent from the pod to Telegram and a webhook (standard library only).

``jobrun.py`` loads this file from beside it; the senders are the bundled trainer's ``notify.py`` and
``webhook.py`` (with ``webhooks.py``), uploaded there too.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any


def _load_file(name: str, module_name: str) -> Any:
    path = Path(__file__).resolve().parent / name
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{name} not found beside {__file__}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _load_webhook(notify: Any) -> Any:
    """The bundled trainer's webhook sender (``webhook.py``, with ``webhooks.py``, its payloads), loaded
    from beside this file: its two trainer imports are answered by the files uploaded here, only while
    it loads."""
    hooks = _load_file("webhooks.py", "gpucli_pod_webhooks")
    names = ("trainer.watch.notify", "trainer.spec.webhooks")
    saved = {n: sys.modules.get(n) for n in names}
    sys.modules.update({names[0]: notify, names[1]: hooks})
    try:
        return _load_file("webhook.py", "gpucli_pod_webhook")
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


def load_notifier(env: dict[str, str]) -> Any:
    """The bundled trainer's senders (standard library only, uploaded beside this file): Telegram
    (``notify.py``) when a token and chat are in the environment, the webhook (``webhook.py``) when
    ``GPUCLI_WEBHOOK_URL`` is (the pod's env file, as the trainer reads it), both as one when both
    are; None when neither. Each sends from a thread of its own through a bounded queue, with timeouts
    and bounded retries: a slow or dead endpoint never holds the job up."""
    here = Path(__file__).resolve().parent
    telegram = bool(env.get("TELEGRAM_BOT_TOKEN") and env.get("TELEGRAM_CHAT_ID"))
    hook = (env.get("GPUCLI_WEBHOOK_URL") or "").strip()
    if not (telegram or hook) or not (here / "notify.py").is_file():
        return None
    senders: list[Any] = []
    try:
        notify = _load_file("notify.py", "gpucli_pod_notify")
    except Exception as exc:  # noqa: BLE001 - alerts are optional; the job runs without them
        print(f"jobrun: alerts off ({type(exc).__name__})", file=sys.stderr)
        return None
    if telegram:
        try:
            senders.append(notify.Notifier(env["TELEGRAM_BOT_TOKEN"], env["TELEGRAM_CHAT_ID"],
                                           api_base=env.get("TELEGRAM_API_BASE") or None))
        except Exception as exc:  # noqa: BLE001
            print(f"jobrun: Telegram alerts off ({type(exc).__name__})", file=sys.stderr)
    webhook = None
    if hook and (here / "webhook.py").is_file() and (here / "webhooks.py").is_file():
        try:
            webhook = _load_webhook(notify)
            senders.append(webhook.WebhookNotifier(hook))
        except Exception as exc:  # noqa: BLE001 - the message names the type only: the URL is a secret
            print(f"jobrun: webhook alerts off ({type(exc).__name__})", file=sys.stderr)
    if not senders:
        return None
    return senders[0] if len(senders) == 1 or webhook is None else webhook.Fanout(senders)


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
