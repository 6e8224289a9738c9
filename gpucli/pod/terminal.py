"""Console output read the way a terminal shows it (standard library only).

Training scripts write for a terminal: tqdm redraws its bar after a carriage return, nested bars and the
Hugging Face Trainer's log lines move the cursor up (``\\r\\x1b[A{'eval_loss': ...}``), rich redraws its
live display with cursor-up and erase-line sequences, and everything may be coloured. :class:`Terminal`
keeps a small screen of rows with a cursor and applies those sequences; a row is handed on (a
"snapshot") each time the cursor leaves it or returns to its start after writing to it, with the text
it holds at that moment. So a line that was overwritten, erased, or moved away from is read as the
terminal showed it, and a row the cursor passes over without writing is not read twice.

:class:`Tail` keeps the last lines as they stand on screen (a bar redrawn in place is one line), and
:func:`exception_line` picks the last Python traceback's exception line out of them.
"""

from __future__ import annotations

import re
from collections import deque

# CSI: ESC [ params intermediates final; OSC: ESC ] ... BEL or ESC \; other two-byte escapes.
_ESCAPE = re.compile(r"\x1b\[([0-9;?]*)[ -/]*([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x07\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]")
MAX_COLUMNS = 4096  # a longer line is cut (a runaway line never holds memory)
KEEP_ROWS = 256  # rows this far above the lowest one reached are forgotten


class Terminal:
    """Feed text chunks in order; :meth:`feed` returns the rows' snapshots it completed, in order."""

    def __init__(self) -> None:
        self.rows: dict[int, list[str]] = {}
        self.dirty: set[int] = set()
        self.row = 0
        self.col = 0
        self.bottom = 0
        self.pending = ""  # an escape sequence cut at the end of a chunk

    def _snap(self, out: list[tuple[int, str]], row: int | None = None) -> None:
        r = self.row if row is None else row
        if r in self.dirty:
            self.dirty.discard(r)
            out.append((r, "".join(self.rows.get(r, ())).rstrip()))

    def _move(self, out: list[tuple[int, str]], row: int) -> None:
        if row != self.row:
            self._snap(out)
            self.row = max(row, self.bottom - KEEP_ROWS)
            if self.row > self.bottom:
                self.bottom = self.row
                for old in [k for k in self.rows if k < self.bottom - KEEP_ROWS]:
                    self.rows.pop(old, None)
                    self.dirty.discard(old)

    def _write(self, text: str) -> None:
        if not text:
            return
        line = self.rows.setdefault(self.row, [])
        end = min(self.col + len(text), MAX_COLUMNS)
        if end > len(line):
            line.extend(" " * (end - len(line)))
        line[self.col:end] = text[: end - self.col]
        self.col = end
        self.dirty.add(self.row)

    def _erase(self, mode: int) -> None:
        line = self.rows.get(self.row)
        if line is None:
            return
        if mode == 0:
            del line[self.col:]
        elif mode == 1:
            line[: self.col] = " " * min(self.col, len(line))
        else:
            line.clear()
        self.dirty.add(self.row)

    def _csi(self, out: list[tuple[int, str]], params: str, final: str) -> None:
        nums = [int(p) if p.isdigit() else 0 for p in params.lstrip("?").split(";")] if params else []
        n = max(nums[0], 1) if nums else 1
        if final == "A":
            self._move(out, self.row - n)
        elif final in ("B", "E"):
            self._move(out, self.row + n)
            if final == "E":
                self.col = 0
        elif final == "F":
            self._move(out, self.row - n)
            self.col = 0
        elif final == "C":
            self.col = min(self.col + n, MAX_COLUMNS)
        elif final == "D":
            self.col = max(self.col - n, 0)
        elif final == "G":
            self.col = min(n - 1, MAX_COLUMNS)
        elif final == "K":
            self._erase(nums[0] if nums else 0)
        elif final == "J" and (nums[0] if nums else 0) in (2, 3):
            for r in list(self.rows):
                self._snap(out, r)
            self.rows.clear()
        # m (colours), h/l (modes), H (absolute moves: rare in logs), ...: nothing to show

    def feed(self, text: str) -> list[str]:
        out: list[tuple[int, str]] = []
        text = self.pending + text
        self.pending = ""
        i, n = 0, len(text)
        while i < n:
            ch = text[i]
            if ch == "\x1b":
                m = _ESCAPE.match(text, i)
                if m is None:
                    if n - i < 64:  # perhaps cut at the chunk's end: wait for the rest
                        self.pending = text[i:]
                        break
                    i += 1
                    continue
                if m.group(2):
                    self._csi(out, m.group(1) or "", m.group(2))
                i = m.end()
            elif ch == "\n":
                self._move(out, self.row + 1)
                self.col = 0
                i += 1
            elif ch == "\r":
                self._snap(out)
                self.col = 0
                i += 1
            elif ch == "\b":
                self.col = max(self.col - 1, 0)
                i += 1
            elif ch == "\t":
                self._write(" " * (8 - self.col % 8))
                i += 1
            else:
                j = i
                while j < n and text[j] not in "\x1b\n\r\b\t":
                    j += 1
                self._write(_CONTROL.sub("", text[i:j]))
                i = j
        return [line for _row, line in out if line.strip()]

    def flush(self) -> list[str]:
        """The rows still being written (the end of the output)."""
        out: list[tuple[int, str]] = []
        for r in sorted(self.dirty):
            self._snap(out, r)
        return [line for _row, line in out if line.strip()]


class Tail:
    """The last ``size`` lines as a terminal would show them: a line redrawn in place (a progress bar's
    carriage returns) replaces its previous state instead of adding a line."""

    _BAR = re.compile(r"\d+/(\d+|\?)\s*\[|\d+%\|")

    def __init__(self, size: int = 20) -> None:
        self.lines: deque[str] = deque(maxlen=size)
        self.last_bar = False
        self.exceptions = Exceptions()

    def add(self, line: str) -> None:
        self.exceptions.add(line)
        line = line.rstrip()
        if not line.strip():
            return
        bar = bool(self._BAR.search(line))
        if bar and self.last_bar and self.lines:
            self.lines[-1] = line
        else:
            self.lines.append(line)
        self.last_bar = bar

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.lines)


_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
_EXC = re.compile(r"^[A-Za-z_][\w.]*(?::\s.*|:?)$")
# A launcher's own exception when a child it started failed: torchrun's ``ChildFailedError``
# (torch/distributed/launcher/api.py, ``launch_agent``) and ``accelerate launch``'s
# ``subprocess.CalledProcessError`` (accelerate/commands/launch.py, ``simple_launcher``). The child's
# traceback came first on the same console; that is the cause, so the wrapper does not replace it.
_LAUNCHER = re.compile(r"^(?:[\w.]+\.)?(?:ChildFailedError|CalledProcessError)\b")


class Exceptions:
    """Fed every console line: the exception line of the last Python traceback seen (a traceback is
    often longer than the tail kept), except a launcher's report that its child failed when the
    child's own exception was seen. torchrun's ``[rank0]: `` prefix is taken off."""

    def __init__(self) -> None:
        self.found: str | None = None
        self.in_tb = False
        self.by_rank: dict[str, str] = {}  # torchrun's "[rankN]: " lines: each rank's last exception
        self.rank: str | None = None
        self.root_cause = False

    def add(self, raw: str) -> None:
        prefix = re.match(r"^\[(?:rank|default)(\d+)\]:\s?", raw)
        if prefix is None and self._root_cause(raw.strip()):
            return
        if prefix is not None and prefix.group(1) != self.rank:
            self.rank, self.in_tb = prefix.group(1), False  # another rank's lines: its own traceback
        line = raw.rstrip()[prefix.end():] if prefix is not None else raw.rstrip()
        if line.endswith(_TRACEBACK):  # perhaps after a progress bar on the same line (stderr, no newline)
            self.in_tb = True
            return
        if not self.in_tb or not line or line[0].isspace() or line.startswith("^") or line.startswith(_CHAINED):
            return
        if _EXC.match(line):
            if self.found is None or not _LAUNCHER.match(line):
                self.found = line.strip()[:300]
            if prefix is not None:
                self.by_rank[prefix.group(1)] = line.strip()[:300]
            self.in_tb = False

    def _root_cause(self, line: str) -> bool:
        """torchrun's failure report names the rank that failed first ("Root Cause (first observed
        failure):" then "rank      : 0 (local_rank: 0)", torch/distributed/elastic/multiprocessing/errors);
        the other ranks' exceptions after it are their peers going away. That rank's exception is the one."""
        if line.startswith("Root Cause (first observed failure)"):
            self.root_cause = True
            return True
        m = re.match(r"^rank\s*:\s*(\d+)\b", line) if self.root_cause else None
        if m:
            self.root_cause = False
            if m.group(1) in self.by_rank:
                self.found = self.by_rank[m.group(1)]
            return True
        return False


def exception_line(lines: list[str]) -> str | None:
    """The exception line of the last Python traceback in ``lines`` ("KeyError: 'missing_column'"), or
    None when there is none."""
    seen = Exceptions()
    for line in lines:
        seen.add(line)
    return seen.found
