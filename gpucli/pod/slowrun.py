"""A slow run, against its plan: the measured tokens/s after warm-up compared with the planned tokens/s
for the run's setup. Standard library only: the pod-side watchdog loads it by path from beside it (its
verdict, ``slow.json``, ``--replace-slow``), and ``gpucli status`` / ``tail`` import the same functions
to say it from the metrics rows they read.

- Measured: the median ``tok_per_s`` of the trainer's ``train`` rows since its last ``started`` or
  ``resumed`` event, the first :data:`WARMUP_ROWS` of them left out (compile, the allocator, the data
  loader's first fill), once :data:`MIN_ROWS` rows are left. The median, so one slow row (a checkpoint
  write, a validation) does not decide.
- Slow: measured / planned under the threshold (``--slow-below``, default 0.7). A run whose plan has no
  tokens/s (your own code, a CPU run) is never called slow.
- Said once: ``watchdog.log``, ``slow.json`` and one alert through the bundled trainer's own senders
  (``code/trainer/watch/notify.py`` and ``webhook.py``: Telegram, the webhook), with the Telegram token and
  chat or the webhook URL from the run's 0600 ``env`` file, as the trainer reads them.
- ``--replace-slow``: the watchdog signals the trainer (its checkpoint), then waits up to
  ``--replace-wait-s`` (default 10 min) with the pod up: a ``gpucli watch`` on your machine sees the verdict,
  copies the newest checkpoint home and ends this pod as it rents the next one. Nobody came (no watcher):
  the pod's end action (stop) runs, and ``gpucli down`` + ``gpucli resume`` continue the run later.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

WARMUP_ROWS = 3  # train rows left out after each start: compile and warm-up
MIN_ROWS = 5  # rows after warm-up before anything is said
TAIL_BYTES = 256 << 10  # the end of metrics.jsonl the watchdog reads each poll
FILE = "slow.json"


def _tps(row: dict[str, Any]) -> float | None:
    v = row.get("tok_per_s")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v > 0 else None


def measured_tps(rows: Iterable[dict[str, Any]], *, warmup: int = WARMUP_ROWS, need: int = MIN_ROWS,
                 since: float | None = None) -> float | None:
    """The median tokens/s of the train rows since the last start, after warm-up; None while too few.
    ``since``: rows written before it (epoch s; a resumed run's restored rows, another machine's) are
    left out."""
    speeds: list[float] = []
    for row in rows:
        if since is not None and not (isinstance(row.get("time"), (int, float)) and row["time"] >= since):
            continue
        if row.get("kind") == "event" and row.get("event") in ("started", "resumed"):
            speeds = []
        elif row.get("kind") == "train" and (v := _tps(row)) is not None:
            speeds.append(v)
    speeds = sorted(speeds[warmup:])
    if len(speeds) < need:
        return None
    mid = len(speeds) // 2
    return speeds[mid] if len(speeds) % 2 else (speeds[mid - 1] + speeds[mid]) / 2


def kilo(v: float) -> str:
    return f"{v / 1e6:.1f}M" if v >= 1e6 else f"{v / 1e3:.1f}k" if v >= 1e3 else f"{v:.0f}"


def words(measured: float, planned: float) -> str:
    """``slow: 41 % of plan (12.3k tok/s measured, 30.0k planned)``."""
    return f"slow: {100 * measured / planned:.0f} % of plan ({kilo(measured)} tok/s measured, {kilo(planned)} planned)"


def slow_words(rows: Iterable[dict[str, Any]], planned: float | None, below: float | None) -> str | None:
    """The words for a slow run (None: not slow, not known yet, or nothing planned to compare with)."""
    if not planned or not below or planned <= 0:
        return None
    got = measured_tps(rows)
    return words(got, planned) if got is not None and got < below * planned else None


def tail_rows(path: Path, limit: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """The JSON rows of the last ``limit`` bytes of a metrics file (a partial first line dropped)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - limit))
            data = fh.read(limit)
    except OSError:
        return []
    lines = data.splitlines()
    if size > limit and lines:
        lines = lines[1:]
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class SlowWatch:
    """The watchdog's slow check: once slow is confirmed, ``slow.json`` is written and logged once;
    with ``replace`` the check's verdict ends the run (checkpoint, then the pod's end action) so that a
    watcher continues it on another machine."""

    def __init__(self, run_dir: Path, planned: float, below: float, replace: bool, log: Callable[[str], None]) -> None:
        self.run_dir, self.planned, self.below, self.replace, self.log = run_dir, planned, below, replace, log
        self.said = (run_dir / FILE).exists()  # a restarted watchdog does not say it again
        self.since = time.time()  # this machine's rows only: a resumed run's metrics begin with the last one's
        log(f"slow check: under {below:.0%} of the planned {kilo(planned)} tok/s"
            + (" ends this machine for another (--replace-slow)" if replace else " is reported"))

    def check(self) -> str | None:
        got = measured_tps(tail_rows(self.run_dir / "metrics.jsonl"), since=self.since)
        if got is None or got >= self.below * self.planned:
            return None
        text = words(got, self.planned)
        if not self.said:
            self.said = True
            self.log(text)
            tmp = self.run_dir / (FILE + ".tmp")
            tmp.write_text(json.dumps({"measured_tokens_per_s": got, "planned_tokens_per_s": self.planned,
                                       "below": self.below, "words": text, "replace": self.replace,
                                       "time": time.time()}))
            tmp.replace(self.run_dir / FILE)
            alert(self.run_dir, text + (": ending this machine for another (--replace-slow)" if self.replace else ""),
                  self.log)
        return text if self.replace else None


def wait_for_watcher(run_dir: Path, wait_s: float, log: Callable[[str], None]) -> None:
    """A slow run to be replaced: keep the pod up for ``wait_s`` so that a watcher can copy its checkpoint
    and end it (this process ends with the pod then); the caller's end action follows otherwise."""
    if wait_s <= 0:
        return
    log(f"slow: waiting up to {wait_s:g} s for `gpucli watch` to take the checkpoint and replace this machine")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(min(5.0, max(0.05, deadline - time.monotonic())))
    log("slow: no watcher replaced this machine; ending it (`gpucli resume` continues the run)")


def read_env(path: Path) -> dict[str, str]:
    """The run's env file (``KEY='value'`` lines, shell-quoted), as a dict; {} when unreadable."""
    env = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            try:
                words = shlex.split(value)
            except ValueError:
                continue
            env[key] = words[0] if words else ""
    return env


def _load(path: Path, name: str) -> Any:
    """A standard-library-only file of the bundled trainer, by path (this file cannot import the trainer)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path.name} not found")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _load_webhook(code: Path, notify: Any) -> Any:
    """The trainer's webhook sender; its two trainer imports answered by the files loaded here, while it loads
    (as gpucli/pod/jobalerts.py does for your own code's job)."""
    hooks = _load(code / "trainer" / "spec" / "webhooks.py", "gpucli_slow_webhooks")
    names = ("trainer.watch.notify", "trainer.spec.webhooks")
    saved = {n: sys.modules.get(n) for n in names}
    sys.modules.update({names[0]: notify, names[1]: hooks})
    try:
        return _load(code / "trainer" / "watch" / "webhook.py", "gpucli_slow_webhook")
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


def alert(run_dir: Path, text: str, log: Callable[[str], None]) -> None:
    """One message through the bundled trainer's senders (its code folder in the run folder), to the
    Telegram chat and the webhook the run was given; nothing when it has neither. Waits at most ~10 s."""
    env = read_env(run_dir / "env")
    telegram = env.get("TELEGRAM_BOT_TOKEN") and env.get("TELEGRAM_CHAT_ID")
    hook = (env.get("GPUCLI_WEBHOOK_URL") or "").strip()
    code = run_dir / "code"
    if not (telegram or hook) or not (code / "trainer" / "watch" / "notify.py").is_file():
        return
    try:
        notify = _load(code / "trainer" / "watch" / "notify.py", "gpucli_slow_notify")
        webhook = _load_webhook(code, notify) if hook else None
    except Exception as exc:  # noqa: BLE001 - an alert is a courtesy: the check goes on without it
        log(f"slow: no alert ({type(exc).__name__})")
        return
    senders: list[Any] = []
    if telegram:
        senders.append(notify.Notifier(env["TELEGRAM_BOT_TOKEN"], env["TELEGRAM_CHAT_ID"],
                                       api_base=env.get("TELEGRAM_API_BASE") or None))
    if webhook is not None:
        senders.append(webhook.WebhookNotifier(hook))
    name = run_dir.name
    for sender in senders:
        sender.send(f"*{name}*: {text}")
    for sender in senders:
        sender.close(wait_s=10.0)
    log("slow: alert sent")
