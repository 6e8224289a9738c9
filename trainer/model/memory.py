"""An Atlas-style associative memory for a transformer block (the Atlas 1B build plan §1.2): per layer a matrix memory
``M`` [B, d_value, d_key] and a surprise/momentum state ``S`` of the same shape, written chunk by chunk
from the layer's keys and values and read by its queries. The block mixes the read with attention
through a learned gate (trainer/model/gpt.py).

What it follows:

- Titans (Behrouz, Zhong, Mirrokni 2024, arXiv:2501.00663): a memory updated at test time by gradient
  descent on an associative loss ``||M phi(k) - v||^2``, with momentum ("surprise") ``S`` and a
  learned forget gate, all three data-dependent per token (eq. 13-14):
  ``S_t = eta_t S_{t-1} - theta_t grad_t`` and ``M_t = (1 - alpha_t) M_{t-1} + S_t``; the read is
  ``y_t = M_t phi(q_t)``. Keys and queries are L2-normalised, as there.
- Atlas (Behrouz et al. 2025, arXiv:2505.23735): the Omega rule, an objective over a sliding window
  of the last ``context_window`` tokens, ``grad_t = sum_{j<c} gamma_j grad_{t-j}``, and polynomial
  feature maps ``phi`` of degree ``poly_degree`` on keys and queries.
- TNT (Li et al. 2025, "TNT: Improving Chunkwise Training for Test-Time Memorization",
  arXiv:2511.07343) and Titans §3.2: chunked training. Inside a chunk every token's gradient is taken at the memory as it
  was at the chunk's start, so a chunk is a few matmuls instead of a sequential scan; the chunk size
  is therefore the memory's update granularity. TNT trains with large chunks first (throughput),
  then fine-tunes with small ones at the same sequence length: ``training.stage1_chunk_size`` /
  ``stage2_chunk_size`` (the Atlas 1B build plan §1.4: 2048 / 256).

Where this simplifies:

- the memory is linear (a matrix), not Titans' deep MLP; its start state is zero at each sequence,
  not learned; TNT's hierarchy (a global memory plus periodically reset local ones) is not built,
  only its two-stage chunk schedule on the one memory;
- ``phi`` is an element-wise polynomial ``sum_{i<=p} a_i x^i`` with learned ``a_i``, not Atlas' full
  monomial expansion: it keeps the key width (so M stays d_value x d_key, as the Atlas 1B build plan sizes it) but
  does not raise the memory's capacity the way the full expansion does;
- the Omega weights ``gamma_j`` are learned per offset, not per token, and the window does not reach
  back across sequences (a carried state is ``(M, S)`` only);
- one error per token ``e_i = M_{chunk(i)} phi(k_i) - v_i`` (the factor 2 of the gradient folded into
  theta), computed at the start state of token i's own chunk, also when a later chunk's window sums it;
- theta is divided by the chunk's length n (:func:`step_divisor`: the chunk size, or the context when
  chunks are longer, so a partial chunk's step is partial and the memory stays causal), so a chunk is one step of mean-gradient
  descent on its tokens (TTT's mini-batch view, Sun et al. 2024, arXiv:2407.04620), with the Omega
  weights summing to at most 1. Summed stale gradients (Titans' form) make a chunk's step grow with
  its length and diverge at the Atlas 1B build plan's 2048-token chunks; the 300M run's norm ceiling of 50.0 was
  likely holding exactly that down. The cost: stage 2's smaller chunks take more, smaller steps;
- ``max_norm`` (off by default; the 300M run's ceiling was 50.0) rescales M at chunk ends only.

The chunked form. For a chunk of n tokens starting from (M0, S0), with ``LE_t = sum_{s<=t} log eta_s``
and ``LA_t = sum_{s<=t} log(1 - alpha_s)``, unrolling both recurrences gives
``M_t = e^{LA_t} M0 + c_t S0 - sum_k R_{t,k} e_k phi(k_k)^T`` with ``P_{s,i} = e^{LE_s - LE_i}``,
``Q_{t,s} = e^{LA_t - LA_s}`` (lower-triangular, entries <= 1, so never overflow),
``W = Q (P diag theta)``, ``R = W Gamma`` (Gamma the band matrix of the gamma_j) and
``c = Q e^{LE}``; the read is ``y_t = M_t phi(q_t)``, never forming M_t for each t.
:func:`memory_reference` computes the same numbers token by token; the tests hold the two equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class MemoryState:
    """One layer's memory after a sequence: ``M`` and ``S``, each [B, d_value, d_key], fp32."""

    M: torch.Tensor
    S: torch.Tensor

    def detach(self) -> MemoryState:
        return MemoryState(self.M.detach(), self.S.detach())


@dataclass(frozen=True)
class Projected:
    """Per-token inputs of the memory computation, fp32: features, values, gates (log space)."""

    phi_q: torch.Tensor  # [B, T, dk]
    phi_k: torch.Tensor  # [B, T, dk]
    v: torch.Tensor  # [B, T, dv]
    log_eta: torch.Tensor  # [B, T]   log of the momentum gate, <= 0
    log_keep: torch.Tensor  # [B, T]  log(1 - alpha), <= 0
    theta: torch.Tensor  # [B, T]     the inner learning rate, in (0, 1)
    gamma: torch.Tensor  # [c]        Omega-rule weights of offsets 0..c-1, summing to at most 1


def logit(p: float) -> float:
    return math.log(p / (1 - p))


class AtlasMemory(nn.Module):
    """Projections, gates and features of one layer's memory; :meth:`forward` runs the chunked update.

    Parameters (``ModelSpec.memory_params_per_layer`` counts them): ``q``, ``k``: d_model x d_key; ``v``:
    d_model x d_value; ``out``: d_value x d_model; ``gates``: d_model x 3 + 3 (alpha, eta, theta per
    token); ``poly``: poly_degree; ``omega``: context_window; ``gate``: d_model x d_model + d_model,
    the per-channel mix with attention (:meth:`mix`)."""

    def __init__(self, d_model: int, d_key: int, d_value: int, poly_degree: int, context_window: int,
                 gate_init: float = 0.5, span: int | None = None) -> None:
        super().__init__()
        self.gate_init = gate_init
        self.gate = nn.Linear(d_model, d_model, bias=True)  # the attention/memory mix, per channel
        self.d_key, self.d_value, self.window = d_key, d_value, context_window
        self.q = nn.Linear(d_model, d_key, bias=False)
        self.k = nn.Linear(d_model, d_key, bias=False)
        self.v = nn.Linear(d_model, d_value, bias=False)
        self.out = nn.Linear(d_value, d_model, bias=False)
        self.gates = nn.Linear(d_model, 3, bias=True)
        self.poly = nn.Parameter(torch.empty(poly_degree))
        self.omega = nn.Parameter(torch.empty(context_window))
        self.chunk_size = 2048
        """Update granularity; the trainer sets it per stage (not a parameter, not in the state dict)."""
        self.max_norm: float | None = None
        self.span = span  # the model's context (step_divisor)
        self.reset_memory_parameters()

    def reset_memory_parameters(self) -> None:
        """Called by the model after its generic init, which knows nothing of these parameters."""
        d = self.q.in_features
        for lin in (self.q, self.k, self.v):
            nn.init.normal_(lin.weight, std=d**-0.5)
        nn.init.normal_(self.out.weight, std=self.d_value**-0.5 * 0.5)
        nn.init.zeros_(self.gates.weight)
        nn.init.zeros_(self.gate.weight)  # every token starts at the same share, gate_init
        nn.init.constant_(self.gate.bias, logit(self.gate_init))
        with torch.no_grad():
            # alpha ~ 0.001 (M forgets over ~1000 tokens), eta ~ 0.88 (momentum over ~8 tokens),
            # theta ~ 0.12 (a chunk's mean-gradient step, see theta in the module docstring).
            self.gates.bias.copy_(torch.tensor([-7.0, 2.0, -2.0]))
            # phi(x) = x + x^2/2! + ... at init (the first terms of Atlas' exponential-kernel view).
            self.poly.copy_(torch.tensor([1.0 / math.factorial(i + 1) for i in range(self.poly.numel())]))
            self.omega.fill_(2.0)  # gamma_j = sigmoid(2) / c: the window's weights sum to 0.88

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """phi: element-wise polynomial of an L2-normalised vector, re-normalised (keeps reads bounded)."""
        x = F.normalize(x, dim=-1)
        out = torch.zeros_like(x)
        power = torch.ones_like(x)
        for i in range(self.poly.numel()):
            power = power * x
            out = out + self.poly[i] * power
        return F.normalize(out, dim=-1)

    def project(self, x: torch.Tensor) -> Projected:
        x32 = x.float()
        g = F.linear(x32, self.gates.weight.float(), self.gates.bias.float())
        return Projected(
            phi_q=self.features(F.linear(x32, self.q.weight.float())),
            phi_k=self.features(F.linear(x32, self.k.weight.float())),
            v=F.linear(x32, self.v.weight.float()),
            log_eta=F.logsigmoid(g[..., 1]), log_keep=F.logsigmoid(-g[..., 0]), theta=torch.sigmoid(g[..., 2]),
            gamma=torch.sigmoid(self.omega.float()) / self.window)

    def mix(self, h: torch.Tensor, attn: torch.Tensor, mem_m: torch.Tensor | None, mem_s: torch.Tensor | None,
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(1 - g) * attn + g * read`` with ``g = sigmoid(gate(h))`` per token and channel, h the
        block's normalised input; also the final M and S and g's mean (the memory's share, watched for
        collapse). Plain tensors in and out, so a compiled block stays one graph."""
        state = MemoryState(mem_m, mem_s) if mem_m is not None and mem_s is not None else None
        read, new = self(h, state)
        g = torch.sigmoid(self.gate(h))
        return attn + g * (read.to(attn.dtype) - attn), new.M, new.S, g.detach().float().mean()

    def forward(self, x: torch.Tensor, state: MemoryState | None = None) -> tuple[torch.Tensor, MemoryState]:
        """The memory's read for each token of x [B, T, d_model] (projected back to d_model) and the
        state after the last token. The whole computation runs in fp32, outside autocast."""
        with torch.autocast(x.device.type, enabled=False):
            p = self.project(x)
            y, new = memory_chunked(p, state, self.chunk_size, self.max_norm, self.span)
            return F.linear(y.to(self.out.weight.dtype), self.out.weight), new

    def new_carry(self, b: int, device: torch.device | str) -> MemoryCarry:
        """A zero start for ``b`` decoding rows (:func:`memory_step`)."""
        def z(*shape: int) -> torch.Tensor:
            return torch.zeros(b, *shape, device=device, dtype=torch.float32)
        return MemoryCarry(z(self.d_value, self.d_key), z(self.d_value, self.d_key), z(self.d_value, self.d_key),
                           z(self.window - 1, self.d_value), z(self.window - 1, self.d_key),
                           torch.zeros(b, dtype=torch.long, device=device))

    def mix_step(self, h: torch.Tensor, attn: torch.Tensor, carry: MemoryCarry) -> torch.Tensor:
        """:meth:`mix` for the next tokens of decoding rows, continuing ``carry`` (updated in place)."""
        with torch.autocast(h.device.type, enabled=False):
            y = memory_step(self.project(h), carry, self.chunk_size, self.max_norm, self.span)
            read = F.linear(y.to(self.out.weight.dtype), self.out.weight)
        g = torch.sigmoid(self.gate(h))
        return attn + g * (read.to(attn.dtype) - attn)


def zero_state(b: int, d_value: int, d_key: int, device: torch.device,
               dtype: torch.dtype = torch.float32) -> MemoryState:
    z = torch.zeros(b, d_value, d_key, device=device, dtype=dtype)
    return MemoryState(z, z.clone())


def clamp_norm(m: torch.Tensor, max_norm: float | None) -> torch.Tensor:
    if max_norm is None:
        return m
    n = m.flatten(1).norm(dim=1).clamp_min(1e-12)
    return m * (max_norm / n).clamp(max=1.0)[:, None, None]


def _band(w: torch.Tensor, gamma: torch.Tensor, m: int) -> torch.Tensor:
    """``w @ Gamma`` for the band matrix ``Gamma[i, k] = gamma[i + m - k]`` (0 <= i + m - k < c):
    c shifted, weighted copies of w's columns instead of a dense n x (m + n) matmul. w is
    [..., n]; the result is [..., m + n] (column k is the error of token k of the extended chunk,
    whose first m are the previous chunk's last tokens)."""
    c = gamma.numel()
    n = w.shape[-1]
    padded = F.pad(w, (m, c - 1))  # column i of w is column i + m here
    out = torch.zeros(*w.shape[:-1], m + n, device=w.device, dtype=w.dtype)
    for j in range(c):
        out = out + gamma[j] * padded[..., j : j + m + n]
    return out


def _segments(p: Projected, m_state: torch.Tensor, s_state: torch.Tensor, m_err: torch.Tensor,
              tail_e: torch.Tensor, tail_k: torch.Tensor, offset: int, chunk: int, div: int,
              max_norm: float | None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], int]:
    """The chunked computation from any point of a chunk: ``offset`` tokens of the current chunk are
    behind, ``(m_state, s_state)`` are the states after the last of them, ``m_err`` the memory at the
    chunk's start (every error of a chunk is taken there) and ``tail_e``/``tail_k`` the errors and keys
    of the last tokens the Omega window reaches back to. Returns the reads, the same six values after
    the last token (M clamped at each completed chunk) and the new offset. Each token's step is
    ``theta / div``."""
    b, t, dk = p.phi_k.shape
    c = p.gamma.numel()
    reads = []
    s0 = 0
    while s0 < t:
        n = min(t - s0, chunk - offset)
        sl = slice(s0, s0 + n)
        phi_q, phi_k, v = p.phi_q[:, sl], p.phi_k[:, sl], p.v[:, sl]
        e = torch.einsum("bvk,bnk->bnv", m_err, phi_k) - v  # errors at the chunk's start state
        e_ext, k_ext = torch.cat([tail_e, e], 1), torch.cat([tail_k, phi_k], 1)
        m = e_ext.shape[1] - n
        le, la = p.log_eta[:, sl].cumsum(1), p.log_keep[:, sl].cumsum(1)
        theta = p.theta[:, sl] / div  # one mean-gradient step per chunk (module docstring)
        causal = torch.ones(n, n, dtype=torch.bool, device=v.device).tril()
        decay_s = torch.exp((le[:, :, None] - le[:, None, :]).masked_fill(~causal, -math.inf))  # P [B, n, n]
        decay_m = torch.exp((la[:, :, None] - la[:, None, :]).masked_fill(~causal, -math.inf))  # Q
        p_theta = decay_s * theta[:, None, :]
        w = decay_m @ p_theta  # W [B, n, n]
        r = _band(w, p.gamma, m)  # [B, n, m + n]
        c_s0 = (decay_m @ le.exp()[:, :, None]).squeeze(-1)  # [B, n]
        scores = torch.einsum("bnk,bjk->bnj", phi_q, k_ext)  # phi(q_t) . phi(k_k)
        y = (la.exp()[:, :, None] * torch.einsum("bvk,bnk->bnv", m_state, phi_q)
             + c_s0[:, :, None] * torch.einsum("bvk,bnk->bnv", s_state, phi_q)
             - (r * scores) @ e_ext)
        reads.append(y)
        # The state after the segment's last token.
        r_s = _band(p_theta[:, -1:, :], p.gamma, m).squeeze(1)  # [B, m + n]
        r_m = r[:, -1]
        s_new = le[:, -1, None, None].exp() * s_state - torch.einsum("bj,bjv,bjk->bvk", r_s, e_ext, k_ext)
        m_new = (la[:, -1, None, None].exp() * m_state + c_s0[:, -1, None, None] * s_state
                 - torch.einsum("bj,bjv,bjk->bvk", r_m, e_ext, k_ext))
        offset += n
        if offset == chunk:  # a completed chunk: the next one takes its errors at this state
            m_new, offset = clamp_norm(m_new, max_norm), 0
            m_err = m_new
        m_state, s_state = m_new, s_new
        keep = min(c - 1, e_ext.shape[1])
        tail_e, tail_k = e_ext[:, e_ext.shape[1] - keep :], k_ext[:, k_ext.shape[1] - keep :]
        s0 += n
    return torch.cat(reads, 1), (m_state, s_state, m_err, tail_e, tail_k), offset


def step_divisor(chunk: int, span: int | None) -> int:
    """What theta is divided by: the chunk size, or the model's context when chunks never fill it. A
    fixed number, so a token's read never depends on how many tokens follow it in its chunk (the
    memory is causal, and decoding with a cache gives the forward pass's numbers); at full length
    with chunks that divide it, it is each chunk's length, as before."""
    return min(chunk, span) if span else chunk


def memory_chunked(p: Projected, state: MemoryState | None, chunk: int, max_norm: float | None = None,
                   span: int | None = None) -> tuple[torch.Tensor, MemoryState]:
    """Reads [B, T, dv] and the final state, chunk by chunk (see the module docstring for the algebra)."""
    b, t, dk = p.phi_k.shape
    dv = p.v.shape[-1]
    st = state or zero_state(b, dv, dk, p.v.device, p.v.dtype)
    m0, s0 = st.M.to(p.v.dtype), st.S.to(p.v.dtype)
    y, (m_state, s_state, _, _, _), offset = _segments(
        p, m0, s0, m0, p.v.new_zeros(b, 0, dv), p.v.new_zeros(b, 0, dk), 0, chunk, step_divisor(chunk, span),
        max_norm)
    if offset:  # the last chunk was partial: its state is clamped too
        m_state = clamp_norm(m_state, max_norm)
    return y, MemoryState(m_state, s_state)


@dataclass
class MemoryCarry:
    """A decoding batch's memory between steps, per row: M and S after the last token, M at its
    chunk's start (``m_err``), the errors and keys of the last ``context_window - 1`` tokens (zero
    before the first: a zero error adds nothing) and the tokens into the current chunk. The tensors
    are views of the cache's storage and are written in place."""

    M: torch.Tensor  # [B, dv, dk]
    S: torch.Tensor
    m_err: torch.Tensor
    tail_e: torch.Tensor  # [B, c - 1, dv]
    tail_k: torch.Tensor  # [B, c - 1, dk]
    offset: torch.Tensor  # [B] long


def memory_step(p: Projected, carry: MemoryCarry, chunk: int, max_norm: float | None = None,
                span: int | None = None) -> torch.Tensor:
    """Reads [B, T, dv] of the next T tokens of each row, continuing ``carry`` (updated in place):
    the same numbers as :func:`memory_chunked` over the whole sequence. T > 1 needs the rows at the
    same offset (a prompt); one token per row may be at any."""
    div = step_divisor(chunk, span)
    offsets = carry.offset.tolist()
    state = (carry.M, carry.S, carry.m_err, carry.tail_e, carry.tail_k)
    if p.v.shape[1] > 1 or len(set(offsets)) == 1:
        if len(set(offsets)) != 1:
            raise ValueError("several tokens per row need the rows at the same point of their chunk")
        y, new, offset = _segments(p, *state, offsets[0], chunk, div, max_norm)
        carry.offset.fill_(offset)
    else:  # one token per row, rows at different points: no chunk ends inside; then per row
        y, new, _ = _segments(p, *state, 0, chunk + 1, div, max_norm)
        ends = carry.offset + 1 == chunk
        m = torch.where(ends[:, None, None], clamp_norm(new[0], max_norm), new[0])
        new = (m, new[1], torch.where(ends[:, None, None], m, new[2]), new[3], new[4])
        carry.offset.copy_(torch.where(ends, 0, carry.offset + 1))
    for dst, src in zip(state, new, strict=True):
        dst.copy_(src)
    return y


def memory_reference(p: Projected, state: MemoryState | None, chunk: int, max_norm: float | None = None,
                     span: int | None = None) -> tuple[torch.Tensor, MemoryState]:
    """The same computation one token at a time, written as the recurrences read (for the tests)."""
    b, t, dk = p.phi_k.shape
    dv = p.v.shape[-1]
    st = state or zero_state(b, dv, dk, p.v.device, p.v.dtype)
    m_state, s_state = st.M.to(p.v.dtype).clone(), st.S.to(p.v.dtype).clone()
    c = p.gamma.numel()
    grads: list[torch.Tensor] = []  # per-token gradient e_i phi(k_i)^T
    m_chunk = m_state
    n = step_divisor(chunk, span)
    reads = []
    for i in range(t):
        if i % chunk == 0:
            m_chunk = m_state
        e = torch.einsum("bvk,bk->bv", m_chunk, p.phi_k[:, i]) - p.v[:, i]
        grads.append(torch.einsum("bv,bk->bvk", e, p.phi_k[:, i]))
        g = sum(p.gamma[j] * grads[i - j] for j in range(min(c, i + 1)))
        s_state = p.log_eta[:, i, None, None].exp() * s_state - p.theta[:, i, None, None] / n * g
        m_state = p.log_keep[:, i, None, None].exp() * m_state + s_state
        reads.append(torch.einsum("bvk,bk->bv", m_state, p.phi_q[:, i]))
        if (i + 1) % chunk == 0 or i == t - 1:
            m_state = clamp_norm(m_state, max_norm)
    return torch.stack(reads, 1), MemoryState(m_state, s_state)


# ---------------------------------------------------------------------------------------------
# Watching the memory across validations (the Atlas 1B build plan Appendix A: gates collapsed 50 % -> 0.7 %, M_std
# constant at 0.0282, M_norm pinned at its 50.0 ceiling; nothing raised a flag).


@dataclass(frozen=True)
class MemoryAlert:
    kind: str  # "gate_collapse" or "static_memory"
    layer: int
    value: float  # the share (gate_collapse) or M_std (static_memory) now
    detail: str  # one line: why


class MemoryWatch:
    """Per layer, the memory share, M_std and M_norm of each validation; :meth:`update` returns the
    alerts that start at this validation. An alert fires once and re-arms only after its condition
    has cleared, so a collapsed layer is reported, not repeated every validation.

    - gate_collapse: the share is below ``share_floor``, or fell at each of the last ``fall_n``
      validations and by at least ``fall_drop`` of where it was (the 300M run: 50 -> 26 -> 12 -> 4 %);
    - static_memory: M_std moved less than ``static_tol`` (relative) at each of the last ``static_n``
      validations, or M_norm sat within 1 % of ``max_norm`` for as long."""

    def __init__(self, share_floor: float = 0.05, fall_n: int = 5, fall_drop: float = 0.5, static_n: int = 3,
                 static_tol: float = 1e-3, max_norm: float | None = None) -> None:
        self.share_floor, self.fall_n, self.fall_drop = share_floor, fall_n, fall_drop
        self.static_n, self.static_tol, self.max_norm = static_n, static_tol, max_norm
        self.shares: dict[str, list[float]] = {}
        self.stds: dict[str, list[float]] = {}
        self.norms: dict[str, list[float]] = {}
        self.active: list[str] = []  # "kind:layer" of the alerts in force

    def _push(self, hist: dict[str, list[float]], layer: int, value: float) -> list[float]:
        h = hist.setdefault(str(layer), [])
        h.append(float(value))
        del h[: -(max(self.fall_n, self.static_n) + 1)]
        return h

    def _collapse(self, h: list[float]) -> str | None:
        if h[-1] < self.share_floor:
            return f"memory share {100 * h[-1]:.2f} % is below {100 * self.share_floor:.2f} %"
        w = h[-(self.fall_n + 1):]
        if len(w) == self.fall_n + 1 and all(b < a for a, b in zip(w, w[1:], strict=False)) \
                and w[-1] <= (1 - self.fall_drop) * w[0]:
            return (f"memory share fell at each of the last {self.fall_n} validations: "
                    + " -> ".join(f"{100 * v:.1f} %" for v in w))
        return None

    def _static(self, stds: list[float], norms: list[float]) -> str | None:
        w = stds[-(self.static_n + 1):]
        if len(w) == self.static_n + 1 and all(abs(b - a) <= self.static_tol * max(abs(a), 1e-12)
                                               for a, b in zip(w, w[1:], strict=False)):
            return f"M_std has not moved for {self.static_n} validations ({w[-1]:.4g})"
        n = norms[-(self.static_n + 1):]
        if self.max_norm and len(n) == self.static_n + 1 and all(v >= 0.99 * self.max_norm for v in n):
            return f"M_norm has sat at its ceiling {self.max_norm:g} for {self.static_n} validations"
        return None

    def update(self, shares: list[float], m_std: list[float], m_norm: list[float]) -> list[MemoryAlert]:
        out = []
        for layer, (share, std, norm) in enumerate(zip(shares, m_std, m_norm, strict=True)):
            checks = (("gate_collapse", share, self._collapse(self._push(self.shares, layer, share))),
                      ("static_memory", std, self._static(self._push(self.stds, layer, std),
                                                          self._push(self.norms, layer, norm))))
            for kind, value, why in checks:
                key = f"{kind}:{layer}"
                if why is None:
                    if key in self.active:
                        self.active.remove(key)
                elif key not in self.active:
                    self.active.append(key)
                    out.append(MemoryAlert(kind, layer, value, why))
        return out

    def state_dict(self) -> dict:
        """JSON-able: it travels in the checkpoint's meta.json."""
        return {"shares": self.shares, "stds": self.stds, "norms": self.norms, "active": list(self.active)}

    def load_state_dict(self, state: dict) -> None:
        self.shares = {str(k): [float(x) for x in v] for k, v in state.get("shares", {}).items()}
        self.stds = {str(k): [float(x) for x in v] for k, v in state.get("stds", {}).items()}
        self.norms = {str(k): [float(x) for x in v] for k, v in state.get("norms", {}).items()}
        self.active = [str(a) for a in state.get("active", [])]
