"""Batched decoding with a key/value cache for the trainer's GPT (the engine behind ``trainer.serve``).

``GPT.forward`` recomputes the whole context for every new token; here each sequence's keys and values
are kept per layer, so a decode step costs one token per sequence, and every active sequence advances
in the same step (one matmul per weight for the whole batch).

The cache holds ``max_batch`` rows; the active sequences always occupy rows ``0..n-1`` (a finished one
is replaced by the last row), so a step reads plain slices, never a gather. Rows of different lengths
share a step through a key mask.

Everything that depends on the model's architecture is in :class:`GPTAdapter` (embedding, the q/k/v
of a layer, the rest of a block, the head). It reads today's GPT (learned positions, multi-head
attention); a model with rotary positions or grouped KV heads needs an adapter that overrides
:meth:`GPTAdapter.embed` / :meth:`GPTAdapter.qkv` (and ``kv_heads``), nothing else here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.model.gpt import GPT


class GPTAdapter:
    """The model's architecture as the cache sees it, for ``trainer.model.gpt.GPT`` as it is today."""

    def __init__(self, model: GPT) -> None:
        self.model = model
        s = model.shape
        self.n_layers, self.n_heads, self.d_model = s.n_layers, s.n_heads, s.d_model
        self.head_dim = s.d_model // s.n_heads
        self.kv_heads = s.n_heads  # grouped-query attention would have fewer
        self.max_seq_len = s.max_seq_len
        self.vocab_size = s.vocab_size

    def embed(self, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """idx, pos [B, T] -> the residual stream [B, T, D]."""
        m = self.model
        return m.wte(idx) + m.wpe(pos)

    def qkv(self, layer: int, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's q, k, v of the normed stream: [B, heads, T, head_dim] each (k, v with kv_heads)."""
        block = self.model.blocks[layer]
        b, t, d = x.shape
        q, k, v = block.attn.qkv(block.ln1(x)).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def finish_block(self, layer: int, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """attn [B, heads, T, head_dim] -> the stream after the whole block."""
        block = self.model.blocks[layer]
        b, _, t, _ = attn.shape
        x = x + block.attn.proj(attn.transpose(1, 2).reshape(b, t, self.d_model))
        return x + block.mlp(block.ln2(x))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, D] (the last position) -> fp32 logits [B, V]."""
        m = self.model
        h = m.ln_f(x)
        return F.linear(h, m.head_weight.to(h.dtype)).float()


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: GPTAdapter, **kw: object) -> torch.Tensor:
    if a.kv_heads != a.n_heads:  # grouped KV heads: torch >= 2.5 broadcasts them itself
        kw["enable_gqa"] = True
    return F.scaled_dot_product_attention(q, k, v, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off


class KVCache:
    """Keys and values of up to ``max_batch`` sequences, each up to the model's context."""

    def __init__(self, adapter: GPTAdapter, max_batch: int, *, device: torch.device | str, dtype: torch.dtype,
                 max_len: int | None = None) -> None:
        self.adapter = adapter
        self.max_batch = max_batch
        self.max_len = max_len or adapter.max_seq_len
        shape = (adapter.n_layers, max_batch, adapter.kv_heads, self.max_len, adapter.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = [0] * max_batch  # tokens held per row
        self.n = 0  # active rows: 0..n-1
        self.device = torch.device(device)
        self.dtype = dtype

    def free_rows(self) -> int:
        return self.max_batch - self.n

    @torch.no_grad()
    def prefill(self, tokens: list[int]) -> tuple[int, torch.Tensor]:
        """Take a new sequence into the next free row; returns (row, logits [V] after its last token)."""
        if self.n >= self.max_batch:
            raise RuntimeError("the cache is full")
        t = len(tokens)
        if not 0 < t <= self.max_len:
            raise ValueError(f"a prompt of {t} tokens does not fit a context of {self.max_len}")
        a, row = self.adapter, self.n
        idx = torch.tensor([tokens], device=self.device)
        pos = torch.arange(t, device=self.device).unsqueeze(0)
        x = a.embed(idx, pos).to(self.dtype)
        for layer in range(a.n_layers):
            q, k, v = a.qkv(layer, x, pos)
            self.k[layer, row, :, :t] = k[0]
            self.v[layer, row, :, :t] = v[0]
            y = _attention(q, k, v, a, is_causal=True)
            x = a.finish_block(layer, x, y)
        self.lengths[row] = t
        self.n += 1
        return row, a.logits(x[:, -1])[0]

    @torch.no_grad()
    def decode(self, tokens: list[int]) -> torch.Tensor:
        """One step for every active row: ``tokens[i]`` is row i's newest token (not yet in the cache).
        Returns logits [n, V]. A row that is full (``lengths == max_len``) must be released first."""
        n, a = self.n, self.adapter
        assert len(tokens) == n and n > 0
        lengths = torch.tensor(self.lengths[:n], device=self.device)
        if int(lengths.max()) >= self.max_len:
            raise ValueError("a sequence reached the end of the context")
        t_max = int(lengths.max()) + 1
        rows = torch.arange(n, device=self.device)
        idx = torch.tensor(tokens, device=self.device).unsqueeze(1)
        pos = lengths.unsqueeze(1)
        # key j of row i is visible when j <= length_i (its own new key included)
        mask = (torch.arange(t_max, device=self.device).unsqueeze(0) <= lengths.unsqueeze(1))[:, None, None, :]
        x = a.embed(idx, pos).to(self.dtype)
        for layer in range(a.n_layers):
            q, k, v = a.qkv(layer, x, pos)
            self.k[layer, rows, :, lengths] = k[:, :, 0]
            self.v[layer, rows, :, lengths] = v[:, :, 0]
            y = _attention(q, self.k[layer, :n, :, :t_max], self.v[layer, :n, :, :t_max], a, attn_mask=mask)
            x = a.finish_block(layer, x, y)
        for i in range(n):
            self.lengths[i] += 1
        return a.logits(x[:, -1])

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
            self.lengths[row] = t
            moved = last
        self.lengths[last] = 0
        self.n -= 1
        return moved


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
