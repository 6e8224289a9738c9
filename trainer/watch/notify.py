"""Telegram alerts for training events that can never slow down or crash training.

The run calls one method per event (``checkpoint_saved``, ``ppl_spike``, ...); each formats seed
000's message shape and puts it on a bounded queue, which one daemon thread drains to the Bot API's
``sendMessage``. The training loop therefore never waits on the network:

* every request has a timeout; a failed one is retried a bounded number of times with backoff, and
  an HTTP 429 waits the ``parameters.retry_after`` Telegram asks for (up to ``max_retry_after_s``);
* a full queue drops the new message and counts it (``dropped``) instead of growing;
* a rejected token (401/403/404) turns sending off for the rest of the run after one warning;
* :meth:`Notifier.close` waits at most ``wait_s`` for what is still queued, one try each, the final
  alert (training complete or error) first.

The token is only ever part of the request URL. It is kept in a :class:`Secret` whose ``str`` and
``repr`` are masked, and every text that reaches a log line is passed through :func:`scrub`, because
HTTP libraries put the URL (and so the token) into their exception messages.

Token and chat id default to ``$TELEGRAM_BOT_TOKEN`` / ``$TELEGRAM_CHAT_ID``; the API base defaults to
``$TELEGRAM_API_BASE`` or https://api.telegram.org (tests point it at an emulator).

Standard library only, and no import of the rest of the trainer: the pod's job runner for your own
code (gpucli/pod/jobrun.py) loads this file on its own, beside it on the pod. The event names are
``trainer.spec.alerts.EVENTS``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("trainer.watch.notify")


MAX_TEXT = 4000  # Telegram refuses messages over 4096 characters
_TOKEN_IN_URL = re.compile(r"/bot[^/\s'\"]+")


class Secret:
    """A string that never shows itself in ``str``, ``repr``, f-strings or logs; ``reveal()`` gives it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('****')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)


def scrub(text: str, token: str | None = None) -> str:
    """``text`` with the token, and anything shaped like ``/bot<token>`` in a URL, masked."""
    if token:
        text = text.replace(token, "****")
    return _TOKEN_IN_URL.sub("/bot****", text)


# ---------------------------------------------------------------------------------------------
# Message shapes (the Atlas 1B build plan §3 and §5.3): Telegram's legacy Markdown, values in `code` spans.


def _code(value: object) -> str:
    """A value inside a Markdown code span (a backtick in it would end the span early)."""
    return "`" + str(value).replace("`", "'") + "`"


def _num(x: float | None, fmt: str) -> str:
    if x is None or not math.isfinite(x):
        return _code("n/a")
    return _code(format(x, fmt))


def _ppl(loss: float | None) -> float | None:
    if loss is None or not math.isfinite(loss):
        return None
    return math.exp(min(loss, 700.0))


def format_checkpoint_saved(step: int, loss: float | None, ppl: float | None, when: float | None = None,
                            kind: str | None = None) -> str:
    lines = ["*Checkpoint Saved*", f"Step: {_code(f'{step:,}')}", f"Loss: {_num(loss, '.4f')}",
             f"PPL: {_num(ppl, '.1f')}", f"Time: {time.strftime('%H:%M:%S', time.localtime(when))}"]
    if kind and kind != "regular":
        lines.append(f"Kind: {_code(kind)}")
    return "\n".join(lines)


def format_validation_complete(step: int, val_loss: float, best_val_loss: float | None) -> str:
    return "\n".join(["*Validation Complete*", f"Step: {_code(f'{step:,}')}", f"Val Loss: {_num(val_loss, '.4f')}",
                      f"Val PPL: {_num(_ppl(val_loss), '.1f')}", f"Best Val Loss: {_num(best_val_loss, '.4f')}"])


def format_training_complete(total_steps: int, final_ppl: float | None, duration_hours: float,
                             reason: str | None = None, cost_usd: float | None = None) -> str:
    lines = ["*Training Complete*", f"Total Steps: {_code(f'{total_steps:,}')}",
             f"Final PPL: {_num(final_ppl, '.1f')}", f"Duration: {_num(duration_hours, '.1f')} hours"]
    if reason:
        lines.append(f"Reason: {_code(reason)}")
    if cost_usd is not None:
        lines.append(f"Cost: {_code(f'${cost_usd:.2f}')}")
    return "\n".join(lines)


def format_error_occurred(error: str, step: int, log_tail: str | None = None) -> str:
    head = "\n".join(["*ERROR*", f"Step: {_code(f'{step:,}')}", f"Error: {_code(error[:200])}"])
    if not log_tail:
        return head
    # The log's last lines in a pre block, cut from the front so the newest lines survive the limit.
    room = MAX_TEXT - len(head) - 20
    tail = log_tail.replace("`", "'").strip("\n")[-room:]
    return f"{head}\nLog:\n```\n{tail}\n```"


def format_ppl_spike(step: int, ppl: float, avg_ppl: float) -> str:
    ratio = ppl / avg_ppl if avg_ppl else float("inf")
    return "\n".join(["*PPL Spike Detected*", f"Step: {_code(f'{step:,}')}", f"Current PPL: {_num(ppl, '.1f')}",
                      f"Rolling Avg: {_num(avg_ppl, '.1f')}", f"Ratio: {_code(f'{ratio:.1f}x')}"])


def format_stage_transition(stage: int, step: int, seq_len: int | None = None, chunk_size: int | None = None) -> str:
    lines = ["*Stage Transition*", f"Now entering Stage {_code(stage)}", f"Step: {_code(f'{step:,}')}"]
    if seq_len is not None:
        lines.append(f"Seq Len: {_code(seq_len)}")
    if chunk_size is not None:
        lines.append(f"Memory Chunk: {_code(chunk_size)}")
    return "\n".join(lines)


def format_gate_collapse(step: int, layer: int, share: float, detail: str) -> str:
    """The 300M run's failure (the Atlas 1B build plan Appendix A): the model learning to bypass its memory."""
    return "\n".join(["*Gate Collapse*", f"Step: {_code(f'{step:,}')}", f"Layer: {_code(layer)}",
                      f"Memory Share: {_code(f'{100 * share:.2f} %')}", f"Why: {_code(detail)}"])


def format_static_memory(step: int, layer: int, m_std: float, detail: str) -> str:
    return "\n".join(["*Static Memory*", f"Step: {_code(f'{step:,}')}", f"Layer: {_code(layer)}",
                      f"M_std: {_num(m_std, '.4g')}", f"Why: {_code(detail)}"])


def format_refinement_order(step: int, line: str) -> str:
    """The cloud training guide's check: step_0 > step_1 > ... must hold."""
    return "\n".join(["*Refinement Order Broken*", f"Step: {_code(f'{step:,}')}", _code(line)])


def format_cost_update(hours_elapsed: float, hourly_rate: float | None) -> str:
    lines = ["*Cost Update*", f"Hours: {_num(hours_elapsed, '.1f')}"]
    if hourly_rate is not None:
        lines += [f"Rate: {_code(f'${hourly_rate:g}/hr')}", f"Total: {_code(f'${hours_elapsed * hourly_rate:.2f}')}"]
    return "\n".join(lines)


def read_log_tail(path: str | os.PathLike[str], lines: int = 15, max_bytes: int = 16384) -> str:
    """The last ``lines`` lines of a log file ('' when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# The sender


@dataclass
class _Message:
    text: str
    silent: bool = False
    final: bool = False  # training complete / error: sent first when the run is closing


class Notifier:
    """Sends training events to a Telegram chat; a no-op without a token and chat id (or when disabled).

    ``sent``, ``failed`` (gave up after retries, or rejected), ``dropped`` (queue full, sending off
    after a rejected token, or past close()'s deadline) and ``pending`` (no outcome yet) count
    messages; nothing here ever raises into the caller.
    """

    def __init__(self, bot_token: str | None = None, chat_id: str | None = None, enabled: bool = True,
                 events: list[str] | None = None, timeout_s: float = 10.0, *, max_queue: int = 100,
                 max_attempts: int = 4, backoff_s: float = 1.0, max_retry_after_s: float = 60.0,
                 api_base: str | None = None) -> None:
        token = bot_token or os.environ.get("TELEGRAM_BOT_TOKEN") or ""
        self._token = Secret(token.strip())
        self._chat = (chat_id or os.environ.get("TELEGRAM_CHAT_ID") or "").strip()
        base = api_base or os.environ.get("TELEGRAM_API_BASE") or "https://api.telegram.org"
        self.base_url = base.rstrip("/")
        self.enabled = bool(enabled and self._token and self._chat)
        self.events = set(events) if events is not None else None
        self.timeout_s = timeout_s
        self.max_attempts = max(1, max_attempts)
        self.backoff_s = backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        self.queued = 0
        self._dropped_late = 0  # dropped after being queued (past close()'s deadline, token rejected)
        self._rejected = False
        self._closing = threading.Event()
        self._closed = False  # close() returned: the thread, if still stuck in a request, stays quiet
        self._deadline = math.inf  # monotonic time after which close() no longer waits for the thread
        self._q: queue.Queue[_Message | None] = queue.Queue(maxsize=max(1, max_queue))
        self._thread: threading.Thread | None = None
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="telegram", daemon=True)
            self._thread.start()

    def __repr__(self) -> str:  # never show the token
        return (f"Notifier(enabled={self.enabled}, sent={self.sent}, failed={self.failed}, "
                f"dropped={self.dropped})")

    @property
    def pending(self) -> int:
        """Queued messages with no outcome yet (after close(): the ones abandoned in flight)."""
        return max(0, self.queued - self.sent - self.failed - self._dropped_late)

    def wants(self, event: str | None) -> bool:
        return self.enabled and (event is None or self.events is None or event in self.events)

    def send(self, text: str, event: str | None = None, silent: bool = False, final: bool = False) -> bool:
        """Queue ``text`` unless ``event`` is filtered out; returns whether it was queued. Never blocks."""
        if not self.wants(event):
            return False
        if self._rejected or self._closing.is_set():
            self.dropped += 1
            return False
        if len(text) > MAX_TEXT:
            text = text[: MAX_TEXT - 3] + "..."
        try:
            token = self._token.reveal()
            self._q.put_nowait(_Message(text.replace(token, "****") if token else text, silent, final))
            self.queued += 1
        except queue.Full:
            self.dropped += 1
            return False
        return True

    # -- one method per event (the Atlas 1B build plan's TelegramNotifier API) ---------------------------------

    def checkpoint_saved(self, step: int, loss: float | None, ppl: float | None, kind: str | None = None) -> bool:
        if not self.wants("checkpoint_saved"):
            return False
        return self.send(format_checkpoint_saved(step, loss, ppl, time.time(), kind), "checkpoint_saved")

    def validation_complete(self, step: int, val_loss: float, best_val_loss: float | None) -> bool:
        if not self.wants("validation_complete"):
            return False
        return self.send(format_validation_complete(step, val_loss, best_val_loss), "validation_complete")

    def training_complete(self, total_steps: int, final_ppl: float | None, duration_hours: float,
                          reason: str | None = None, cost_usd: float | None = None) -> bool:
        if not self.wants("training_complete"):
            return False
        return self.send(format_training_complete(total_steps, final_ppl, duration_hours, reason, cost_usd),
                         "training_complete", final=True)

    def error_occurred(self, error: str, step: int, log_tail: str | None = None) -> bool:
        if not self.wants("error_occurred"):
            return False
        return self.send(format_error_occurred(error, step, log_tail), "error_occurred", final=True)

    def ppl_spike(self, step: int, ppl: float, avg_ppl: float) -> bool:
        if not self.wants("ppl_spike"):
            return False
        return self.send(format_ppl_spike(step, ppl, avg_ppl), "ppl_spike")

    def stage_transition(self, stage: int, step: int, seq_len: int | None = None, chunk_size: int | None = None) -> bool:
        if not self.wants("stage_transition"):
            return False
        return self.send(format_stage_transition(stage, step, seq_len, chunk_size), "stage_transition")

    def gate_collapse(self, step: int, layer: int, share: float, detail: str) -> bool:
        if not self.wants("gate_collapse"):
            return False
        return self.send(format_gate_collapse(step, layer, share, detail), "gate_collapse")

    def static_memory(self, step: int, layer: int, m_std: float, detail: str) -> bool:
        if not self.wants("static_memory"):
            return False
        return self.send(format_static_memory(step, layer, m_std, detail), "static_memory")

    def refinement_order(self, step: int, line: str) -> bool:
        if not self.wants("refinement_order"):
            return False
        return self.send(format_refinement_order(step, line), "refinement_order")

    def cost_update(self, hours_elapsed: float, hourly_rate: float | None) -> bool:
        if not self.wants("cost_update"):
            return False
        return self.send(format_cost_update(hours_elapsed, hourly_rate), "cost_update", silent=True)

    # -- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            msg = self._q.get()
            if msg is None:
                return
            if self._closing.is_set():
                # The run is ending and the backlog may not all fit in close()'s time: the final
                # alert (complete / error) goes first, the rest after it in order.
                backlog = [msg, *self._drain()]
                backlog.sort(key=lambda m: not m.final)
                for m in backlog:
                    self._try(m)
                return
            self._try(msg)

    def _drain(self) -> list[_Message]:
        out: list[_Message] = []
        while True:
            try:
                m = self._q.get_nowait()
            except queue.Empty:
                return out
            if m is not None:
                out.append(m)

    def _try(self, msg: _Message) -> None:
        if self._rejected or time.monotonic() > self._deadline:
            self.dropped += 1
            self._dropped_late += 1
            return
        try:
            self._deliver(msg)
        except Exception as e:  # noqa: BLE001 - a notification must never take training down
            self.failed += 1
            self._warn("telegram: send failed: %s", self._safe(e))

    def _warn(self, fmt: str, *args: object) -> None:
        if not self._closed:
            log.warning(fmt, *args)

    def _safe(self, e: BaseException) -> str:
        return scrub(f"{type(e).__name__}: {e}", self._token.reveal())[:300]

    def _post(self, payload: dict) -> tuple[int | None, dict, str]:
        """One request: (HTTP status or None when unreachable, the JSON answer, a token-free error text)."""
        url = f"{self.base_url}/bot{self._token.reveal()}/sendMessage"
        req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        timeout = self.timeout_s
        if self._closing.is_set():
            timeout = max(0.1, min(timeout, self._deadline - time.monotonic()))
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:  # its .url and .filename hold the token: keep only the status
            status = e.code
            try:
                raw = e.read()
            except Exception:  # noqa: BLE001
                raw = b""
            finally:
                e.close()
        except Exception as e:  # noqa: BLE001 - URLError, timeouts, resets: all "unreachable"
            return None, {}, self._safe(e)
        try:
            answer = json.loads(raw or b"{}")
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        desc = scrub(str(answer.get("description") or ""), self._token.reveal())[:200]
        return status, answer, f"HTTP {status}" + (f" {desc}" if desc else "")

    def _pause(self, delay: float) -> bool:
        """Wait ``delay`` seconds before a retry; False when the run is closing (no retries then)."""
        if self._closing.wait(delay):
            return False
        return not self._closing.is_set()

    def _deliver(self, msg: _Message) -> None:
        payload: dict = {"chat_id": self._chat, "text": msg.text, "parse_mode": "Markdown"}
        if msg.silent:
            payload["disable_notification"] = True
        attempt = 0
        while True:
            attempt += 1
            status, answer, err = self._post(payload)
            if status is not None and 200 <= status < 300 and answer.get("ok", True):
                self.sent += 1
                return
            if status == 400 and "parse_mode" in payload and "parse" in err.lower():
                payload.pop("parse_mode")  # markup Telegram cannot parse: the same text, plain
                continue
            if status in (401, 403, 404):
                self._rejected = True
                self.failed += 1
                self._warn("telegram: the bot token or chat was rejected (%s); alerts are off for this run", err)
                return
            if status is not None and 400 <= status < 500 and status != 429:
                self.failed += 1
                self._warn("telegram: message refused (%s)", err)
                return
            delay = self.backoff_s * 2 ** (attempt - 1)
            if status == 429:
                params: dict[str, Any] = (answer["parameters"] if isinstance(answer.get("parameters"), dict)
                                          else {})
                try:
                    delay = max(0.0, float(params.get("retry_after", delay)))
                except (TypeError, ValueError):
                    pass
                if delay > self.max_retry_after_s:
                    attempt = self.max_attempts  # Telegram wants a longer pause than a message is worth
            if (attempt < self.max_attempts and status == 429 and self._closing.is_set()
                    and time.monotonic() + delay < self._deadline):
                time.sleep(delay)  # closing: no backoff retries, but Telegram's own wait if it fits
                continue
            if attempt >= self.max_attempts or not self._pause(delay):
                self.failed += 1
                self._warn("telegram: send failed after %d attempt(s): %s", attempt, err)
                return

    def summary(self) -> str:
        """One line for the log at exit: what was sent, and what was not."""
        return (f"telegram: {self.sent} sent, {self.failed} failed, {self.dropped} dropped"
                + (f", {self.pending} abandoned at exit" if self.pending else ""))

    def close(self, wait_s: float = 5.0) -> None:
        """Stop the thread, giving what is still queued up to ``wait_s`` seconds (one try each)."""
        if self._thread is None:
            return
        self._deadline = time.monotonic() + wait_s
        self._closing.set()
        try:
            self._q.put(None, timeout=wait_s)
        except queue.Full:
            pass
        self._thread.join(timeout=max(0.0, self._deadline - time.monotonic()))
        self._thread = None
        self._closed = True
        # Whatever is left was not delivered: count it, so the summary in the log is honest.
        while True:
            try:
                if self._q.get_nowait() is not None:
                    self.dropped += 1
                    self._dropped_late += 1
            except queue.Empty:
                break
