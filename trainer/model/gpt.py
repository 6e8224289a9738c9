"""A GPT in one file: pre-norm transformer of bias-free Linears, built from a
:class:`~trainer.spec.modelspec.ModelSpec`, the description the planner prices. Every choice the spec can
state is built here: learned or rotary positions, LayerNorm (with weights) or parameter-free RMSNorm,
QK-norm, a GELU, SwiGLU or squared-ReLU MLP, grouped-query attention, a tied or untied head and
soft-capped logits. GPT-2 shapes (LayerNorm models) keep GPT-2's initialisation, so ``124m`` is
nanoGPT's model; RMSNorm models take nanochat's (karpathy/nanochat ``nanochat/gpt.py``; see
:meth:`GPT.reset_parameters`).

Speed choices, each measured against nanoGPT's model on the same shapes (see scripts/bench_trainer.py):

- the LM head and cross-entropy are fused and chunked (:class:`FusedLinearCrossEntropy`): the
  B x T x 50k logits are never held at once, and never in fp32. In nanoGPT they are the largest
  tensor of the step (13 GiB at 124M, micro-batch 64) and several full passes over memory;
- attention is ``F.scaled_dot_product_attention`` with ``is_causal``, so PyTorch picks flash /
  cuDNN / memory-efficient kernels by itself;
- each block is compiled in place (``Module.compile``) so the state-dict keys stay plain and one
  compiled graph serves every layer.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.model.memory import AtlasMemory, MemoryState
from trainer.model.refine import refined_output
from trainer.spec.config import ATTENTION_KERNELS
from trainer.spec.modelspec import ModelSpec, unsupported_message

# ---------------------------------------------------------------------------------------------
# Fused, chunked LM head + cross-entropy


def _ce_chunk(logits: torch.Tensor, targets: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed loss of one chunk and d(loss_sum)/d(logits), computed in fp32, grad returned in the
    logits' dtype. ``cap`` > 0 soft-caps the logits first (``cap * tanh(logits / cap)``, whose
    derivative is ``1 - (capped / cap)^2``). Written as plain pointwise/reduction ops so torch.compile
    fuses it into a couple of kernels that read the logits twice and write the gradient once."""
    x = logits.float()
    if cap > 0:
        x = cap * torch.tanh(x / cap)
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    valid = (targets >= 0).unsqueeze(1)
    tgt = targets.clamp_min(0).unsqueeze(1)
    target_logit = x.gather(1, tgt)
    loss_sum = ((lse - target_logit) * valid).sum()
    vocab_ids = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    grad = (torch.exp(x - lse) - (vocab_ids == tgt).float()) * valid
    if cap > 0:
        grad = grad * (1 - (x / cap) ** 2)
    return loss_sum, grad.to(logits.dtype)


def _ce_chunk_loss(logits: torch.Tensor, targets: torch.Tensor, cap: float) -> torch.Tensor:
    x = logits.float()
    if cap > 0:
        x = cap * torch.tanh(x / cap)
    return F.cross_entropy(x, targets, ignore_index=-1, reduction="sum")


_ce_kernels: dict[str, object] = {"grad": _ce_chunk, "loss": _ce_chunk_loss}


def enable_compiled_loss() -> None:
    """Swap in torch.compile'd loss kernels (CUDA); idempotent."""
    if getattr(_ce_kernels["grad"], "_compiled", False):
        return
    grad_k = torch.compile(_ce_chunk, dynamic=False)
    loss_k = torch.compile(_ce_chunk_loss, dynamic=False)
    grad_k._compiled = True  # type: ignore[attr-defined]
    _ce_kernels["grad"], _ce_kernels["loss"] = grad_k, loss_k


class FusedLinearCrossEntropy(torch.autograd.Function):
    """mean CE(h @ W.T, targets) whose gradients are computed chunk by chunk during forward.

    Each chunk's logits live only long enough to produce the chunk's loss, d/dh and its share of
    d/dW, so peak memory is one chunk of logits instead of N x V (plus its fp32 copy and its
    gradient). The matmul FLOPs are the same as forward + backward of a plain head."""

    @staticmethod
    def forward(ctx, h, weight, targets, compute_dtype, chunk_rows, cap):  # type: ignore[override]
        n_rows = h.shape[0]
        w = weight.to(compute_dtype)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros_like(weight, dtype=torch.float32)
        loss_sum = torch.zeros((), device=h.device, dtype=torch.float32)
        kernel = _ce_kernels["grad"]
        for s in range(0, n_rows, chunk_rows):
            hc = h[s : s + chunk_rows].to(compute_dtype)
            logits = hc @ w.t()
            part, g = kernel(logits, targets[s : s + chunk_rows], cap)  # type: ignore[operator]
            loss_sum += part
            grad_h[s : s + chunk_rows] = (g @ w).to(h.dtype)
            grad_w += (g.t() @ hc).float()
        n_valid = (targets >= 0).sum().clamp_min(1).to(torch.float32)
        ctx.save_for_backward(grad_h, grad_w, n_valid)
        ctx.weight_dtype = weight.dtype
        return loss_sum / n_valid

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        grad_h, grad_w, n_valid = ctx.saved_tensors
        scale = grad_out / n_valid
        return (grad_h * scale.to(grad_h.dtype)), (grad_w * scale).to(ctx.weight_dtype), None, None, None, None


def chunked_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk_rows: int = 8192, softcap: float | None = None) -> torch.Tensor:
    """Mean next-token loss of flattened hidden states ``h`` [N, D] against ``targets`` [N]
    (-1 = ignore), logits soft-capped at ``softcap`` when given. Uses bf16 matmuls when autocast is
    on for h's device."""
    cap = float(softcap or 0.0)
    device_type = h.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else h.dtype
    with torch.autocast(device_type, enabled=False):
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            return FusedLinearCrossEntropy.apply(h, weight, targets, dtype, chunk_rows, cap)
        w = weight.to(dtype)
        total = torch.zeros((), device=h.device, dtype=torch.float32)
        for s in range(0, h.shape[0], chunk_rows):
            total += _ce_kernels["loss"](h[s : s + chunk_rows].to(dtype) @ w.t(), targets[s : s + chunk_rows], cap)  # type: ignore[operator]
        return total / (targets >= 0).sum().clamp_min(1)


# ---------------------------------------------------------------------------------------------
# Attention kernel choice

def select_attention(kernel: str) -> None:
    """Which fused kernel CUDA's SDPA may use: 'auto' leaves PyTorch's own order; a name keeps only
    that kernel (math stays as the fallback for inputs it cannot take). Takes effect for graphs
    compiled afterwards, so call it before :meth:`GPT.compile_blocks`."""
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention kernel '{kernel}' is not one of {', '.join(ATTENTION_KERNELS)}")
    b = torch.backends.cuda
    b.enable_flash_sdp(kernel in ("auto", "flash"))
    b.enable_mem_efficient_sdp(kernel in ("auto", "efficient"))
    b.enable_cudnn_sdp(kernel in ("auto", "cudnn"))
    b.enable_math_sdp(True)


# ---------------------------------------------------------------------------------------------
# The transformer


# torch >= 2.5 repeats key/value heads inside SDPA; older releases get them repeated here.
_SDPA_GQA = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 5)


class RMSNorm(nn.Module):
    """RMSNorm without parameters (nanochat's ``norm``): nothing to learn, nothing to count."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],))


def make_norm(kind: str, width: int) -> nn.Module:
    return RMSNorm() if kind == "rmsnorm" else nn.LayerNorm(width, bias=False)


def rotary_tables(max_seq_len: int, head_dim: int, device: torch.device | None = None,
                  base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, head_dim / 2] of RoPE (Su et al. 2021, arXiv:2104.09864), fp32."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32, device=device), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, H, T, D] pairwise: channel i with channel i + D/2 (the split-halves layout)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, s: ModelSpec) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = s.n_heads, s.kv_heads, s.head_dim
        # q, k and v in one matmul: d_model + 2 x (kv heads x head_dim) outputs.
        self.qkv = nn.Linear(s.d_model, s.d_model + 2 * self.n_kv * self.head_dim, bias=False)
        self.proj = nn.Linear(s.d_model, s.d_model, bias=False)
        self.q_norm = make_norm(s.norm, s.head_dim) if s.qk_norm else None
        self.k_norm = make_norm(s.norm, s.head_dim) if s.qk_norm else None
        self.dropout = s.dropout

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, kv: Any = None) -> torch.Tensor:
        """``kv``: one layer of a decoding cache (trainer.infer.kvcache): the new tokens sit at its
        ``pos`` [B, T] and attend to the keys and values it holds."""
        b, t, d = x.shape
        hd = self.head_dim
        q, k, v = self.qkv(x).split([d, self.n_kv * hd, self.n_kv * hd], dim=-1)
        q = q.view(b, t, self.n_heads, hd).transpose(1, 2)
        k = k.view(b, t, self.n_kv, hd).transpose(1, 2)
        v = v.view(b, t, self.n_kv, hd).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            cos, sin = (rope[0][:t], rope[1][:t]) if kv is None else (rope[0][kv.pos][:, None], rope[1][kv.pos][:, None])
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if kv is not None:
            return self.proj(kv.attend(q, k, v).transpose(1, 2).reshape(b, t, d))
        kw = {}
        if self.n_kv != self.n_heads:
            if _SDPA_GQA:
                kw["enable_gqa"] = True
            else:
                rep = self.n_heads // self.n_kv
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0, **kw)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    """gelu (GPT-2, tanh approximation), relu2 (squared ReLU, nanochat's) or swiglu (gate and up
    projections fused into ``fc``, 2 x d_ff wide: silu(gate) * up)."""

    def __init__(self, s: ModelSpec) -> None:
        super().__init__()
        self.kind = s.mlp
        self.fc = nn.Linear(s.d_model, (2 if s.mlp == "swiglu" else 1) * s.d_ff, bias=False)
        self.proj = nn.Linear(s.d_ff, s.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.kind == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.kind == "relu2":
            h = F.relu(h).square()
        else:
            h = F.gelu(h, approximate="tanh")
        return self.proj(h)


class Block(nn.Module):
    """Pre-norm attention and MLP; with ``memory``, attention's output is mixed with an Atlas memory's
    read by a learned gate (:meth:`trainer.model.memory.AtlasMemory.mix`) and the forward also returns the
    memory's final M, S and the gate's mean share."""

    def __init__(self, s: ModelSpec, memory: bool = False) -> None:
        super().__init__()
        self.ln1 = make_norm(s.norm, s.d_model)
        self.attn = CausalSelfAttention(s)
        self.ln2 = make_norm(s.norm, s.d_model)
        self.mlp = MLP(s)
        self.drop = nn.Dropout(s.dropout)
        self.memory = AtlasMemory(s.d_model, s.key_width, s.value_width, s.poly_degree, s.context_window,
                                  s.gate_init, s.max_seq_len) if memory else None

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                mem_m: torch.Tensor | None = None, mem_s: torch.Tensor | None = None, kv: Any = None) -> Any:
        h = self.ln1(x)
        a = self.attn(h, rope, kv)
        if self.memory is not None and kv is not None:  # decoding: the memory's carry is the cache's
            a = self.memory.mix_step(h, a, kv.memory)
        if self.memory is None or kv is not None:
            x = x + self.drop(a)
            return x + self.drop(self.mlp(self.ln2(x)))
        a, m, s, share = self.memory.mix(h, a, mem_m, mem_s)
        x = x + self.drop(a)
        return x + self.drop(self.mlp(self.ln2(x))), m, s, share


class GPT(nn.Module):
    def __init__(self, shape: ModelSpec) -> None:
        super().__init__()
        problem = unsupported_message(shape)
        if problem:
            raise ValueError(problem)
        self.shape = shape
        self.wte = nn.Embedding(shape.vocab_size, shape.d_model)
        self.wpe = nn.Embedding(shape.max_seq_len, shape.d_model) if shape.pos_embedding == "learned" else None
        # nanochat normalises the embedding before the first block (its norms have no weights).
        self.emb_norm = RMSNorm() if shape.norm == "rmsnorm" else None
        self.drop = nn.Dropout(shape.dropout)
        self.blocks = nn.ModuleList(Block(shape, memory=shape.memory) for _ in range(shape.n_layers))
        self.refine = nn.ModuleList(Block(shape) for _ in range(shape.refine_layers)) if shape.refine_steps else None
        self.refine_weight_base, self.refine_reward_scale = 5.0, 1.0  # the cloud training guide's fast phase; set by the trainer
        # What the last forward left, detached: memory states and gate shares, refinement step losses.
        self.memory_out: list[MemoryState] = []
        self.gate_shares: list[torch.Tensor] = []
        self.refine_losses: torch.Tensor | None = None
        self.ln_f = make_norm(shape.norm, shape.d_model)
        self.lm_head = None if shape.tied_embeddings else nn.Linear(shape.d_model, shape.vocab_size, bias=False)
        self.loss_chunk_rows = 8192
        # Not in the state dict (derived, not learned); rebuilt by reset_parameters after to_empty.
        rope = shape.pos_embedding == "rope"
        for name in ("rope_cos", "rope_sin"):
            self.register_buffer(name, torch.empty(shape.max_seq_len, shape.head_dim // 2) if rope else None,
                                 persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """LayerNorm models: GPT-2's init, N(0, 0.02) with residual projections scaled by 1/sqrt(2 L)
        so the residual stream's variance does not grow with depth (nanoGPT model.py).

        RMSNorm models: nanochat's (nanochat/gpt.py ``init_weights``): input-side matrices
        N(0, 1/sqrt(fan_in) x min(1, sqrt(fan_out/fan_in))), the residual projections and an untied
        head zero (each block starts as the identity and the first logits are uniform: loss ln V),
        the embedding N(0, 1) (it is RMS-normalised before use); a tied table is also the head, so
        it takes N(0, 1/sqrt(d)), which gives logits of unit scale."""
        s = self.shape
        modern = s.norm == "rmsnorm"
        for name, p in self.named_parameters():
            if p.dim() < 2:
                nn.init.ones_(p)  # norm weights: there are no biases
            elif not modern:
                scale = 1 / math.sqrt(2 * s.n_layers) if name.endswith("proj.weight") else 1.0
                nn.init.normal_(p, mean=0.0, std=0.02 * scale)
            elif name.endswith("proj.weight") or name.startswith("lm_head"):
                nn.init.zeros_(p)
            elif name.startswith("wte") or name.startswith("wpe"):
                nn.init.normal_(p, std=s.d_model**-0.5 if (s.tied_embeddings and name.startswith("wte")) else 1.0)
            else:
                fan_out, fan_in = p.shape
                nn.init.normal_(p, std=fan_in**-0.5 * min(1.0, math.sqrt(fan_out / fan_in)))
        for mem in self.modules():
            if isinstance(mem, AtlasMemory):
                mem.reset_memory_parameters()
        if self.rope_cos is not None and self.rope_sin is not None and self.rope_cos.device.type != "meta":
            cos, sin = rotary_tables(s.max_seq_len, s.head_dim, device=self.rope_cos.device)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.wte.weight if self.lm_head is None else self.lm_head.weight

    def num_params(self, exclude_position: bool = True) -> int:
        """Parameters counted once (the tied head is the embedding); position table optional."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if exclude_position and self.wpe is not None else n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6N for the matmuls + 12 L d T for attention scores/values, N the
        parameters that multiply (layers and head; lookups excluded), as the planner counts them."""
        return self.shape.train_flops_per_token(seq_len)

    def compile_blocks(self, mode: str | None = None) -> None:
        for block in [*self.blocks, *(self.refine or [])]:
            block.compile(mode=mode)
        enable_compiled_loss()

    def set_memory_options(self, chunk_size: int, max_norm: float | None = None) -> None:
        """The memory's update granularity (TNT's stage chunk size) and optional norm ceiling."""
        for mem in self.modules():
            if isinstance(mem, AtlasMemory):
                mem.chunk_size, mem.max_norm = chunk_size, max_norm

    def set_refinement(self, supervision_weight_base: float, improvement_reward_scale: float) -> None:
        self.refine_weight_base, self.refine_reward_scale = supervision_weight_base, improvement_reward_scale

    def _loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        b, t = targets.shape
        return chunked_cross_entropy(self.ln_f(x).reshape(b * t, -1), self.head_weight, targets.reshape(-1),
                                     self.loss_chunk_rows, self.shape.logit_softcap)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(self.ln_f(x[:, -1, :]), self.head_weight.to(x.dtype)).float()
        cap = self.shape.logit_softcap
        return cap * torch.tanh(out / cap) if cap else out

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        return_hidden: bool = False,
        memory_states: list[MemoryState] | None = None,
        cache: Any = None,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """targets given: the mean loss; else the logits of the last position [B, V].

        ``return_hidden`` also returns the residual stream after the embeddings and after each
        block (n_layers + 1 tensors [B, T, D]) for TCF metrics and geometric snapshots.

        ``memory_states`` (one per layer) start each layer's memory (default zero); the final states
        and gate shares are left in ``memory_out``, ``gate_shares``. Refinement: see
        :func:`trainer.model.refine.refined_output`.

        ``cache`` (a :class:`trainer.infer.kvcache.KVCache` set up for a prefill or a decode step): idx
        are the rows' next tokens, at the cache's positions; every attention layer (refinement steps'
        included, in the order they run) keeps its keys and values there, each memory its carry."""
        b, t = idx.shape
        if t > self.shape.max_seq_len:
            raise ValueError(f"sequence of {t} tokens exceeds max_seq_len {self.shape.max_seq_len}")
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(t, device=idx.device) if cache is None else cache.pos)
        if self.emb_norm is not None:
            x = self.emb_norm(x)
        x = self.drop(x)
        rope = (self.rope_cos, self.rope_sin) if self.rope_cos is not None else None
        hidden = [x] if return_hidden else []
        memory_out, shares = [], []
        for i, block in enumerate(self.blocks):
            if cache is not None:
                x = block(x, rope, kv=cache.layer(i))
            elif block.memory is not None:
                st = memory_states[i] if memory_states else None
                x, m, s, share = block(x, rope, *((st.M, st.S) if st is not None else (None, None)))
                memory_out.append(MemoryState(m.detach(), s.detach()))
                shares.append(share)
            else:
                x = block(x, rope)
            if return_hidden:
                hidden.append(x)
        self.memory_out, self.gate_shares = memory_out, shares
        if self.refine is not None:
            out = refined_output(self, x, targets, rope, cache)
        else:
            out = self._loss(x, targets) if targets is not None else self._logits(x)
        return (out, hidden) if return_hidden else out

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.8,
                 top_k: int | None = 50, generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample continuations; a private ``generator`` keeps training RNG (and resume) untouched."""
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.shape.max_seq_len :]
            logits = self(ctx)
            assert isinstance(logits, torch.Tensor)
            if temperature <= 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None and top_k < logits.shape[-1]:
                    kth = torch.topk(logits, top_k).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = torch.softmax(logits, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
