"""Text from a pod (or a provider) is shown only without control sequences and as plain text.

A pod's log lines, event names, failure reasons and folder names can carry terminal escape sequences
(clear the screen, move the cursor, set the window title, write the clipboard with OSC 52) and rich
markup (``[/bold]`` ends in a MarkupError). :func:`clean` removes every escape sequence and control
character but newline and tab; :func:`plain` also escapes markup, for text put inside a markup string.

:class:`SafeConsole`, the console every render module prints through, applies :func:`clean` to every
piece of text it writes (rich's own styling travels beside the text, so it is untouched), and prints
a line whose markup does not parse as plain text instead of failing: no pod byte reaches the terminal
raw, whatever call site it comes through.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape
from rich.segment import Segment

# ESC-introduced sequences (CSI ... final byte, OSC/DCS/APC/PM/SOS ... ST or BEL, two-byte escapes),
# their 8-bit C1 forms, then any other C0/C1 control character except tab and newline.
_SEQUENCES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"  # other escapes
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def clean(text: str) -> str:
    """``text`` without escape sequences or control characters (newline and tab kept)."""
    if not isinstance(text, str):
        text = str(text)
    return _SEQUENCES.sub("", text)


def plain(text: Any) -> str:
    """Pod text for a markup string: cleaned, and its brackets escaped."""
    return escape(clean(text if isinstance(text, str) else str(text)))


class SafeConsole(Console):
    """A rich Console that never writes a control sequence it did not make (see the module doc)."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control else Segment(clean(seg.text), seg.style, seg.control) for seg in buffer)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        objects = tuple(clean(o) if isinstance(o, str) else o for o in objects)
        try:
            super().print(*objects, **kwargs)
        except MarkupError:
            markup = self._markup
            self._markup = False  # tables and their cells render their text with the console's setting
            try:
                super().print(*objects, **{**kwargs, "markup": False})
            finally:
                self._markup = markup
