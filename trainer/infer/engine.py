"""The scheduler of ``trainer.serve``: one thread that steps every active sequence together.

Requests add :class:`Sequence` objects (one per prompt and choice); the thread admits them into free
rows of the :class:`~trainer.infer.kvcache.KVCache` (prefill, first token), then runs decode steps for all of
them at once, and puts each sequence's new text on its request's queue as :class:`Delta` objects. A
request's handler thread only waits on that queue, so any number of clients can be connected while
``max_batch`` sequences decode and the rest wait their turn in order.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from dataclasses import dataclass, field

import torch

from trainer.data.loader import Tokenizer
from trainer.infer.kvcache import KVCache, SamplingParams, sample
from trainer.model.gpt import GPT

log = logging.getLogger("trainer.serve")


@dataclass(frozen=True)
class Delta:
    """New text of choice ``index``; ``finish_reason`` set on its last delta ("stop", "length" or
    "error")."""

    index: int
    text: str
    finish_reason: str | None = None
    completion_tokens: int = 0


@dataclass(eq=False)
class Sequence:
    index: int
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stop: tuple[str, ...]
    out: queue.Queue[Delta]
    generated: list[int] = field(default_factory=list)
    emitted: int = 0  # characters of the decoded text already sent
    ignore_eos: bool = False  # go on past end-of-text (vLLM's extension; benchmarks use it)
    cancelled: bool = False
    row: int = -1


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of ``text`` not to send yet: an incomplete UTF-8 character (decoded as
    U+FFFD) or the start of a stop sequence that the next tokens may complete."""
    n = len(text) - len(text.rstrip("\ufffd"))
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                n = max(n, k)
                break
    return n


class Engine:
    """Owns the model and the cache; everything that touches them runs on its one thread."""

    def __init__(self, model: GPT, tokenizer: Tokenizer, *, max_batch: int = 8, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.cache = KVCache(model, max_batch, device=device, dtype=dtype)
        self.max_len = self.cache.max_len
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._pending: collections.deque[Sequence] = collections.deque()
        self._active: list[Sequence] = []  # index = cache row
        self._cond = threading.Condition()
        self._stopping = False
        self.peak_batch = 0  # the most sequences one decode step has advanced together
        self._thread = threading.Thread(target=self._loop, name="serve-scheduler", daemon=True)

    def start(self) -> Engine:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def submit(self, seqs: list[Sequence]) -> None:
        with self._cond:
            self._pending.extend(seqs)
            self._cond.notify_all()

    def cancel(self, seqs: list[Sequence]) -> None:
        """The client went away: its sequences stop at the next step."""
        for s in seqs:
            s.cancelled = True

    # --- the scheduler thread -----------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._pending and not self._active:
                    self._cond.wait()
                if self._stopping:
                    return
                admit = []
                while self._pending and len(self._active) + len(admit) < self.cache.max_batch:
                    admit.append(self._pending.popleft())
            try:
                self._step(admit)
            except Exception:  # a bug or out of memory: fail these requests, keep serving the next ones
                log.exception("decode step failed")
                for seq in self._active + admit:
                    seq.out.put(Delta(seq.index, "", "error", len(seq.generated)))
                self._active = []
                self.cache.n = 0
                self.cache.lengths = [0] * self.cache.max_batch

    def _step(self, admit: list[Sequence]) -> None:
        for seq in admit:
            if seq.cancelled:
                continue
            row, logits = self.cache.prefill(seq.prompt)
            seq.row = row
            self._active.append(seq)
            token = sample(logits.unsqueeze(0), [seq.params], self.generator)[0]
            self._advance(seq, token)
        for seq in [s for s in self._active if s.cancelled]:
            self._release(seq)
        if not self._active:
            return
        self.peak_batch = max(self.peak_batch, len(self._active))
        logits = self.cache.decode([s.generated[-1] for s in self._active])
        tokens = sample(logits, [s.params for s in self._active], self.generator)
        for seq, token in list(zip(self._active, tokens, strict=True)):
            self._advance(seq, token)

    def _advance(self, seq: Sequence, token: int) -> None:
        """Take the sampled ``token`` for ``seq``; send what is new; release it when finished."""
        finish = None
        if token == self.tokenizer.eot and not seq.ignore_eos:
            finish = "stop"
        else:
            seq.generated.append(token)
            if len(seq.generated) >= seq.max_tokens or self.cache.lengths[seq.row] >= self.max_len:
                finish = "length"
        text = self.tokenizer.decode(seq.generated)
        end = len(text)
        hits = [i for i in (text.find(s, max(0, seq.emitted - len(s))) for s in seq.stop) if i >= 0]
        if hits:
            end, finish = min(hits), "stop"
        elif finish is None:
            end -= _held_back(text, seq.stop)
        delta = text[seq.emitted:end] if end > seq.emitted else ""
        seq.emitted = max(seq.emitted, end)
        seq.out.put(Delta(seq.index, delta, finish, len(seq.generated)))
        if finish:
            self._release(seq)

    def _release(self, seq: Sequence) -> None:
        moved = self.cache.release(seq.row)
        last = self._active.pop()
        if moved is not None:
            last.row = seq.row
            self._active[seq.row] = last
        seq.row = -1
