"""Geometric snapshot of a checkpoint (the Atlas 1B build plan section 2.4):
``python -m trainer.snapshot --checkpoint DIR --out DIR [--text TEXT]``.

Writes, for each layer, the residual-stream hidden state on the sample text and the singular values
of every weight matrix (``layer_XX/hidden.pt``, ``layer_XX/svd.pt``), plus ``metrics.json`` with
D_eff, collapse beta and norms per layer and matrix and the layer-path curvature. The full
``U, S, V`` of a matrix is large; ``--full-svd`` adds it.

A model with memory also gets, per layer, the memory's state after the sample text (the Atlas 1B build plan §2.4):
``layer_XX/M.pt``, ``S.pt`` (first sequence, [d_value, d_key]), ``M_svd.pt`` / ``S_svd.pt`` (singular
values; U and V too with ``--full-svd``) and, in ``metrics.json`` under the layer's ``memory``, its
gate share, M_norm, M_std, S_norm and D_eff / beta of M and S. Layer XX's memory is block XX-1's
(layer_00 is the embedding output).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from trainer.sample import load_for_inference
from trainer.watch.tcf import MemoryTCF, layer_path_curvature, matrix_metrics

DEFAULT_TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


@torch.no_grad()
def snapshot(checkpoint: Path, out: Path, text: str = DEFAULT_TEXT, full_svd: bool = False,
             device: str = "cpu") -> dict:
    model, tok, meta = load_for_inference(checkpoint, device)
    ids = (tok.encode(text) or [tok.eot])[: model.shape.max_seq_len]
    _, hidden = model(torch.tensor([ids], device=device), return_hidden=True)  # type: ignore[misc]
    out.mkdir(parents=True, exist_ok=True)
    metrics: dict = {"checkpoint": meta["path"], "step": meta["step"], "n_tokens": len(ids), "layers": {}}
    memory = MemoryTCF().compute([(m.M, m.S) for m in model.memory_out],
                                 [float(g) for g in model.gate_shares]) if model.memory_out else {}
    for i, h in enumerate(hidden):
        layer_dir = out / f"layer_{i:02d}"
        layer_dir.mkdir(exist_ok=True)
        torch.save(h[0].float().cpu(), layer_dir / "hidden.pt")
        entry: dict[str, Any] = dict(matrix_metrics("hidden", h[0].T))
        weights = {}
        if i > 0:  # layer 0 is the embedding output; block i-1 produced hidden[i]
            block = model.blocks[i - 1]
            for name, p in block.named_parameters():
                if p.dim() == 2:
                    w = p.float()
                    if full_svd:
                        u, s, vh = torch.linalg.svd(w, full_matrices=False)
                        weights[name] = {"U": u.cpu(), "S": s.cpu(), "Vh": vh.cpu()}
                    else:
                        weights[name] = {"S": torch.linalg.svdvals(w).cpu()}
                    entry.update(matrix_metrics(name, w))
            torch.save(weights, layer_dir / "svd.pt")
            if memory:
                _save_memory(model.memory_out[i - 1], layer_dir, full_svd)
                entry["memory"] = {k: v for k, v in memory[f"layer_{i - 1:02d}"].items() if k != "M_curvature"}
        metrics["layers"][f"layer_{i:02d}"] = entry
    metrics["embedding"] = matrix_metrics("wte", model.wte.weight)
    metrics["path_curvature"] = layer_path_curvature(hidden)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    return metrics


def _save_memory(state, layer_dir: Path, full_svd: bool) -> None:
    for name, t in (("M", state.M[0].float().cpu()), ("S", state.S[0].float().cpu())):
        torch.save(t, layer_dir / f"{name}.pt")
        if full_svd:
            u, sv, vh = torch.linalg.svd(t, full_matrices=False)
            torch.save({"U": u, "S": sv, "Vh": vh}, layer_dir / f"{name}_svd.pt")
        else:
            torch.save({"S": torch.linalg.svdvals(t)}, layer_dir / f"{name}_svd.pt")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.snapshot", description=__doc__)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--full-svd", action="store_true")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    try:
        m = snapshot(Path(args.checkpoint), Path(args.out), args.text, args.full_svd, args.device)
    except (FileNotFoundError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"snapshot of step {m['step']} ({len(m['layers'])} layers) in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
