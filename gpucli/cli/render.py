"""The presentation layer: the only module that prints.

Data goes to stdout (tables, JSON); status, progress and errors go to stderr. rich is imported here,
lazily, so commands that print nothing heavy stay fast.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from gpucli.providers.credentials import KeyInfo

_OUT: Console | None = None
_ERR: Console | None = None


def out() -> Console:
    global _OUT
    if _OUT is None:
        from gpucli.cli.sanitize import SafeConsole as Console

        # Piped output gets a wide fixed width rather than rich's 80 columns, so tables stay whole.
        width = None if sys.stdout.isatty() else 200
        _OUT = Console(highlight=False, soft_wrap=False, width=width)
    return _OUT


def err() -> Console:
    global _ERR
    if _ERR is None:
        from gpucli.cli.sanitize import SafeConsole as Console

        _ERR = Console(stderr=True, highlight=False)
    return _ERR


def reset_consoles() -> None:
    """Forget the consoles (tests swap sys.stdout/sys.stderr between invocations)."""
    global _OUT, _ERR
    _OUT = _ERR = None


def error(message: str) -> None:
    from rich.markup import escape

    err().print(f"[bold red]Error:[/] {escape(message)}", soft_wrap=True)


def warn(message: str) -> None:
    from rich.markup import escape

    err().print(f"[yellow]Warning:[/] {escape(message)}", soft_wrap=True)


def info(message: str) -> None:
    from rich.markup import escape

    err().print(escape(message), soft_wrap=True)


def traceback() -> None:
    import traceback as tb

    tb.print_exc(file=sys.stderr)


# --------------------------------------------------------------------------------------------------
# JSON


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (dt.date, dt.datetime)):
        return obj.isoformat()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "items") and callable(obj.items):  # mappingproxy and friends
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


def json_out(obj: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------------
# Formatting helpers


def money(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1000:
        return f"${x:,.0f}"
    if x >= 10:
        return f"${x:.0f}" if x >= 100 else f"${x:.1f}"
    return f"${x:.2f}"


def hours(h: float | None) -> str:
    if h is None or not math.isfinite(h):
        return "-"
    if h < 1:
        return f"{h * 60:.0f} min"
    if h < 100:
        return f"{h:.1f} h"
    return f"{h:,.0f} h"


def si(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g}{suffix}{unit}"
    return f"{x:.3g}{unit}"


def table(title: str | None = None, **kw: Any) -> Any:
    from rich import box
    from rich.table import Table

    kw.setdefault("collapse_padding", True)  # one space between columns: tables fit 100 columns
    return Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False, **kw)


# --------------------------------------------------------------------------------------------------
# Catalogue listings


_table = table  # the name render_runs.py imports


class Notes:
    """Footnotes for a table: long source texts become ``[n]`` in a cell and one line each below the
    table, so tables fit 100 columns without wrapping a sentence over a dozen lines or cutting numbers."""

    def __init__(self) -> None:
        self._texts: list[str] = []

    def ref(self, text: str) -> str:
        if text not in self._texts:
            self._texts.append(text)
        return f"[{self._texts.index(text) + 1}]"

    def clear(self) -> None:
        self._texts.clear()

    def print(self) -> None:
        from rich.markup import escape

        for k, text in enumerate(self._texts, 1):
            out().print(f"[dim]  [{k}] {escape(text)}[/]")


def keys_table(rows: Sequence[KeyInfo]) -> None:
    """Key names and where each comes from. Values are never shown, only ``****`` and the last 4."""
    from rich.markup import escape

    t = table("Keys (first source wins: environment, then keys.json, then the vendor's own file)")
    for col in ("name", "set?", "from", "value", "also in", "env var"):
        t.add_column(col)
    for r in rows:
        t.add_row(r.name, "yes" if r.source else "[dim]no[/]", escape(r.source or "-"), escape(r.masked or "-"),
                  escape(", ".join(r.shadowed) or "-"), r.env_var)
    out().print(t)


def ask_secret(label: str) -> str:
    """Prompt on the terminal without echo (the value never reaches the screen or scrollback)."""
    import getpass

    return getpass.getpass(f"{label}: ")


def hanging(text: str, *, markup: bool = True, indent: int = 2) -> None:
    """One logical line on stdout, wrapped to the terminal with its continuation lines indented, so a
    long line reads as one item rather than running into the next at column 0."""
    from rich.text import Text

    o = out()
    body = Text.from_markup(text) if markup else Text(text)
    for i, piece in enumerate(body.wrap(o, max(20, o.width - indent))):
        o.print(Text(" " * indent) + piece if i else piece, soft_wrap=True, highlight=False)


def line(text: str) -> None:
    """One plain line of data on stdout (a path, an id) with no markup or wrapping."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def notify_sent(sent: Any, token_source: str) -> None:
    """`gpucli notify test` succeeded: which chat got it (never the token, only where it came from)."""
    mid = f" (message {sent.message_id})" if sent.message_id is not None else ""
    info(f"sent a test message to Telegram chat {sent.chat_id}{mid} using the bot token from {token_source}")


def alert_events(alerts: dict[str, str], *, json_: bool = False) -> None:
    """`gpucli notify events`: every alert a run can send, with what raises it."""
    if json_:
        json_out([{"event": name, "when": when} for name, when in alerts.items()])
        return
    t = table("Alert events (notifications.events in run.yaml picks among them; all by default)")
    t.add_column("event")
    t.add_column("sent when")
    for name, when in alerts.items():
        t.add_row(name, when)
    out().print(t)
