"""First-token latency and tokens/s of trainer.serve's engine against the trainer's own generate() loop.

    python scripts/bench_serve.py [--presets tiny,25m] [--streams 1,8] [--prompt-tokens 64] [--new-tokens 128]

For each preset (random weights: speed does not depend on what was learned) and each number of
concurrent streams S:

- ``serve``: S requests submitted at once to :class:`trainer.infer.engine.Engine` (the scheduler the
  HTTP server uses; HTTP itself is left out so the numbers are the decoding's), each generating exactly
  ``--new-tokens`` (ignore_eos). First token: submit -> the first token of a stream, averaged over the
  streams. tokens/s: all streams' tokens / wall time until the last finishes.
- ``generate() x S``: the S requests served one after another by ``GPT.generate`` (no cache, no
  batching: what a server built on it does). First token: averaged over the requests, queueing included.
- ``generate() batch``: one ``GPT.generate`` call on all S prompts at once (same length), its best case.

On a GPU (``--device cuda``) the weights and cache are bf16 and generate() runs under bf16 autocast.
"""

from __future__ import annotations

import argparse
import dataclasses
import queue
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.data.loader import ByteTokenizer  # noqa: E402
from trainer.infer.engine import Delta, Engine, Sequence  # noqa: E402
from trainer.infer.kvcache import SamplingParams  # noqa: E402
from trainer.model.gpt import GPT  # noqa: E402
from trainer.spec.modelspec import ModelSpec  # noqa: E402
from trainer.spec.presets import MODELS  # noqa: E402

PARAMS = SamplingParams(temperature=0.8, top_k=50)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_engine(engine: Engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, float]:
    out: queue.Queue[Delta] = queue.Queue()
    seqs = [Sequence(index=i, prompt=p, params=PARAMS, max_tokens=new_tokens, stop=(), out=out, ignore_eos=True)
            for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    engine.submit(seqs)
    first: dict[int, float] = {}
    left, total = len(seqs), 0
    while left:
        d = out.get(timeout=600)
        first.setdefault(d.index, time.perf_counter() - t0)
        if d.finish_reason:
            left -= 1
            total += d.completion_tokens
    wall = time.perf_counter() - t0
    return sum(first.values()) / len(first), total / wall


def bench_generate(model: GPT, prompts: list[list[int]], new_tokens: int, device: str, batch: bool,
                   ) -> tuple[float, float]:
    """First token: a request's wait for the ones before it plus a 1-token generate() call (timed on
    its own). tokens/s: all tokens / the time of the full generate() calls."""
    gen = torch.Generator(device=device).manual_seed(0)
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda"))
    groups = [prompts] if batch else [[p] for p in prompts]
    firsts: list[float] = []
    busy = 0.0
    with amp:
        for g in groups:
            idx = torch.tensor(g, device=device)
            t0 = time.perf_counter()
            model.generate(idx, 1, PARAMS.temperature, PARAMS.top_k, generator=gen)
            sync(device)
            firsts.extend([busy + time.perf_counter() - t0] * len(g))
            t0 = time.perf_counter()
            model.generate(idx, new_tokens, PARAMS.temperature, PARAMS.top_k, generator=gen)
            sync(device)
            busy += time.perf_counter() - t0
    return sum(firsts) / len(firsts), len(prompts) * new_tokens / busy


def measure_cpu(seconds: float = 1.0) -> tuple[float, float]:
    """(GB/s, TFLOP/s) of this machine as torch sees it: a 256 MB fp32 tensor summed (read once) and a
    1024^3 fp32 matmul, best of a few repetitions."""
    big = torch.ones(64 * 1024 * 1024)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    best_bw = best_fl = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or best_bw == 0.0:
        t0 = time.perf_counter()
        big.sum()
        best_bw = max(best_bw, big.numel() * 4 / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        a @ b
        best_fl = max(best_fl, 2 * 1024**3 / (time.perf_counter() - t0) / 1e12)
    return best_bw, best_fl


def predicted_tokens_per_s(preset: str, streams: int, context: int, bw_gbps: float, tflops: float) -> tuple[float, str]:
    """gpucli plan's serving roofline (gpucli/plan/serving.py) for this CPU: its measured bandwidth and
    matmul rate in place of a datasheet's, fp32 weights, at most ``streams`` sequences decoded together."""
    from gpucli.plan.catalog import load_catalog
    from gpucli.plan.schema import Gpu
    from gpucli.plan.serving import serve_speed

    defaults = dataclasses.replace(load_catalog().defaults, decode_bytes_per_param=4, decode_bandwidth_efficiency=1.0,
                                   cuda_overhead_gb=0.0)
    cpu = Gpu(id="cpu", name="this CPU", aliases=(), vram_gb=1e6, architecture="cpu", bf16_dense_tflops=tflops,
              memory_bandwidth_gbps=bw_gbps, interconnect="pcie", source="measured")
    s = serve_speed(MODELS[preset], cpu, defaults, context=context, max_sequences=streams, matmul_efficiency=1.0)
    return s.tokens_per_s, s.bound


def spec_of(name: str) -> ModelSpec:
    """A preset, or ``PRESET+llama``: its shape as rotary + RMSNorm + SwiGLU with a third of the heads
    as KV heads (grouped-query attention, untied head), or ``PRESET+atlas``: with the Atlas memory."""
    base, _, variant = name.partition("+")
    spec = MODELS[base]
    if variant == "llama":
        return dataclasses.replace(spec, name=name, pos_embedding="rope", norm="rmsnorm", mlp="swiglu",
                                   n_kv_heads=max(1, spec.n_heads // 3), tied_embeddings=False)
    if variant == "atlas":
        return dataclasses.replace(spec, name=name, pos_embedding="rope", memory=True)
    if variant:
        raise SystemExit(f"unknown variant '{variant}' (llama, atlas)")
    return spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="tiny,25m", help="comma-separated; PRESET+llama, PRESET+atlas (spec_of)")
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--skip-generate", action="store_true", help="only the engine (large models)")
    ap.add_argument("--predict", action="store_true", help="also print gpucli plan's serving roofline for this "
                    "machine (its measured bandwidth and matmul rate) beside the engine's tokens/s")
    args = ap.parse_args(argv)
    measured = measure_cpu() if args.predict and args.device == "cpu" else None
    if measured:
        print(f"this CPU: {measured[0]:.1f} GB/s read, {measured[1] * 1e3:.0f} GFLOP/s fp32 matmul")
    streams = [int(s) for s in args.streams.split(",")]
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    print(f"device {args.device}, {torch.get_num_threads()} threads, prompt {args.prompt_tokens} tokens, "
          f"{args.new_tokens} new tokens per stream, temperature {PARAMS.temperature}, top-k {PARAMS.top_k}")
    print("| preset | streams | method | first token (ms) | tokens/s | vs generate() x S |")
    print("|---|---|---|---|---|---|")
    for preset in args.presets.split(","):
        torch.manual_seed(0)
        spec = spec_of(preset)
        model = GPT(spec).to(args.device).eval()
        engine = Engine(model if dtype == torch.float32 else model.to(dtype), ByteTokenizer(),
                        max_batch=max(streams), device=args.device, dtype=dtype).start()
        base = GPT(spec).to(args.device).eval()
        base.load_state_dict(model.state_dict())
        base.float()
        vocab = min(spec.vocab_size, 256)
        g = torch.Generator().manual_seed(1)
        bench_engine(engine, [[1] * 8], 4)  # warm-up
        for s in streams:
            prompts = [torch.randint(0, vocab, (args.prompt_tokens,), generator=g).tolist() for _ in range(s)]
            rows = [("serve (KV cache, batched)", *bench_engine(engine, prompts, args.new_tokens))]
            if not args.skip_generate:
                rows.append(("generate() x S", *bench_generate(base, prompts, args.new_tokens, args.device, False)))
                if s > 1:
                    rows.append(("generate() batch", *bench_generate(base, prompts, args.new_tokens, args.device,
                                                                     True)))
            ref = rows[1][2] if len(rows) > 1 else None
            for name, first, tps in rows:
                ratio = f"{tps / ref:.1f}x" if ref else "-"
                print(f"| {preset} | {s} | {name} | {first * 1000:.0f} | {tps:,.0f} | {ratio} |", flush=True)
            if measured:
                want, bound = predicted_tokens_per_s(preset, s, args.prompt_tokens + args.new_tokens, *measured)
                print(f"| {preset} | {s} | gpucli plan's roofline ({bound}-bound) | - | {want:,.0f} | "
                      f"engine at {rows[0][2] / want:.0%} of it |", flush=True)
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
