"""TCF geometry metrics (the Atlas 1B build plan section 2.1): is the representation rich, collapsing, settling?

- effective dimensionality ``D_eff = (sum s_i)^2 / sum s_i^2`` of a matrix's singular values: high
  means many directions carry signal;
- collapse indicator ``beta = s_1 / mean(s_2..s_k)``: one direction dominating (beta >> 2) is collapse;
- curvature ``|a| / |v|^2`` of a trajectory from finite differences of its last three points: of a
  weight matrix across validations (is training settling?) and of each token's path through the
  layers (how sharply the residual stream turns).
"""

from __future__ import annotations

from typing import Any

import torch


def singular_values(m: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(m.detach().float())


def effective_dimensionality(s: torch.Tensor) -> float:
    sq = (s**2).sum()
    return float((s.sum() ** 2 / sq).item()) if sq > 0 else 0.0


def collapse_beta(s: torch.Tensor, top_k: int = 10) -> float:
    k = min(top_k, s.numel())
    if k < 2:
        return 0.0
    rest = s[1:k].mean()
    return float((s[0] / rest).item()) if rest > 0 else float("inf")


def curvature(points: list[torch.Tensor]) -> float:
    """Discrete curvature at the last of three points (0 for fewer)."""
    if len(points) < 3:
        return 0.0
    p0, p1, p2 = (p.detach().float() for p in points[-3:])
    v = p2 - p1
    a = v - (p1 - p0)
    vn = v.norm()
    return float((a.norm() / vn**2).item()) if vn > 0 else 0.0


def layer_path_curvature(hidden: list[torch.Tensor]) -> float:
    """Mean curvature of tokens' paths through the residual stream, over consecutive layer triples."""
    if len(hidden) < 3:
        return 0.0
    h = torch.stack([x[0].detach().float() for x in hidden])  # [L+1, T, D], first sequence
    v = h[1:] - h[:-1]
    a = v[1:] - v[:-1]
    vn = v[1:].norm(dim=-1)
    k = a.norm(dim=-1) / vn.clamp_min(1e-12) ** 2
    return float(k.mean().item())


def matrix_metrics(prefix: str, m: torch.Tensor) -> dict[str, float]:
    s = singular_values(m)
    return {f"{prefix}/D_eff": effective_dimensionality(s), f"{prefix}/beta": collapse_beta(s),
            f"{prefix}/norm": float(m.detach().float().norm().item())}


class TCFTracker:
    """Computes the metrics at each validation and keeps the weight history for curvature."""

    def __init__(self, history: int = 3) -> None:
        self.history: dict[str, list[torch.Tensor]] = {}
        self.keep = history

    def compute(self, hidden: list[torch.Tensor], weights: dict[str, torch.Tensor]) -> dict[str, float]:
        out: dict[str, float] = {}
        n = len(hidden)
        for name, i in (("first", 1), ("mid", n // 2), ("last", n - 1)):
            if 0 <= i < n:
                out.update(matrix_metrics(f"tcf/hidden_{name}", hidden[i][0].T))  # [D, T], first sequence
        out["tcf/hidden/path_curvature"] = layer_path_curvature(hidden)
        for name, w in weights.items():
            out.update(matrix_metrics(f"tcf/{name}", w))
            hist = self.history.setdefault(name, [])
            hist.append(w.detach().float().cpu().clone())
            del hist[: -self.keep]
            if len(hist) >= 3:
                out[f"tcf/{name}/curvature"] = curvature(hist)
        return out


class MemoryTCF:
    """The memory's geometry at each validation, per layer (the Atlas 1B build plan §2.1 ``compute_all``): M_norm,
    M_std, S_norm, D_eff and beta of M and of S (first sequence of the probe batch), and the
    curvature of M's path across the last three validations. The path is kept as M times a fixed
    random Gaussian projection to at most ``proj_cols`` columns (Johnson-Lindenstrauss: distances,
    hence the curvature's norms, are preserved up to a small factor), so the history costs
    3 x d_value x 256 floats a layer, not 3 x d_value x d_key. The history restarts with the process."""

    def __init__(self, keep: int = 3, proj_cols: int = 256, seed: int = 0) -> None:
        self.keep, self.proj_cols, self.seed = keep, proj_cols, seed
        self.history: dict[int, list[torch.Tensor]] = {}
        self._proj: torch.Tensor | None = None

    def _projection(self, d_key: int) -> torch.Tensor:
        if self._proj is None or self._proj.shape[0] != d_key:
            cols = min(self.proj_cols, d_key)
            g = torch.Generator().manual_seed(self.seed)
            self._proj = torch.randn(d_key, cols, generator=g) / cols**0.5
        return self._proj

    def compute(self, states: list[tuple[torch.Tensor, torch.Tensor]], shares: list[float]) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for i, ((m_all, s_all), share) in enumerate(zip(states, shares, strict=True)):
            m, s = m_all[0].detach().float(), s_all[0].detach().float()
            sm, ss = singular_values(m), singular_values(s)
            row: dict[str, float | None] = {"gate": float(share), "M_norm": float(m.norm().item()), "M_std": float(m.std().item()),
                   "S_norm": float(s.norm().item()), "M_D_eff": effective_dimensionality(sm),
                   "M_beta": collapse_beta(sm), "S_D_eff": effective_dimensionality(ss), "S_beta": collapse_beta(ss)}
            hist = self.history.setdefault(i, [])
            hist.append((m.cpu() @ self._projection(m.shape[1])).clone())
            del hist[: -self.keep]
            row["M_curvature"] = curvature(hist) if len(hist) >= 3 else None
            out[f"layer_{i:02d}"] = row
        return out


def last_block_weights(model: Any) -> dict[str, Any]:
    """The last block's attention output and MLP input weights, whose spectra TCF follows (unsharded
    models only: under FSDP a rank holds a shard of each)."""
    last = model.blocks[-1]
    return {"w_last_attn_proj": last.attn.proj.weight, "w_last_mlp_fc": last.mlp.fc.weight}
