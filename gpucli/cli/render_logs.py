"""``gpucli logs``: the pod's console lines as plain bytes on stdout, stripped of terminal control
sequences (a log line must not clear the screen, move the cursor or set the window title); the pod's
clock on stderr, so a pipe gets the log alone."""

from __future__ import annotations

import datetime as dt
import re
import sys
import time
from collections.abc import Iterable

from gpucli.cli.render import info

# ESC [ ... final byte (CSI), ESC ] ... BEL or ESC \ (OSC), other two-byte ESC sequences, and C0/C1
# controls but tab; \r alone (progress bars redrawing a line) becomes a line break.
_CONTROL = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]|"
                      rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")


def clean(line: bytes) -> str:
    text = _CONTROL.sub(b"", line.replace(b"\r", b"\n")).decode("utf-8", errors="replace")
    return re.sub(r"\n+", "\n", text).strip("\n") if "\n" in text else text


def pod_clock(pod_time: float) -> str:
    return dt.datetime.fromtimestamp(pod_time, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def header(run: str, where: str, pod_time: float, size: int) -> None:
    skew = pod_time - time.time()
    note = f" (this machine's clock {abs(skew):.0f} s {'behind' if skew > 0 else 'ahead'})" if abs(skew) >= 2 else ""
    if size < 0:
        info(f"{run}: no console.log on {where} yet; pod clock {pod_clock(pod_time)}{note}")
        return
    info(f"{run}: console.log on {where} ({size:,} bytes); pod clock {pod_clock(pod_time)}{note}")


def lines(batch: Iterable[bytes], *, pod_time: float | None = None) -> None:
    """Print lines; with ``pod_time`` each is prefixed by the pod's clock when it was read."""
    prefix = (dt.datetime.fromtimestamp(pod_time, dt.timezone.utc).strftime("%H:%M:%S") + " | ") if pod_time else ""
    out = sys.stdout
    for line in batch:
        out.write(prefix + clean(line) + "\n")
    out.flush()


def restarted(run: str) -> None:
    info(f"{run}: console.log was replaced on the host; reading it again from its start")
