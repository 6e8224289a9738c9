"""gitignore globs matched in time linear in the name (a hostile ``.gitignore`` cannot stall a sync).

A glob translated to a backtracking regex (``*a*a*a*a*b``, ``**/**/**/x``) can take time exponential in
a file name's length. Here a glob becomes a small list of tokens and is matched by stepping the set of
live token positions over the name once: at most (tokens x characters) steps, whatever the pattern.
A glob with at most one unbounded part also gets a plain regex, which cannot backtrack badly, for speed
in the big walks; an unanchored glob without ``/`` is matched against the name's last part only (what
``(?:.*/)?glob`` means, without the leading ``.*``).

A malformed glob (a range ``[z-a]``) is a :class:`~gpucli.errors.UsageError` naming it, in one line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from gpucli.errors import UsageError

# Token kinds.
LIT, ANY, CLASS, STAR, DSTAR, DIRS, SLASH_REST = range(7)
_UNBOUNDED = (STAR, DSTAR, DIRS, SLASH_REST)


@dataclass(frozen=True)
class Token:
    kind: int
    char: str = ""
    test: Callable[[str], bool] | None = None
    regex: str = ""


def _class(body: str, glob: str) -> tuple[Callable[[str], bool], str]:
    """A ``[...]`` body: a test of one character and its regex (never matching '/')."""
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
    singles: set[str] = set()
    ranges: list[tuple[str, str]] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            c = body[i + 1]
            i += 1
        if i + 2 < len(body) and body[i + 1] == "-":
            hi = body[i + 2]
            if hi == "\\" and i + 3 < len(body):
                hi = body[i + 3]
                i += 1
            if hi < c:
                raise UsageError(f"ignore pattern '{glob}': bad range [{c}-{hi}] in a [...] set",
                                 hint="a range goes from the lower character to the higher, as in [a-z]")
            ranges.append((c, hi))
            i += 3
            continue
        singles.add(c)
        i += 1

    def test(ch: str) -> bool:
        hit = ch in singles or any(lo <= ch <= hi for lo, hi in ranges)
        return ch != "/" and hit != negate

    parts = "".join(re.escape(s) for s in sorted(singles)) + "".join(
        f"{re.escape(lo)}-{re.escape(hi)}" for lo, hi in ranges)
    regex = f"[^/{parts}]" if negate else (f"(?!/)[{parts}]" if parts else "(?!)")
    return test, regex


def tokens(glob: str) -> list[Token]:
    """One gitignore glob body (no leading '!' or '/', no trailing '/') as tokens."""
    out: list[Token] = []
    i, n = 0, len(glob)
    while i < n:
        c = glob[i]
        if glob.startswith("**/", i):
            out.append(Token(DIRS, regex="(?:.*/)?"))
            i += 3
        elif glob.startswith("/**", i) and i + 3 == n:
            out.append(Token(SLASH_REST, regex="(?:/.*)?"))
            i += 3
        elif glob.startswith("**", i):
            out.append(Token(DSTAR, regex=".*"))
            i += 2
        elif c == "*":
            out.append(Token(STAR, regex="[^/]*"))
            i += 1
        elif c == "?":
            out.append(Token(ANY, regex="[^/]"))
            i += 1
        elif c == "[" and glob.find("]", i + 2) != -1:
            end = glob.find("]", i + 2)
            test, regex = _class(glob[i + 1:end], glob)
            out.append(Token(CLASS, test=test, regex=regex))
            i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(Token(LIT, glob[i + 1], regex=re.escape(glob[i + 1])))
            i += 2
        else:
            out.append(Token(LIT, c, regex=re.escape(c)))
            i += 1
    # Runs of unbounded parts match what one of them matches: collapsing them keeps the regex safe.
    merged: list[Token] = []
    for t in out:
        if merged and t.kind == merged[-1].kind and t.kind in (STAR, DSTAR, DIRS):
            continue
        merged.append(t)
    return merged


def _inside(i: int) -> int:
    """The state "inside the ``**/`` at token ``i``" (past its start: only a '/' leads out of it)."""
    return -(i + 10)


def _closure(toks: list[Token], states: set[int]) -> set[int]:
    """``states`` with every position reachable without reading a character."""
    todo = list(states)
    seen = set(states)
    while todo:
        i = todo.pop()
        if 0 <= i < len(toks) and toks[i].kind in _UNBOUNDED:
            nxt = i + 1
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def nfa_match(toks: list[Token], name: str) -> bool:
    """Whether ``name`` matches the tokens as a whole: one pass over ``name``."""
    end = len(toks)
    states = _closure(toks, {0})
    for ch in name:
        nxt: set[int] = set()
        for i in states:
            if i == -1:  # inside a trailing /** : anything to the end
                nxt.add(-1)
                continue
            if i <= -10:  # inside a **/ : anything, and out of it after a '/'
                nxt.add(i)
                if ch == "/":
                    nxt.add(-i - 10 + 1)
                continue
            if i == end:
                continue
            t = toks[i]
            k = t.kind
            if k == LIT:
                if ch == t.char:
                    nxt.add(i + 1)
            elif k == ANY:
                if ch != "/":
                    nxt.add(i + 1)
            elif k == CLASS:
                if t.test is not None and t.test(ch):
                    nxt.add(i + 1)
            elif k == STAR:
                if ch != "/":
                    nxt.add(i)
            elif k == DSTAR:
                nxt.add(i)
            elif k == DIRS:  # (.*/)? : anything, and past it after a '/'
                nxt.add(_inside(i))
                if ch == "/":
                    nxt.add(i + 1)
            elif k == SLASH_REST and ch == "/":  # (/.*)? : after its '/', anything to the end
                nxt.add(-1)
        if not nxt:
            return False
        states = _closure(toks, nxt)
    return end in states or -1 in states


class Glob:
    """One gitignore pattern body, anchored (matched against the whole relative path) or not (matched
    against the last part of it when it has no '/', else as ``(?:.*/)?glob``)."""

    def __init__(self, body: str, anchored: bool) -> None:
        toks = tokens(body)
        self.basename = not anchored and not any(t.kind in (DIRS, DSTAR, SLASH_REST) for t in toks) \
            and not any(t.kind == LIT and t.char == "/" for t in toks)
        if not anchored and not self.basename:
            toks = [Token(DIRS, regex="(?:.*/)?"), *toks]
        self.tokens = toks
        self.safe = sum(t.kind in _UNBOUNDED for t in toks) <= 1
        self.regex = "".join(t.regex for t in toks)

    def match(self, rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1] if self.basename else rel
        return nfa_match(self.tokens, name)
