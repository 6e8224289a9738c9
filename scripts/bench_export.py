"""Export per architecture: ``trainer.export`` time, ``transformers`` load time, and the largest logit
difference between the export and the trainer's model (fp32, CPU, random weights).

    python scripts/bench_export.py [--width 256] [--layers 4] [--seq 128]

Each architecture that maps to a transformers class, at the given width and depth (vocabulary 257,
the byte tokenizer): the checkpoint is written as the trainer writes one, exported, loaded with
``AutoModelForCausalLM.from_pretrained`` and run on one random sequence; the trainer's model gives the
logits of every prefix's last position. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.export import export  # noqa: E402
from trainer.loop import checkpoint as ckpt  # noqa: E402
from trainer.model.gpt import GPT  # noqa: E402
from trainer.spec.presets import MODELS  # noqa: E402

LLAMA = {"pos_embedding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "tied_embeddings": False}
ARCHS = {
    "GPT-2 (124m's)": (MODELS["124m"], {}),
    "rotary + LayerNorm + GELU (300m's)": (MODELS["300m"], {}),
    "rotary + LayerNorm + SwiGLU + GQA (7b's)": (MODELS["7b"], {"n_kv_heads": 2}),
    "rotary + RMSNorm + SwiGLU + GQA": (MODELS["124m"], {**LLAMA, "n_kv_heads": 2}),
    "rotary + RMSNorm + SwiGLU + GQA + QK-norm": (MODELS["124m"], {**LLAMA, "n_kv_heads": 2, "qk_norm": True}),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    import transformers

    print(f"width {args.width}, {args.layers} layers, {args.width // 64} heads, vocabulary 257, "
          f"sequence {args.seq}, fp32 CPU, torch {torch.__version__}, transformers {transformers.__version__}")
    print("| architecture | transformers class | parameters | export (s) | load (s) | max logit diff |")
    print("|---|---|---|---|---|---|")
    for name, (base, over) in ARCHS.items():
        spec = dataclasses.replace(base, d_model=args.width, n_layers=args.layers, n_heads=args.width // 64,
                                   d_ff=4 * args.width, vocab_size=257, max_seq_len=max(args.seq, 64), **over)
        torch.manual_seed(0)
        model = GPT(spec).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.normal_(std=p.shape[1] ** -0.5)
        with tempfile.TemporaryDirectory() as tmp:
            path = ckpt.save_checkpoint(Path(tmp) / "checkpoints", 1, rank=0, world=1,
                                        model_state=model.state_dict(), optim_state={},
                                        meta={"model_shape": spec.__dict__, "tokenizer": "byte"})
            t0 = time.perf_counter()
            done = export(path, Path(tmp) / "hf")
            t1 = time.perf_counter()
            hf = transformers.AutoModelForCausalLM.from_pretrained(Path(tmp) / "hf", torch_dtype=torch.float32)
            t2 = time.perf_counter()
        idx = torch.randint(0, 256, (1, args.seq), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            got = hf.eval()(idx).logits[0]
            diff = max(float((got[t] - model(idx[:, : t + 1])[0]).abs().max())
                       for t in range(0, args.seq, max(1, args.seq // 16)))
        print(f"| {name} | {done.architecture} | {done.params / 1e6:.1f}M | {t1 - t0:.2f} | {t2 - t1:.2f} | "
              f"{diff:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
