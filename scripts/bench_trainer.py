"""The bundled trainer against nanoGPT's model on one device: speed side by side, and tokens to quality.

    python scripts/bench_trainer.py                       # 124m and 1.31b: GPT-2 vs the modern variant, bf16
    python scripts/bench_trainer.py --fp8                 # + the modern variant with FP8 matmuls
    python scripts/bench_trainer.py --nanogpt ~/nanoGPT   # + nanoGPT's own model.py, same run, same device
    python scripts/bench_trainer.py --shape 124m --micro-batch 32
    python scripts/bench_trainer.py --shape tiny --device cpu --no-compile   # smoke test
    python scripts/bench_trainer.py --quality --shape 124m --tokens 500_000_000 --curves q.json --markdown q.md
    python scripts/bench_trainer.py --quality --shape tiny --device cpu --tokens 25600   # smoke test
    python scripts/bench_trainer.py --write-calibration calibration.yaml
    python scripts/bench_trainer.py --shape 124m --attention cudnn --kernel-table kt   # + top kernels
    python scripts/bench_trainer.py --check-attention      # each SDPA kernel against fp64 math
    python scripts/bench_trainer.py --shape 1b --memory --refine   # memory / refinement vs the plain model
    python scripts/bench_trainer.py --shape tiny --device cpu --no-compile --memory --refine   # smoke test

Shapes come from ``trainer.spec.presets.MODELS``. Each is measured as built by two architectures of the same
widths, depth and vocabulary (the same matmul FLOPs per token): ``gpt2`` (GELU, learned positions,
LayerNorm, tied head: nanoGPT's model, which ``124m`` and ``1.31b`` are) with AdamW, and ``modern``
(``trainer.spec.presets.modern``: nanochat's RoPE, RMSNorm, QK-norm, relu², untied soft-capped head) with
Muon; ``--fp8`` adds ``modern`` with torchao FP8 matmuls, ``--nanogpt DIR`` nanoGPT's own ``model.py``
(whole model compiled, its fused AdamW), so every figure comes from the same run on the same device.

Speed: exactly what ``trainer.train`` runs each step (bf16 autocast, compiled as hardware.compile says:
each trainer row once with the blocks compiled, the default, and once with the whole model, unless
``--compile-scope`` names one; the fused chunked LM-head loss, the optimizer, clip 1.0) on random tokens already on the device: 10 warm-up steps, then
20 timed steps with a single synchronize at each end (no per-step ``.item()``).

Quality (``--quality``): both architectures, each with its optimizer, train on the same batches of the
same text (Python's own standard library, byte tokens: on every machine with Python) for the same token
budget, with validation loss on the same held-out batches every ``--eval-every`` steps. Both curves go
to ``--curves`` (JSON) and ``--markdown`` (a table for BENCHMARKS.md; ``--plot`` a PNG when matplotlib
is installed), with the tokens the modern run needed to reach the GPT-2 run's final validation loss.
Research models (``--memory``, ``--refine``): the shape's own preset without memory or refinement
(``plain``), then the same shape with an Atlas memory in every block (d_key = d_value = d_model, the
seed's 1B plan) at each ``--memory-chunk`` (default the Atlas 1B build plan's two TNT stages, 2048 and 256), and with
``--refine-steps`` refinement steps of one shared block; each row's step time against ``plain``'s,
all in one run (issue 21's target: memory <= 1.5x plain).
MFU = tokens/s x (6N + 12 L d T) / peak, with N excluding position embeddings and the tied head
counted once, against the device's dense bf16 peak (989e12 for H100 SXM; unknown device: no MFU).
The nanoGPT reference on an H100 80GB HBM3: 485,937 tok/s (124m, mb 64, 40.8 GiB) and 58,691 tok/s
(1.31b, mb 8, 49.2 GiB).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib.util
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402

from trainer import __version__  # noqa: E402
from trainer.loop.dist import compile_model  # noqa: E402
from trainer.loop.optim import build_optimizer, set_schedule  # noqa: E402
from trainer.model.gpt import ATTENTION_KERNELS, GPT, select_attention  # noqa: E402
from trainer.spec.config import Config, ConfigError  # noqa: E402
from trainer.spec.modelspec import ModelSpec  # noqa: E402
from trainer.spec.presets import MODELS, modern  # noqa: E402
from trainer.spec.resolve import round_up  # noqa: E402
from trainer.watch.metrics import peak_flops  # noqa: E402


@dataclass(frozen=True)
class BenchShape:
    name: str
    spec: ModelSpec
    seq_len: int
    micro_batch: int


# (preset, sequence length, micro-batch that fits an 80 GB GPU): nanoGPT's two benchmark shapes, the
# CPU smoke shape, and the other presets at their own length (the planner's leave-one-out check).
_BENCH = (("124m", 1024, 64), ("1.31b", 2048, 8), ("tiny", 64, 4), ("25m", 512, 64), ("300m", 4096, 8),
          ("1b", 4096, 4), ("d24", 2048, 8))
SHAPES = {name: BenchShape(name, MODELS[name], t, mb) for name, t, mb in _BENCH}
ARCHES = ("gpt2", "modern")
RESEARCH = ("plain", "memory", "refine")  # --memory / --refine rows: the preset as it is, then each addition


def research_spec(spec: ModelSpec, arch: str, refine_steps: int = 3) -> ModelSpec:
    plain = dataclasses.replace(spec, memory=False, refine_steps=0)
    if arch == "memory":
        return dataclasses.replace(plain, name=f"{spec.name}-memory", memory=True)
    if arch == "refine":
        return dataclasses.replace(plain, name=f"{spec.name}-refine", refine_steps=refine_steps, refine_layers=1)
    return plain


def gpt2(spec: ModelSpec) -> ModelSpec:
    """``spec``'s widths with GPT-2's architecture (what nanoGPT builds)."""
    return dataclasses.replace(spec, name=spec.name.removesuffix("-modern"), mlp="gelu", pos_embedding="learned",
                               norm="layernorm", qk_norm=False, n_kv_heads=None, tied_embeddings=True,
                               logit_softcap=None)


def arch_spec(spec: ModelSpec, arch: str) -> ModelSpec:
    return modern(gpt2(spec)) if arch == "modern" else gpt2(spec)


def arch_config(arch: str, optimizer: str) -> Config:
    """nanoGPT's AdamW for gpt2 (6e-4, betas 0.9/0.95, decay 0.1); nanochat's split for modern with Muon
    (matrices 0.02, embedding 0.2, head 0.004, Adam betas 0.8/0.95)."""
    cfg = Config()
    t = cfg.training
    t.optimizer, t.weight_decay = optimizer, 0.1
    if optimizer == "muon":
        t.learning_rate, t.matrix_lr, t.embedding_lr, t.beta1, t.min_lr = 0.004, 0.02, 0.2, 0.8, 0.0004
    else:
        t.learning_rate, t.min_lr = 6e-4, 6e-5
    return cfg


def load_nanogpt(path: Path):
    """nanoGPT's ``model.py`` from a checkout, as a module (its GPT and GPTConfig)."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", path / "model.py")
    if spec is None or spec.loader is None or not (path / "model.py").exists():
        raise SystemExit(f"error: no nanoGPT model.py in {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(b: BenchShape, arch: str, optimizer: str, device: torch.device, *, compile_: bool,
          compile_mode: str | None, chunk_rows: int, fp8: bool, nanogpt=None, compile_scope: str = "blocks",
          memory_chunk: int | None = None, refine_steps: int = 3):
    """(model, optimizer, forward(x, y) -> loss, spec) for one row."""
    cuda = device.type == "cuda"
    if arch in RESEARCH:
        spec = research_spec(b.spec, arch, refine_steps)
    else:
        spec = arch_spec(b.spec, arch if arch != "nanogpt" else "gpt2")
    torch.manual_seed(0)
    if arch == "nanogpt":
        conf = nanogpt.GPTConfig(block_size=b.seq_len, vocab_size=spec.vocab_size, n_layer=spec.n_layers,
                                 n_head=spec.n_heads, n_embd=spec.d_model, dropout=0.0, bias=False)
        with torch.device(device):
            model = nanogpt.GPT(conf)
        opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.type)
        fwd = torch.compile(model) if compile_ else model  # nanoGPT compiles the whole model
        return model, opt, (lambda x, y: fwd(x, y)[1]), spec
    with torch.device(device):
        model = GPT(spec)
    model.loss_chunk_rows = chunk_rows
    if memory_chunk:
        model.set_memory_options(memory_chunk)
    if fp8:
        from trainer.model.fp8 import enable_fp8

        enable_fp8(model, device)
    if compile_:
        compile_model(model, compile_scope, compile_mode)  # hardware.compile, as the trainer applies it
    opt = build_optimizer(model, arch_config(arch, optimizer), fused=cuda)
    return model, opt, model, spec


def bench(b: BenchShape, device: torch.device, *, arch: str = "gpt2", optimizer: str = "adamw", fp8: bool = False,
          compile_: bool, compile_mode: str | None, warmup: int, steps: int, chunk_rows: int,
          micro_batch: int | None = None, attention: str = "auto", compile_scope: str = "blocks",
          kernel_table: Path | None = None, nanogpt=None, memory_chunk: int | None = None,
          refine_steps: int = 3) -> dict:
    mb = micro_batch or b.micro_batch
    cuda = device.type == "cuda"
    if cuda:
        select_attention(attention)
    model, opt, fwd, spec = build(b, arch, optimizer, device, compile_=compile_, compile_mode=compile_mode,
                                  chunk_rows=chunk_rows, fp8=fp8, nanogpt=nanogpt, compile_scope=compile_scope,
                                  memory_chunk=memory_chunk, refine_steps=refine_steps)
    x = torch.randint(0, spec.vocab_size, (mb, b.seq_len), device=device)
    y = torch.randint(0, spec.vocab_size, (mb, b.seq_len), device=device)

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t_compile = time.perf_counter()
    for _ in range(warmup):
        loss = step()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    t_compile = time.perf_counter() - t_compile
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    if kernel_table is not None:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                step()
            if cuda:
                torch.cuda.synchronize(device)
        sort = "cuda_time_total" if cuda else "cpu_time_total"
        kernel_table.write_text(prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=90))
    tok_s = steps * mb * b.seq_len / elapsed
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = peak_flops(name) if cuda else None
    flops = spec.train_flops_per_token(b.seq_len, memory_chunk)
    row = {
        "shape": b.name, "arch": arch, "optimizer": "adamw" if arch == "nanogpt" else optimizer,
        "precision": ("fp8" if fp8 else "bf16") if cuda else "fp32", "device": name, "micro_batch": mb,
        "seq_len": b.seq_len, "params": spec.num_params(),
        "ms_per_step": elapsed / steps * 1000, "tokens_per_s": tok_s,
        "mfu": tok_s * flops / peak if peak else None,
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30 if cuda else None,
        "warmup_s": t_compile, "final_loss": float(loss.item()), "compile": compile_,
        "compile_mode": compile_mode, "compile_scope": compile_scope if compile_ else None,
        "attention": attention, "loss_chunk_rows": chunk_rows,
        "memory_chunk": min(memory_chunk or 2048, b.seq_len) if spec.memory else None,
        "refine_steps": spec.refine_steps or None,
    }
    row["spec"] = spec
    return row


# ------------------------------------------------------------------------------------------ tokens to quality


def train_curve(b: BenchShape, arch: str, optimizer: str, device: torch.device, data_dir: Path, tokens: int,
                eval_every: int, eval_batches: int, compile_: bool) -> dict:
    """Train ``arch`` for ``tokens`` tokens on the prepared bytes; validation loss every ``eval_every`` steps."""
    from trainer.data.loader import BatchLoader, TokenSplit, val_batches

    cuda = device.type == "cuda"
    train, val = TokenSplit(data_dir, "train"), TokenSplit(data_dir, "val")
    vocab = round_up(int(train.meta["vocab_size"]))
    shape = dataclasses.replace(b, spec=dataclasses.replace(b.spec, vocab_size=vocab))
    model, opt, fwd, spec = build(shape, arch, optimizer, device, compile_=compile_, compile_mode=None,
                                  chunk_rows=8192, fp8=False)
    cfg = arch_config(arch, optimizer)
    t = cfg.training
    steps = max(1, tokens // (b.micro_batch * b.seq_len))
    t.warmup_steps = max(1, steps // 20)
    loader = BatchLoader(train, b.micro_batch, b.seq_len, seed=1234)  # the same batches for both runs
    held_out = val_batches(val, eval_batches, b.micro_batch, b.seq_len, 0, 1)

    def to(a):
        return torch.from_numpy(a).to(device)

    @torch.no_grad()
    def evaluate() -> float:
        model.eval()
        total = 0.0
        for vb in held_out:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                total += float(fwd(to(vb.x), to(vb.y)))
        model.train()
        return total / len(held_out)

    points = [{"step": 0, "tokens": 0, "val_loss": evaluate()}]
    t0 = time.perf_counter()
    for step in range(steps):
        set_schedule(opt, t, step, steps)  # the trainer's LR schedule and Muon momentum warmup
        batch = loader.next()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = fwd(to(batch.x), to(batch.y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            points.append({"step": step + 1, "tokens": (step + 1) * b.micro_batch * b.seq_len, "val_loss": evaluate()})
    return {"shape": b.name, "arch": arch, "optimizer": optimizer, "params": spec.num_params(), "steps": steps,
            "seconds": time.perf_counter() - t0, "points": points}


def tokens_to_reach(points: list[dict], target: float) -> float | None:
    """Tokens at which a curve first reaches ``target`` (linear between evaluations); None if never."""
    for a, b in zip(points, points[1:], strict=False):
        if b["val_loss"] <= target:
            if a["val_loss"] <= target:
                return float(a["tokens"])
            f = (a["val_loss"] - target) / (a["val_loss"] - b["val_loss"])
            return a["tokens"] + f * (b["tokens"] - a["tokens"])
    return None


def quality(args, device: torch.device) -> int:
    from trainer.data.loader import prepare

    b = SHAPES[(args.shape or ["124m"])[0]]
    if args.micro_batch:
        b = dataclasses.replace(b, micro_batch=args.micro_batch)
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="bench_quality_"))
    if not (data_dir / "meta.json").exists():
        prepare([], data_dir, "byte", val_split=0.05, max_bytes=args.data_bytes, log=lambda m: None)
    compile_ = not args.no_compile and device.type == "cuda"
    base = train_curve(b, "gpt2", "adamw", device, data_dir, args.tokens, args.eval_every, args.eval_batches, compile_)
    new = train_curve(b, "modern", args.modern_optimizer, device, data_dir, args.tokens, args.eval_every,
                      args.eval_batches, compile_)
    target = base["points"][-1]["val_loss"]
    reached = tokens_to_reach(new["points"], target)
    summary = {"shape": b.name, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "tokens": base["points"][-1]["tokens"], "gpt2_final_val_loss": target,
               "modern_final_val_loss": new["points"][-1]["val_loss"], "modern_tokens_to_gpt2_final": reached,
               "ratio": reached / base["points"][-1]["tokens"] if reached is not None else None}
    result = {"summary": summary, "curves": [base, new], "date": dt.date.today().isoformat(),
              "trainer_version": __version__, "torch_version": str(torch.__version__)}
    Path(args.curves).write_text(json.dumps(result, indent=1))
    if args.markdown:
        Path(args.markdown).write_text(quality_markdown(result))
    if args.plot:
        plot(result, Path(args.plot))
    print(json.dumps(summary))
    return 0


def quality_markdown(result: dict) -> str:
    s = result["summary"]
    base, new = result["curves"]
    ratio = f"{s['ratio']:.2f}x the tokens" if s["ratio"] is not None else "not reached within the budget"
    lines = [f"Tokens to quality, {s['shape']} on {s['device']} ({result['date']}): GPT-2 + AdamW ends at val loss "
             f"{s['gpt2_final_val_loss']:.4f} after {s['tokens']:,} tokens; modern + {new['optimizer']} reaches it "
             f"in {ratio} (its own final: {s['modern_final_val_loss']:.4f}).", "",
             f"| tokens | GPT-2 + AdamW val loss | modern + {new['optimizer']} val loss |", "|---:|---:|---:|"]
    for a, b in zip(base["points"], new["points"], strict=True):
        lines.append(f"| {a['tokens']:,} | {a['val_loss']:.4f} | {b['val_loss']:.4f} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; no plot (the curves are in the JSON and markdown)", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for c in result["curves"]:
        ax.plot([p["tokens"] for p in c["points"]], [p["val_loss"] for p in c["points"]],
                label=f"{c['arch']} + {c['optimizer']}")
    ax.set_xlabel("tokens")
    ax.set_ylabel("validation loss")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")


# ------------------------------------------------------------------------------------------ reporting


def check_attention(device: torch.device) -> list[dict]:
    """Each SDPA kernel against fp32 math on fresh random bf16 inputs, causal, for both shapes'
    head sizes: relative error of the output and of dq, dk, dv (bf16 kernels land near 1e-2)."""
    import torch.nn.functional as F

    rows = []
    for heads, t, hd in ((12, 1024, 64), (16, 2048, 128)):
        q, k, v = (torch.randn(4, heads, t, hd, device=device, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn(4, heads, t, hd, device=device, dtype=torch.bfloat16)
        ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
        ref = F.scaled_dot_product_attention(*ref_in, is_causal=True)
        ref.backward(dout.double())
        refs = [ref.detach()] + [x.grad for x in ref_in]
        for kernel in ATTENTION_KERNELS[1:]:
            select_attention(kernel)
            for x in (q, k, v):
                x.grad = None
            try:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                out.backward(dout)
            except RuntimeError as e:
                rows.append({"kernel": kernel, "head_dim": hd, "error": str(e).splitlines()[0]})
                continue
            got = [out.detach()] + [x.grad for x in (q, k, v)]
            errs = [float((g.double() - r).norm() / r.norm()) for g, r in zip(got, refs, strict=True)]
            rows.append({"kernel": kernel, "head_dim": hd, "seq": t,
                         **{f"rel_err_{n}": round(e, 5) for n, e in zip(("out", "dq", "dk", "dv"), errs, strict=True)}})
    select_attention("auto")
    return rows


def row_label(r: dict, scoped: bool) -> str:
    """gpt2, modern, memory@256, ...; with both compile scopes measured, modern/model and the like."""
    label = f"{r['arch']}@{r['memory_chunk']}" if r["memory_chunk"] else r["arch"]
    return f"{label}/{r['compile_scope']}" if scoped and r["arch"] != "nanogpt" else label


def calibration_entry(r: dict, b: BenchShape) -> dict:
    s: ModelSpec = r["spec"]
    model = {"name": s.name if r["arch"] != "nanogpt" else f"{b.name}-nanogpt", "d_model": s.d_model,
             "n_layers": s.n_layers, "n_heads": s.n_heads, "d_ff": s.d_ff, "vocab_size": s.vocab_size,
             "params": r["params"]}
    if r["arch"] == "modern":
        model.update(mlp=s.mlp, pos_embedding=s.pos_embedding, norm=s.norm, qk_norm=s.qk_norm,
                     tied_embeddings=s.tied_embeddings, logit_softcap=s.logit_softcap)
    return {
        "gpu": r["device"], "gpu_count": 1, "model": model,
        "seq_len": r["seq_len"], "micro_batch": r["micro_batch"], "precision": r["precision"],
        "optimizer": r["optimizer"], "arch": r["arch"], "compile": r["compile"],
        "tokens_per_s": round(r["tokens_per_s"], 1),
        "mfu": round(r["mfu"], 4) if r["mfu"] is not None else None,
        "peak_mem_gib": round(r["peak_mem_gib"], 2) if r["peak_mem_gib"] is not None else None,
        "date": dt.date.today().isoformat(), "trainer_version": __version__,
        "torch_version": str(torch.__version__), "source": "scripts/bench_trainer.py",
    }


def append_calibration(path: Path, entries: list[dict]) -> None:
    """Append entries as items of a top-level YAML list (the file stays one valid list)."""
    import yaml

    with open(path, "a") as f:
        f.write(yaml.safe_dump(entries, sort_keys=False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", choices=sorted(SHAPES), help="repeatable; default 124m and 1.31b")
    ap.add_argument("--arch", action="append", choices=ARCHES, help="repeatable; default both, side by side")
    ap.add_argument("--modern-optimizer", default="muon", choices=("muon", "adamw"))
    ap.add_argument("--fp8", action="store_true", help="also the modern architecture with FP8 matmuls")
    ap.add_argument("--nanogpt", metavar="DIR", help="also nanoGPT's own model.py from this checkout")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--micro-batch", type=int, help="override the shape's micro-batch")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-mode", default=None, help="e.g. max-autotune (CUDA graphs)")
    ap.add_argument("--loss-chunk-rows", type=int, default=8192)
    ap.add_argument("--attention", default="auto", choices=ATTENTION_KERNELS, help="SDPA kernel (CUDA)")
    ap.add_argument("--compile-scope", default="both", choices=("blocks", "model", "both"),
                    help="hardware.compile: each block (the trainer's default), the whole model, or both "
                         "side by side (default; one scope when nothing compiles, e.g. on CPU)")
    ap.add_argument("--kernel-table", metavar="FILE", help="profile 3 more steps; write the top kernels to FILE")
    ap.add_argument("--json", action="store_true", help="print one JSON object per row")
    ap.add_argument("--write-calibration", metavar="FILE", help="append a YAML entry per row to FILE")
    ap.add_argument("--check-attention", action="store_true", help="compare each SDPA kernel with fp64 math, then exit")
    m = ap.add_argument_group("research models (issue 21)")
    m.add_argument("--memory", action="store_true", help="time the Atlas memory block against the plain model")
    m.add_argument("--memory-chunk", type=int, action="append", help="repeatable; default 2048 and 256")
    m.add_argument("--refine", action="store_true", help="time TRM-style refinement against the plain model")
    m.add_argument("--refine-steps", type=int, default=3)
    q = ap.add_argument_group("tokens to quality (--quality)")
    q.add_argument("--quality", action="store_true", help="train both architectures on the same data and budget")
    q.add_argument("--tokens", type=int, default=500_000_000, help="token budget of each run")
    q.add_argument("--eval-every", type=int, default=250, help="steps between validations")
    q.add_argument("--eval-batches", type=int, default=20)
    q.add_argument("--data-dir", help="prepared byte data (made from Python's standard library when empty)")
    q.add_argument("--data-bytes", type=int, default=64_000_000, help="text to prepare")
    q.add_argument("--curves", default="bench_quality.json", help="both curves and the summary (JSON)")
    q.add_argument("--markdown", help="a table of both curves for BENCHMARKS.md")
    q.add_argument("--plot", help="a PNG of both curves (needs matplotlib)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.check_attention:
        for row in check_attention(device):
            print(json.dumps(row))
        return 0
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("error: no CUDA device (use --device cpu --shape tiny for a smoke test)", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if args.quality:
        return quality(args, device)
    if args.fp8:
        from trainer.model.fp8 import fp8_problem

        problem = fp8_problem(device)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    nanogpt = load_nanogpt(Path(args.nanogpt).expanduser()) if args.nanogpt else None
    runs: list[tuple[str, str, bool, int | None]] = [("nanogpt", "adamw", False, None)] if nanogpt else []
    if args.memory or args.refine:  # the research rows replace the architecture comparison
        runs = [("plain", "adamw", False, None)]
        runs += [("memory", "adamw", False, c) for c in (args.memory_chunk or [2048, 256])] if args.memory else []
        runs += [("refine", "adamw", False, None)] if args.refine else []
    else:
        runs += [(a, "adamw" if a == "gpt2" else args.modern_optimizer, False, None) for a in (args.arch or ARCHES)]
    if args.fp8:
        runs.append(("modern", args.modern_optimizer, True, None))
    compile_ = not args.no_compile and device.type == "cuda"
    scopes = ["blocks", "model"] if args.compile_scope == "both" else [args.compile_scope]
    if not compile_ or args.memory or args.refine:  # nothing to compare / research rows: the default scope
        scopes = scopes[:1]
    # Each of the trainer's rows once per compile scope, side by side (nanoGPT always compiles whole).
    plan = [(run, scope) for run in runs for scope in (["model"] if run[0] == "nanogpt" else scopes)]
    entries = []
    for name in args.shape or ["124m", "1.31b"]:
        b = SHAPES[name]
        rows = []
        for (arch, optimizer, fp8, chunk), scope in plan:
            kt = f"{args.kernel_table}.{name}.{arch}{'' if len(scopes) == 1 else '.' + scope}.txt"
            try:
                r = bench(b, device, arch=arch, optimizer=optimizer, fp8=fp8, compile_=compile_,
                          compile_mode=args.compile_mode, warmup=args.warmup, steps=args.steps,
                          chunk_rows=args.loss_chunk_rows, micro_batch=args.micro_batch, attention=args.attention,
                          compile_scope=scope, kernel_table=Path(kt) if args.kernel_table else None,
                          nanogpt=nanogpt, memory_chunk=chunk, refine_steps=args.refine_steps)
            except ConfigError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            rows.append(r)
            # The planner's calibration shapes cannot state memory or refinement yet, nor a compile
            # scope: the entries are the trainer's default (blocks) rows.
            if arch not in ("memory", "refine") and (scope == "blocks" or arch == "nanogpt" or not compile_):
                entries.append(calibration_entry(r, b))
            if args.json:
                print(json.dumps({k: v for k, v in r.items() if k != "spec"}))
            else:
                mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] is not None else "n/a"
                mem = f"{r['peak_mem_gib']:.1f} GiB" if r["peak_mem_gib"] is not None else "n/a"
                label = row_label(r, len(scopes) > 1)
                print(f"{name:>6} {label:>13} {r['optimizer']:>5} {r['precision']:>4} mb {r['micro_batch']:>3} "
                      f"T {r['seq_len']:>5} | {r['ms_per_step']:8.1f} ms/step | {r['tokens_per_s']:>10,.0f} tok/s | "
                      f"MFU {mfu} | peak mem {mem} | {r['device']}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
        ref = rows[0]
        if not args.json and len(rows) > 1:
            for r in rows[1:]:
                mem = (f", memory {r['peak_mem_gib'] / ref['peak_mem_gib']:.2f}x" if r["peak_mem_gib"] and
                       ref["peak_mem_gib"] else "")
                print(f"{name:>6} {row_label(r, len(scopes) > 1)} {r['precision']} / "
                      f"{row_label(ref, len(scopes) > 1)} {ref['precision']}: "
                      f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}x tokens/s, "
                      f"{r['ms_per_step'] / ref['ms_per_step']:.2f}x step time{mem}")
    if args.write_calibration:
        append_calibration(Path(args.write_calibration), entries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
