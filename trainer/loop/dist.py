"""The process group, and how the model is spread over it: one process, DDP, or FSDP2 shards."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.loop.entry import setup_logging
from trainer.loop.nodes import global_rank
from trainer.model.fp8 import enable_fp8
from trainer.model.gpt import GPT, select_attention
from trainer.spec.config import Config, ConfigError
from trainer.spec.resolve import ModelShape


@dataclass
class Dist:
    rank: int
    local_rank: int
    world: int
    device: torch.device
    ctrl: Any = None  # a gloo group for small CPU-side agreements (no GPU sync)

    @property
    def master(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier(group=self.ctrl)

    def gather(self, obj: Any) -> list[Any]:
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.ctrl)
        return out

    def max_flags(self, flags: list[float]) -> list[float]:
        if self.world == 1:
            return flags
        t = torch.tensor(flags, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctrl)
        return t.tolist()

    def broadcast(self, obj: Any) -> Any:
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.ctrl)
        return box[0]

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.AVG if t.is_cuda else dist.ReduceOp.SUM)
            if not t.is_cuda:
                t /= self.world
        return t


def setup_dist(cfg: Config) -> Dist:
    rank = global_rank(int(os.environ.get("RANK", 0)))  # gpucli's node order across nodes (trainer.loop.nodes)
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    want = cfg.hardware.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("hardware.device=cuda but no CUDA device is visible")
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
        torch.backends.cuda.matmul.allow_tf32 = True  # the few fp32 matmuls outside autocast
        torch.backends.cudnn.allow_tf32 = True
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    ctrl = None
    # One process under torchrun may still shard (hardware.fsdp=on): a 1-rank group exercises the
    # FSDP2 path, its sharded checkpoints and compile on a single GPU.
    if world > 1 or (cfg.hardware.fsdp == "on" and "MASTER_ADDR" in os.environ):
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", rank=rank, world_size=world,
                                **({"device_id": device} if use_cuda else {}))
        ctrl = dist.new_group(backend="gloo") if use_cuda else dist.group.WORLD
    return Dist(rank, local_rank, world, device, ctrl)


def want_fsdp(cfg: Config, d: Dist, shape: ModelShape) -> bool:
    mode = cfg.hardware.fsdp
    if mode == "on":
        if not dist.is_initialized():
            raise ConfigError("hardware.fsdp=on needs torchrun (torchrun --nproc_per_node=N -m trainer.train)")
        return True
    if mode == "off" or d.world == 1 or d.device.type != "cuda":
        return False
    # fp32 weights + grads + two Adam moments = 16 bytes/param; shard when that passes half the GPU.
    return shape.num_params() * 16 > 0.5 * torch.cuda.get_device_properties(d.device).total_memory


def build_model(cfg: Config, d: Dist, shape: ModelShape, amp: bool) -> tuple[GPT, torch.nn.Module, bool]:
    """(the plain model, what the loop calls: itself, DDP or FSDP2, whether it is sharded).

    The caller seeds torch first: every rank builds identical weights (DDP also broadcasts rank 0's)."""
    fsdp = want_fsdp(cfg, d, shape)
    cuda = d.device.type == "cuda"
    with torch.device("meta" if fsdp else d.device):
        raw = GPT(shape)
    raw.loss_chunk_rows = cfg.hardware.loss_chunk_rows
    if cfg.hardware.fp8:  # before sharding, DDP and compile, as torchao asks
        enable_fp8(raw, d.device)
    model: torch.nn.Module = raw
    if fsdp:
        _shard(raw, d.device, amp)
    elif d.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(raw, device_ids=[d.local_rank] if cuda else None)
    if cuda:
        select_attention(cfg.hardware.attention)
    if cuda:
        compile_model(raw, cfg.hardware.compile, cfg.hardware.compile_mode)
    return raw, model, fsdp


def compile_model(raw: GPT, scope: str, mode: str | None = None, backend: str = "inductor") -> None:
    """hardware.compile, in place (``Module.compile``: the state-dict keys stay plain, and DDP/FSDP2
    wrap the same module). 'blocks': each block, one graph serving every layer, plus the loss
    kernels; 'model': the whole forward as one graph (embedding, blocks, the fused chunked head and
    loss trace without a break). On an H100 (BENCHMARKS.md) 'model' gave +1.8 % / +0.7 % tokens/s at
    124M / 1.31B, inside the default's run-to-run spread, for 28 s / 73 s of compiling instead of
    12 s / 11 s, so 'blocks' stays the default until ``scripts/bench_trainer.py --compile-scope both``
    shows more. 'off': eager. ``backend`` lets CPU tests trace without a C compiler."""
    if scope == "blocks":
        raw.compile_blocks(mode)
    elif scope == "model":
        raw.compile(mode=mode, backend=backend)
    elif scope != "off":
        raise ConfigError(f"hardware.compile must be off, blocks or model, got {scope!r}")


def _shard(raw: GPT, device: torch.device, amp: bool) -> None:
    """FSDP2: shard each block and the root; weights materialize only as shards."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # lazy: FSDP only when sharding

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if amp else None
    kw = {"mp_policy": mp} if mp is not None else {}
    for block in raw.blocks:
        fully_shard(block, **kw)
    fully_shard(raw, **kw)
    raw.to_empty(device=device)
    with torch.no_grad():
        raw.reset_parameters()


def rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def start_process(cfg: Config) -> Dist:
    """This process in the run: its rank in the process group, the run folder made by rank 0 before
    any rank writes there, and the log set up (rank 0 at INFO, the others warnings only)."""
    d = setup_dist(cfg)
    out_dir = Path(cfg.training.out_dir)
    if d.master:
        out_dir.mkdir(parents=True, exist_ok=True)
    d.barrier()
    setup_logging(out_dir, d.master)
    return d
