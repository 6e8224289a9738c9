"""Muon: momentum orthogonalised by a Newton–Schulz iteration, for the 2-D matrices inside the blocks.

The algorithm is Keller Jordan's (https://kellerjordan.github.io/posts/muon/), as ``torch.optim.Muon``
(PyTorch >= 2.9) implements it and nanochat (``nanochat/muon.py``) trains with it: an EMA momentum
buffer, a Nesterov look-ahead, five steps of the quintic iteration with coefficients (3.4445, -4.7750,
2.0315) in bf16, decoupled weight decay, and the step scaled by sqrt(max(1, rows / cols)).

:class:`Muon` is that algorithm written out, with the same operations in the same order, so one
process gives bit for bit ``torch.optim.Muon``'s update (tests/trainer/loop/test_muon.py checks it where
torch ships it). Under DDP every rank already holds the all-reduced gradient, so every rank keeps
the momentum of every matrix (an element-wise update, and the optimizer state stays identical on
all ranks, so rank 0's checkpoint resumes them all) while the Newton–Schulz iterations, the costly
part, are split: matrices of one shape are dealt round-robin, each rank orthogonalises its share,
and one all-gather per ``world`` matrices hands every rank all the results (nanochat's DistMuon does
the same split after a reduce-scatter of the gradients).

Under FSDP2 (``fully_shard``) a matrix is a DTensor sharded on dim 0, and Newton–Schulz needs the whole
matrix. Each rank keeps the momentum of its own rows only (the buffer is a DTensor sharded like the
parameter, so a checkpoint saves it per rank and ``set_optimizer_state_dict`` puts it back), then the
matrices of one shape are dealt round-robin as under DDP: one all-to-all hands each rank every row
block of the matrix it owns, it orthogonalises it whole, and a second all-to-all sends each rank its
rows of every result. This is the layout of the Dion project's Muon for FSDP2, carried into
torchtitan (``torchtitan/experiments/dion_optimizer/muon.py``: batches of ``world`` same-shape
matrices, all-to-all to one whole matrix per device and back); Moonlight's distributed Muon instead
gathers every matrix on every rank and repeats the iteration there. Rows are sent as the bf16 the
iteration starts from (half the bytes of fp32, and exact: ``orthogonalize`` rounds to bf16 first),
padded to ``ceil(rows / world)`` so uneven shards travel in one collective.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
EPS = 1e-7


def orthogonalize(g: torch.Tensor, steps: int = NS_STEPS, coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                  eps: float = EPS) -> torch.Tensor:
    """An approximation of U V^T for g = U S V^T (singular values land in about [0.7, 1.2]), in bf16."""
    a, b, c = coefficients
    x = g.bfloat16()
    if x is g:
        x = x.clone()  # never scale the caller's tensor (a bf16 momentum buffer) in place
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T  # iterate on the smaller Gram matrix
    x.div_(x.norm().clamp(min=eps))  # spectral norm <= Frobenius norm <= 1
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    return x.T if tall else x


def lr_ratio(shape: torch.Size) -> float:
    """Keller Jordan's scale: the update's RMS matches across aspect ratios."""
    rows, cols = shape[:2]
    return math.sqrt(max(1.0, rows / cols))


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's own shard (a view: in-place ops change the DTensor), or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def shard_rows(rows: int, world: int) -> list[int]:
    """Rows each rank holds of a dim-0 sharded matrix: torch.chunk's split, as FSDP2 cuts it
    (``ceil(rows / world)`` each, the last ones shorter or empty)."""
    per = -(-rows // world)
    return [max(0, min(rows, (i + 1) * per) - i * per) for i in range(world)]


def _exchange(blocks: torch.Tensor, group: Any) -> torch.Tensor:
    """All-to-all of ``blocks[j]`` (bf16) to rank j; the result's ``[i]`` came from rank i. Sent as
    raw bytes: exact, and gloo need not know bf16."""
    out = torch.empty_like(blocks)
    dist.all_to_all_single(out.view(torch.uint8), blocks.contiguous().view(torch.uint8), group=group)
    return out


class Muon(torch.optim.Optimizer):
    """Muon for 2-D parameters; ``world`` > 1 splits the orthogonalisation across the default group
    (DDP). DTensor parameters (FSDP2) are split across their own mesh, whatever ``world`` says."""

    def __init__(self, params: Iterable[Any], lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True,
                 weight_decay: float = 0.0, ns_steps: int = NS_STEPS, rank: int = 0, world: int = 1) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "nesterov": nesterov,
                                  "weight_decay": weight_decay, "ns_steps": ns_steps})
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon takes 2-D parameters, got one of shape {tuple(p.shape)}")
                if isinstance(p, DTensor) and (p.device_mesh.ndim != 1 or p.placements[0] != Shard(0)):
                    raise ValueError(f"Muon takes DTensors sharded on dim 0 of a 1-D mesh (FSDP2), got "
                                     f"{p.placements} on a {p.device_mesh.ndim}-D mesh")
        self.rank, self.world = rank, world

    def _direction(self, p: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        """The momentum step for p (every rank does it, on its own rows under FSDP2), before
        orthogonalisation."""
        assert p.grad is not None
        state = self.state[p]
        if "momentum_buffer" not in state:  # a DTensor sharded like p under FSDP2
            state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
        grad, buf = _local(p.grad), _local(state["momentum_buffer"])
        buf.lerp_(grad, 1 - group["momentum"])
        return grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf

    @staticmethod
    def _apply(p: torch.Tensor, update: torch.Tensor, group: dict[str, Any]) -> None:
        """Decay and step p (its own rows under FSDP2); the scale uses the whole matrix's shape."""
        lr = group["lr"]
        local = _local(p)
        local.mul_(1 - lr * group["weight_decay"])
        local.add_(update, alpha=-lr * lr_ratio(p.shape))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            sharded = [p for p in params if isinstance(p, DTensor)]
            whole = [p for p in params if not isinstance(p, DTensor)]
            if sharded:
                self._step_sharded(sharded, group)
            if whole:
                self._step_whole(whole, group)
        return loss

    def _step_whole(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        """Every rank holds every matrix (one process, DDP): momentum everywhere, iterations split."""
        directions = [self._direction(p, group) for p in params]
        if self.world == 1:
            for p, d in zip(params, directions, strict=True):
                self._apply(p, orthogonalize(d, group["ns_steps"]), group)
            return
        for shape, idx in _by_shape(params).items():
            for start in range(0, len(idx), self.world):
                chunk = idx[start : start + self.world]
                mine = chunk[self.rank] if self.rank < len(chunk) else None
                if mine is not None:
                    out = orthogonalize(directions[mine], group["ns_steps"])
                else:  # fewer matrices than ranks in the last round: send a placeholder
                    out = torch.zeros(shape, dtype=torch.bfloat16, device=params[chunk[0]].device)
                # Sent as raw bytes: exact, and gloo need not know bf16 (nor int16).
                out = out.contiguous()
                parts = [torch.empty(shape, dtype=out.dtype, device=out.device).view(torch.uint8)
                         for _ in range(self.world)]
                dist.all_gather(parts, out.view(torch.uint8))
                for j, i in enumerate(chunk):
                    self._apply(params[i], parts[j].view(torch.bfloat16), group)

    def _step_sharded(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        """FSDP2: momentum on each rank's rows; rank j of a round gathers matrix j whole, orthogonalises
        it, and every rank gets its rows of each result back (two all-to-alls per round)."""
        directions = [self._direction(p, group) for p in params]
        for (rows, cols), idx in _by_shape(params).items():
            mesh = params[idx[0]].device_mesh  # type: ignore[attr-defined]
            pg, world, me = mesh.get_group(), mesh.size(), mesh.get_local_rank()
            sizes = shard_rows(rows, world)
            per, offsets = sizes[0], [sum(sizes[:i]) for i in range(world)]
            device = directions[idx[0]].device
            for start in range(0, len(idx), world):
                chunk = idx[start : start + world]
                send = torch.zeros(world, per, cols, dtype=torch.bfloat16, device=device)
                for j, i in enumerate(chunk):  # my rows of matrix j go to rank j
                    send[j, : sizes[me]] = directions[i]
                got = _exchange(send, pg)
                back = torch.zeros_like(send)
                if me < len(chunk):  # the matrix dealt to this rank, whole
                    whole = torch.cat([got[i, : sizes[i]] for i in range(world)])
                    out = orthogonalize(whole, group["ns_steps"])
                    for i in range(world):
                        back[i, : sizes[i]] = out[offsets[i] : offsets[i] + sizes[i]]
                got = _exchange(back, pg)
                for j, i in enumerate(chunk):
                    self._apply(params[i], got[j, : sizes[me]], group)


def _by_shape(params: list[torch.Tensor]) -> dict[tuple[int, ...], list[int]]:
    """Indices of the parameters of each (global) shape, in order: the same on every rank."""
    out: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(params):
        out.setdefault(tuple(p.shape), []).append(i)
    return out
