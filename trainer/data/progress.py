"""Preparation progress: bytes read, tokens written, MB/s and ETA, as a line for the log (stderr,
train.log) and as a JSON line appended to a file that a run's tail can follow."""

from __future__ import annotations

import json
import time
from collections.abc import Callable


class Progress:
    def __init__(self, total_bytes: int, path: str | None, log: Callable[[str], None], every_s: float,
                 counter, start_bytes: int = 0) -> None:
        self.total, self.path, self.log, self.every = total_bytes, path, log, every_s
        self.counter, self.start_bytes = counter, start_bytes
        self.t0 = time.monotonic()
        self.last = self.t0

    def row(self, tokens: int) -> dict:
        done = min(int(self.counter.value), self.total)
        dt = max(1e-9, time.monotonic() - self.t0)
        rate = (done - self.start_bytes) / dt
        eta = (self.total - done) / rate if rate > 0 else None
        return {"kind": "prepare", "time": time.time(), "bytes_read": done, "bytes_total": self.total,
                "tokens": tokens, "mb_s": round(rate / 1e6, 2), "elapsed_s": round(dt, 1),
                "eta_s": None if eta is None else round(eta, 1)}

    def tick(self, tokens: int, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < self.every:
            return
        self.last = now
        r = self.row(tokens)
        if final:
            r.update(bytes_read=self.total, eta_s=0.0, done=True)
        eta = "-" if r["eta_s"] is None else f"{r['eta_s']:.0f}s"
        self.log(f"prepare: {r['bytes_read'] / 1e6:,.1f}/{self.total / 1e6:,.1f} MB read, {tokens:,} tokens, "
                 f"{r['mb_s']:.1f} MB/s, ETA {eta}")
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(r) + "\n")
