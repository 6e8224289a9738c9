"""The machine checked before the long run is detached: a few minutes that fail in the first minute
instead of the first hour.

    python -m trainer.preflight --config run.yaml --out ../preflight [--peak-tflops 989.5 --min-share 0.45]
    torchrun --standalone --nproc_per_node=8 -m trainer.preflight --config run.yaml --out ../preflight

In order, each rank on its own device:

1. the device as rented: GPUs visible (``--gpus``, the count paid for) and their name;
2. the torch build knows the GPU: ``torch.cuda.get_arch_list()`` holds a kernel image the device runs
   (its ``sm_XX``, or one of the same major version and a lower minor, which CUDA runs as it is);
3. a bf16 matmul's TFLOPS against the GPU's peak (``--peak-tflops``, from gpucli's catalogue): below
   ``--min-share`` of it the host is a bad host, and both numbers say so. On a CPU: an fp32 matmul,
   measured and reported as such, with no peak to hold it to;
4. the host-to-GPU copy of a pinned 256 MB buffer (GB/s); on several processes, one all-reduce (NCCL on GPUs, gloo on CPUs): the bus bandwidth as nccl-tests
   defines it (2 (n-1)/n x bytes / time);
5. the disk the run writes to: MB/s of a write with fsync;
6. ``--steps`` optimizer steps of the run's own configuration (its model, micro-batch, sequence length,
   compile, FP8, FSDP and data: the trainer's own code, built from run.yaml) after ``--warmup`` steps,
   in ``--out`` (its own folder: nothing the run's ``--resume auto`` would take): tokens/s and peak memory.

Each rank writes ``OUT/result_rank<R>.json``: ``{"ok": true, ...figures}`` or ``{"ok": false, "stage",
"error", "fix"}`` with the cause and what to change in one line each. Exit status 0, 1 (a check failed),
2 (the configuration) or 124 (``--deadline-s`` passed: a hung collective or compile).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.loop.dist import start_process
from trainer.loop.entry import parse_argv
from trainer.spec.config import ConfigError
from trainer.spec.load import load_config
from trainer.watch.metrics import memory_gib, mfu

EXIT_DEADLINE = 124


class CheckFailed(Exception):
    """A check the machine did not pass: ``stage``, the cause, what to change."""

    def __init__(self, stage: str, error: str, fix: str) -> None:
        super().__init__(error)
        self.stage, self.error, self.fix = stage, error, fix


def arch_verdict(capability: tuple[int, int], arch_list: list[str]) -> tuple[bool, str]:
    """(whether this torch build has a kernel image the device runs, the words for it). CUDA runs a
    cubin built for sm_XY on any sm_XZ with Z >= Y (same major), and PTX (``compute_XY``) is compiled
    for a newer device when it loads (slow at start, and not every kernel ships PTX)."""
    major, minor = capability
    sm = f"sm_{major}{minor}"
    cubins = [(int(a[3:-1]), int(a[-1])) for a in arch_list if a.startswith("sm_") and a[3:].isdigit()]
    if any(mj == major and mn <= minor for mj, mn in cubins):
        return True, sm
    ptx = [a for a in arch_list if a.startswith("compute_") and a[8:].isdigit()
           and (int(a[8:-1]), int(a[-1])) <= (major, minor)]
    if ptx:
        return True, f"{sm} (PTX {ptx[-1]} compiled at load)"
    return False, sm


def _time(fn: Any, iters: int, cuda: bool) -> float:
    """Seconds per call of ``fn`` (the device synchronised around the timed calls)."""
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def check_device(device: torch.device, want_gpus: int | None, world: int) -> dict[str, Any]:
    if device.type != "cuda":
        return {"device": "cpu", "gpu_name": None, "gpus_seen": 0, "arch": None, "arch_ok": None}
    seen = torch.cuda.device_count()
    name = torch.cuda.get_device_name(device)
    if want_gpus is not None and seen < want_gpus:
        raise CheckFailed("gpus", f"{want_gpus} GPUs rented, the host shows {seen} ({name})",
                          "a bad host: end it and launch again for another machine")
    ok, arch = arch_verdict(torch.cuda.get_device_capability(device), torch.cuda.get_arch_list())
    if not ok:
        raise CheckFailed("arch", f"torch {torch.__version__} (CUDA {torch.version.cuda}) has no kernels for "
                          f"{name} ({arch}; it has {' '.join(torch.cuda.get_arch_list())})",
                          "use an image whose torch is built for this GPU (Blackwell needs CUDA >= 12.8), "
                          "or pick another GPU")
    return {"device": "cuda", "gpu_name": name, "gpus_seen": seen, "arch": arch, "arch_ok": True,
            "gpu_mem_gb": round(torch.cuda.get_device_properties(device).total_memory / 1e9, 1)}


def check_matmul(device: torch.device, peak_tflops: float | None, min_share: float | None) -> dict[str, Any]:
    """bf16 on a GPU (an 8192-square GEMM, the size cuBLAS reaches its peak at), fp32 on a CPU."""
    cuda = device.type == "cuda"
    n, dtype, iters = (8192, torch.bfloat16, 20) if cuda else (512, torch.float32, 5)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    _time(lambda: a @ b, 3, cuda)
    tflops = 2 * n**3 / _time(lambda: a @ b, iters, cuda) / 1e12
    out: dict[str, Any] = {"matmul_tflops": round(tflops, 3), "matmul_dtype": str(dtype).removeprefix("torch.")}
    if not cuda or not peak_tflops:
        return out  # a CPU, or a GPU the catalogue has no peak for: measured, held to nothing
    share = tflops / peak_tflops
    out.update(peak_tflops=peak_tflops, matmul_share=round(share, 3), min_share=min_share)
    if min_share is not None and share < min_share:
        raise CheckFailed("matmul", f"bf16 matmul at {tflops:.0f} TFLOPS, {share:.0%} of the {peak_tflops:g} "
                          f"TFLOPS peak (a healthy host reaches {min_share:.0%} or more)",
                          "a bad host (throttled or shared GPU): end it and launch again for another machine")
    return out


def check_copy(device: torch.device) -> dict[str, Any]:
    """GB/s of a pinned 256 MB host-to-GPU copy: what every batch crosses (a narrow PCIe link shows here)."""
    if device.type != "cuda":
        return {}
    host = torch.empty(64 << 20, dtype=torch.float32).pin_memory()
    dev = torch.empty_like(host, device=device)
    seconds = _time(lambda: dev.copy_(host, non_blocking=True), 5, True)
    return {"h2d_gbps": round(host.numel() * host.element_size() / seconds / 1e9, 2)}


def check_allreduce(device: torch.device, world: int) -> dict[str, Any]:
    if world < 2 or not dist.is_initialized():
        return {}
    cuda = device.type == "cuda"
    x = torch.ones((64 << 20) if cuda else (4 << 20), device=device, dtype=torch.float32)
    dist.all_reduce(x)
    seconds = _time(lambda: dist.all_reduce(x), 5 if cuda else 3, cuda)
    nbytes = x.numel() * x.element_size()
    return {"allreduce_backend": dist.get_backend(), "allreduce_mb": nbytes >> 20,
            "allreduce_busbw_gbps": round(2 * (world - 1) / world * nbytes / seconds / 1e9, 3)}


def check_disk(folder: Path, cuda: bool) -> dict[str, Any]:
    """MB/s of a write with fsync where the run writes its checkpoints (random blocks: a compressing
    filesystem is not measured on zeros)."""
    block = os.urandom(1 << 20)
    mb = 256 if cuda else 32
    path = folder / ".disk-probe"
    t0 = time.perf_counter()
    with open(path, "wb") as fh:
        for _ in range(mb):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    seconds = time.perf_counter() - t0
    path.unlink()
    return {"disk_write_mb_s": round(mb / seconds, 1)}


def oom_fix(cfg: Any, device: torch.device) -> tuple[str, str]:
    t = cfg.training
    gb = torch.cuda.get_device_properties(device).total_memory / 1e9 if device.type == "cuda" else 0
    where = f"on {gb:.0f} GB" if gb else "on this machine"
    error = f"CUDA out of memory at micro-batch {t.batch_size} (seq {t.seq_len or cfg.model.max_seq_len}) {where}"
    if t.batch_size > 1:
        half = t.batch_size // 2
        return error, (f"try --set training.batch_size={half} --set training.grad_accum_steps="
                       f"{t.grad_accum_steps * 2} (the same sequences per step)")
    return error, "a smaller --model, more GPUs (FSDP shards the state: --set hardware.fsdp=on) or a larger GPU"


def run_steps(cfg: Any, d: Any, steps: int, warmup: int) -> dict[str, Any]:
    """The trainer's own step, built as the run builds it, ``warmup`` + ``steps`` times."""
    from trainer.train import Trainer  # the run's own code: model, FSDP/DDP, compile, FP8, optimizer, data

    if d.device.type == "cuda":  # the checks' buffers are neither the run's memory nor its peak
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(d.device)
    trainer = Trainer(cfg, d, started_at=time.time())
    try:
        cuda = d.device.type == "cuda"
        trainer.model.train()
        seconds, tokens, losses = 0.0, 0, []
        for i in range(warmup + steps):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss, _, n = trainer.train_step()
            value = float(loss.item())  # waits for the step
            if i >= warmup:
                seconds += time.perf_counter() - t0
                tokens += n
                losses.append(value)
        if not all(math.isfinite(v) for v in losses):
            raise CheckFailed("steps", f"the loss is not finite in the preflight's steps ({losses})",
                              "lower the learning rate, or check the data")
        tok_s = tokens / seconds if seconds > 0 else 0.0
        seq = trainer.loader.seq_len
        shape = trainer.shape
        return {"steps": steps, "warmup_steps": warmup, "tokens_per_s": round(tok_s, 1),
                "peak_mem_gib": round(max(d.gather(memory_gib(d.device))), 3), "loss": round(losses[-1], 4),
                "mfu": mfu(tok_s, trainer.raw.flops_per_token(seq), trainer.peak, d.world),
                "micro_batch": cfg.training.batch_size, "grad_accum": cfg.training.grad_accum_steps, "seq_len": seq,
                "world": d.world, "fsdp": trainer.fsdp, "fp8": bool(cfg.hardware.fp8),
                "compile": cfg.hardware.compile if cuda else "off", "amp": trainer.amp,
                "model_shape": {k: getattr(shape, k) for k in ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size")}}
    finally:
        trainer.close()


class Result:
    """This rank's result file, written once: the verdict, or the deadline's."""

    def __init__(self, out: Path, rank: int) -> None:
        self.path = out / f"result_rank{rank}.json"
        self.stage = "start"
        self._lock = threading.Lock()
        self._written = False

    def write(self, data: dict[str, Any]) -> bool:
        with self._lock:
            if self._written:
                return False
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, default=str) + "\n")
            os.replace(tmp, self.path)
            self._written = True
            return True


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    ap = argparse.ArgumentParser(prog="python -m trainer.preflight", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the preflight's own folder")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2, help="steps before the measured ones (compile, allocator)")
    ap.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak (gpucli's catalogue)")
    ap.add_argument("--min-share", type=float, help="the share of it a healthy host reaches")
    ap.add_argument("--gpus", type=int, help="GPUs rented: fewer visible is a bad host")
    ap.add_argument("--deadline-s", type=float, default=900.0)
    args, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("RANK", 0))
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    result = Result(out, rank)
    result.path.unlink(missing_ok=True)

    def deadline() -> None:
        if result.write({"ok": False, "stage": result.stage, "error": f"did not finish in {args.deadline_s:g} s "
                         f"(at: {result.stage})", "fix": "a hung GPU or collective is a bad host; a long compile "
                         "or data preparation needs a longer GPUCLI_PREFLIGHT_TIMEOUT_S"}):
            os._exit(EXIT_DEADLINE)

    timer = threading.Timer(args.deadline_s, deadline)
    timer.daemon = True
    timer.start()
    figures: dict[str, Any] = {"torch": torch.__version__, "cuda_build": torch.version.cuda}
    cfg: Any = None
    d: Any = None
    try:
        result.stage = "config"
        config_path, overrides = parse_argv(rest, usage=__doc__ or "")
        probe = load_config(config_path, overrides)
        data_dir = probe.data.dir or str(Path(probe.training.out_dir) / "data")  # the run's: prepared once
        cfg = load_config(config_path, [*overrides, f"--training.out_dir={out}", f"--data.dir={data_dir}",
                                        "--notifications.telegram.enabled=false", "--tracking.backend=none",
                                        "--notifications.cost_update_hours=null"])
        d = start_process(cfg)
        for stage, check in (("device", lambda: check_device(d.device, args.gpus, d.world)),
                             ("matmul", lambda: check_matmul(d.device, args.peak_tflops, args.min_share)),
                             ("copy", lambda: check_copy(d.device)),
                             ("allreduce", lambda: check_allreduce(d.device, d.world)),
                             ("disk", lambda: check_disk(out, d.device.type == "cuda") if d.local_rank == 0 else {}),
                             ("steps", lambda: run_steps(cfg, d, args.steps, args.warmup))):
            result.stage = stage
            figures.update(check())
        if d.world > 1:  # the slowest GPU's matmul is the machine's
            figures["matmul_tflops"] = min(d.gather(figures["matmul_tflops"]))
        figures["seconds"] = round(time.time() - started, 1)
        result.write({"ok": True, **figures})
        return 0
    except CheckFailed as e:
        result.write({"ok": False, "stage": e.stage, "error": e.error, "fix": e.fix, **figures})
        return 1
    except torch.cuda.OutOfMemoryError:
        error, fix = oom_fix(cfg, d.device)
        result.write({"ok": False, "stage": result.stage, "error": error, "fix": fix, **figures})
        return 1
    except (ConfigError, ValueError, FileNotFoundError) as e:
        result.write({"ok": False, "stage": result.stage, "error": f"trainer config: {e}",
                      "fix": "change the --set or run.yaml value it names", **figures})
        return 2
    except Exception as e:  # noqa: BLE001 - any other failure is this machine's verdict, in one line
        text = str(e).strip().splitlines()
        result.write({"ok": False, "stage": result.stage, "error": f"{type(e).__name__}: {text[0][:300] if text else ''}",
                      "fix": "see preflight.log in the run's folder", **figures})
        return 1
    finally:
        timer.cancel()
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
