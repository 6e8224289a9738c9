"""Batched decoding with a key/value cache for the trainer's GPT (the engine behind ``trainer.serve``).

``GPT.forward`` recomputes the whole context for every new token; here each sequence's keys and values
are kept per attention layer, so a decode step costs one token per sequence, and every active sequence
advances in the same step (one matmul per weight for the whole batch).

The decoding runs the model's own forward code (``GPT.forward(idx, cache=...)``): the cache tells it
where the new tokens sit (learned or rotary positions), and each attention layer hands its q, k, v
to :meth:`KVCache.attend` instead of attending over the new tokens alone. So every architecture the
trainer builds decodes as it trains: grouped KV heads, QK-norm, any MLP, soft-capped or untied heads,
the refinement steps (each step's blocks are attention layers of their own here) and the Atlas memory
(its M and S carried per row, :class:`trainer.model.memory.MemoryCarry`).

The cache holds ``max_batch`` rows; the active sequences always occupy rows ``0..n-1`` (a finished one
is replaced by the last row), so a step reads plain slices, never a gather. Rows of different lengths
share a step through a key mask.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.model.gpt import GPT
from trainer.model.memory import AtlasMemory, MemoryCarry


class _Layer:
    """What one attention layer of the model sees of the cache during a call."""

    def __init__(self, cache: KVCache, index: int) -> None:
        self.cache, self.index = cache, index

    @property
    def pos(self) -> torch.Tensor:
        return self.cache.pos

    @property
    def memory(self) -> MemoryCarry:
        carry = self.cache.memory[self.index]
        rows = self.cache.rows
        return MemoryCarry(*(getattr(carry, f.name)[rows] for f in dataclasses.fields(MemoryCarry)))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.cache.attend(self.index, q, k, v)


class KVCache:
    """Keys and values of up to ``max_batch`` sequences, each up to the model's context."""

    def __init__(self, model: GPT, max_batch: int, *, device: torch.device | str, dtype: torch.dtype,
                 max_len: int | None = None) -> None:
        s = model.shape
        self.model = model
        self.max_batch = max_batch
        self.max_len = min(max_len or s.max_seq_len, s.max_seq_len)
        self.n_layers = s.n_layers + s.refine_steps * s.refine_layers
        self.n_heads, self.kv_heads = s.n_heads, s.kv_heads
        shape = (self.n_layers, max_batch, s.kv_heads, self.max_len, s.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.memory: dict[int, MemoryCarry] = {
            i: b.memory.new_carry(max_batch, device) for i, b in enumerate(model.blocks)
            if isinstance(b.memory, AtlasMemory)}
        self.layers = [_Layer(self, i) for i in range(self.n_layers)]
        self.lengths = [0] * max_batch  # tokens held per row
        self.n = 0  # active rows: 0..n-1
        self.device = torch.device(device)
        self.dtype = dtype
        # The call in progress: its rows, the new tokens' positions, and (decode) the key mask.
        self.rows = slice(0, 0)
        self.pos = torch.zeros(0, 0, dtype=torch.long)
        self._mask: torch.Tensor | None = None
        self._t_max = 0

    def free_rows(self) -> int:
        return self.max_batch - self.n

    def layer(self, i: int) -> _Layer:
        return self.layers[i]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Keep the new keys and values at their positions; attention of q over the row's keys so far."""
        kw: dict[str, object] = {"enable_gqa": True} if self.kv_heads != self.n_heads else {}
        if self._mask is None:  # a prompt into one empty row: plain causal attention over it
            row, t = self.rows.start, k.shape[2]
            self.k[layer, row, :, :t] = k[0]
            self.v[layer, row, :, :t] = v[0]
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)  # type: ignore[arg-type]
        n = self.rows.stop
        rows, at = torch.arange(n, device=self.device), self.pos[:, 0]
        self.k[layer, rows, :, at] = k[:, :, 0]
        self.v[layer, rows, :, at] = v[:, :, 0]
        keys, values = self.k[layer, :n, :, : self._t_max], self.v[layer, :n, :, : self._t_max]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=self._mask, **kw)  # type: ignore[arg-type]

    @torch.no_grad()
    def prefill(self, tokens: list[int]) -> tuple[int, torch.Tensor]:
        """Take a new sequence into the next free row; returns (row, logits [V] after its last token)."""
        if self.n >= self.max_batch:
            raise RuntimeError("the cache is full")
        t = len(tokens)
        if not 0 < t <= self.max_len:
            raise ValueError(f"a prompt of {t} tokens does not fit a context of {self.max_len}")
        row = self.n
        for carry in self.memory.values():
            for f in dataclasses.fields(MemoryCarry):
                getattr(carry, f.name)[row].zero_()
        self.rows, self._mask = slice(row, row + 1), None
        self.pos = torch.arange(t, device=self.device).unsqueeze(0)
        logits = self.model(torch.tensor([tokens], device=self.device), cache=self)
        self.lengths[row] = t
        self.n += 1
        assert isinstance(logits, torch.Tensor)
        return row, logits[0]

    @torch.no_grad()
    def decode(self, tokens: list[int]) -> torch.Tensor:
        """One step for every active row: ``tokens[i]`` is row i's newest token (not yet in the cache).
        Returns logits [n, V]. A row that is full (``lengths == max_len``) must be released first."""
        n = self.n
        assert len(tokens) == n and n > 0
        lengths = torch.tensor(self.lengths[:n], device=self.device)
        if int(lengths.max()) >= self.max_len:
            raise ValueError("a sequence reached the end of the context")
        self._t_max = int(lengths.max()) + 1
        # key j of row i is visible when j <= length_i (its own new key included)
        self._mask = (torch.arange(self._t_max, device=self.device).unsqueeze(0)
                      <= lengths.unsqueeze(1))[:, None, None, :]
        self.rows, self.pos = slice(0, n), lengths.unsqueeze(1)
        logits = self.model(torch.tensor(tokens, device=self.device).unsqueeze(1), cache=self)
        for i in range(n):
            self.lengths[i] += 1
        assert isinstance(logits, torch.Tensor)
        return logits

    def release(self, row: int) -> int | None:
        """Free ``row``; the last active row moves into it. Returns the row that moved (its new index is
        ``row``), or None when nothing moved."""
        last = self.n - 1
        assert 0 <= row <= last
        moved = None
        if row != last:
            t = self.lengths[last]
            self.k[:, row, :, :t] = self.k[:, last, :, :t]
            self.v[:, row, :, :t] = self.v[:, last, :, :t]
            for carry in self.memory.values():
                for f in dataclasses.fields(MemoryCarry):
                    x = getattr(carry, f.name)
                    x[row] = x[last]
            self.lengths[row] = t
            moved = last
        self.lengths[last] = 0
        self.n -= 1
        return moved


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off


def sample(logits: torch.Tensor, params: list[SamplingParams], generator: torch.Generator | None = None) -> list[int]:
    """One token per row of ``logits`` [B, V], each row with its own temperature, top-k and top-p."""
    b, vocab = logits.shape
    temps = torch.tensor([max(p.temperature, 1e-6) for p in params], device=logits.device).unsqueeze(1)
    greedy = [p.temperature <= 0 for p in params]
    out = logits.argmax(dim=-1).tolist()
    if all(greedy):
        return out
    sorted_logits, order = torch.sort(logits.float() / temps, dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=logits.device)
    drop = ranks >= top_k.unsqueeze(1)
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    top_p = torch.tensor([p.top_p for p in params], device=logits.device).unsqueeze(1)
    # keep the smallest prefix whose mass reaches top_p (the first token always stays)
    drop = drop | ((probs.cumsum(dim=-1) - probs) >= top_p)
    probs = probs.masked_fill(drop, 0.0)
    picked = torch.multinomial(probs / probs.sum(dim=-1, keepdim=True), 1, generator=generator)
    tokens = order.gather(1, picked).squeeze(1).tolist()
    return [out[i] if greedy[i] else tokens[i] for i in range(b)]
