"""Train a GPT: one process or many, on GPUs or CPU, resumable at any step.

    torchrun --standalone --nproc_per_node=8 -m trainer.train --config run.yaml --resume auto
    python -m trainer.train --config run.yaml --training.max_steps=20 --hardware.device=cpu

Any config key can be overridden as ``--section.key=value`` (YAML scalars); ``--resume X`` is
``--training.resume=X``. A bad key or value is a one-line error with exit status 2.

Outputs, all under ``training.out_dir``: metrics.jsonl, train.log, high_loss.jsonl, samples.jsonl,
tb/, status.json and checkpoints/step_NNNNNN/{model.pt, optim_rank*.pt, meta.json}. The run ends
with a final checkpoint and a ``{"kind": "event", "event": "finished", "reason": ...}`` row;
reasons: max_steps, max_hours, max_cost, early_stop, signal. Exit status 0, or 143/130 after
SIGTERM/SIGINT (after the emergency checkpoint is on disk).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainer import __version__
from trainer import checkpoint as ckpt
from trainer.config import Config, ConfigError, expand_env, load_config
from trainer.data import BatchLoader, TokenSplit, load_tokenizer, prepare, val_batches
from trainer.metrics import MetricsLogger, SpikeDetector, mfu, peak_flops, safe_exp
from trainer.model import GPT, ModelShape, resolve_shape, select_attention
from trainer.notify import Notifier, read_log_tail
from trainer.tcf import TCFTracker

log = logging.getLogger("trainer")

FAULT_KILL_ENV = "TRAINER_FAULT_KILL_AT_STEP"
"""Fault injection for tests: SIGKILL this process right after the given step."""
FAULT_RAISE_ENV = "TRAINER_FAULT_RAISE_AT_STEP"
"""Fault injection for tests: raise a RuntimeError right after the given step (the error path)."""
FAULT_HANG_ENV = "TRAINER_FAULT_HANG_AT_STEP"
"""Fault injection for tests: stop making progress (sleep, ignoring nothing) after the given step."""


def print0(msg: str) -> None:
    """Log on rank 0 only (other ranks log warnings and errors)."""
    log.info(msg)


# ---------------------------------------------------------------------------------------------
# Process group


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
    rank = int(os.environ.get("RANK", 0))
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
        dist.init_process_group(backend="nccl" if use_cuda else "gloo",
                                **({"device_id": device} if use_cuda else {}))
        ctrl = dist.new_group(backend="gloo") if use_cuda else dist.group.WORLD
    return Dist(rank, local_rank, world, device, ctrl)


def setup_logging(out_dir: Path, master: bool) -> None:
    fmt = logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S")
    root = logging.getLogger("trainer")
    root.handlers.clear()
    root.propagate = False
    root.setLevel(logging.INFO if master else logging.WARNING)
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(fmt)
    root.addHandler(h)
    if master:
        fh = logging.FileHandler(out_dir / "train.log")
        fh.setFormatter(fmt)
        root.addHandler(fh)


# ---------------------------------------------------------------------------------------------
# Pieces of the loop


def lr_factor(step: int, warmup: int, max_steps: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine down to ``min_ratio`` at max_steps."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if max_steps <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, cfg: Config, fused: bool) -> torch.optim.AdamW:
    """Three groups: embeddings (own LR, no decay), matrices (decayed), norms (no decay)."""
    t = cfg.training
    emb_scale = (t.embedding_lr or t.learning_rate) / t.learning_rate
    emb, mat, other = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name.split(".")[-2] in ("wte", "wpe"):
            emb.append(p)
        elif p.dim() >= 2:
            mat.append(p)
        else:
            other.append(p)
    groups = [
        {"params": emb, "weight_decay": 0.0, "lr_scale": emb_scale, "name": "embedding"},
        {"params": mat, "weight_decay": t.weight_decay, "lr_scale": 1.0, "name": "matrix"},
        {"params": other, "weight_decay": 0.0, "lr_scale": 1.0, "name": "norm"},
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=t.learning_rate,
                             betas=(t.beta1, t.beta2), fused=fused)


def rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    except Exception:
        return float("nan")


def write_status(out_dir: Path, **fields: Any) -> None:
    tmp = out_dir / "status.json.tmp"
    tmp.write_text(json.dumps({**fields, "updated": time.time()}))
    tmp.replace(out_dir / "status.json")


# ---------------------------------------------------------------------------------------------
# The trainer


class Trainer:
    def __init__(self, cfg: Config, d: Dist, started_at: float | None = None) -> None:
        self.cfg, self.d = cfg, d
        self.started_at = started_at  # when this process's work began (epoch s); None: when run() starts
        t = cfg.training
        self.out_dir = Path(t.out_dir)
        self.ckpt_root = self.out_dir / "checkpoints"
        self.max_steps = cfg.resolved_max_steps()
        self.device = d.device
        self.cuda = d.device.type == "cuda"
        self.amp = self.cuda and cfg.hardware.mixed_precision

        # Data first: the model's vocabulary comes from it.
        self.data_dir = Path(cfg.data.dir) if cfg.data.dir else self.out_dir / "data"
        if d.master and not (self.data_dir / "meta.json").exists():
            prepare(cfg.data.inputs, self.data_dir, cfg.data.tokenizer, cfg.data.bpe_vocab_size,
                    cfg.data.val_split, cfg.data.max_bytes, log=print0)
        d.barrier()
        self.train_split = TokenSplit(self.data_dir, "train")
        self.val_split = TokenSplit(self.data_dir, "val")
        m = cfg.model
        self.shape: ModelShape = resolve_shape(
            m.preset, data_vocab_size=self.train_split.meta["vocab_size"], d_model=m.d_model,
            n_layers=m.n_layers, n_heads=m.n_heads, d_ff=m.d_ff, vocab_size=m.vocab_size,
            max_seq_len=m.max_seq_len, dropout=m.dropout, tie_embeddings=m.tie_embeddings)
        self.seq1 = t.seq_len or self.shape.max_seq_len
        self.seq2 = t.stage2_seq_len or self.seq1
        for name, v in (("training.seq_len", self.seq1), ("training.stage2_seq_len", self.seq2)):
            if v > self.shape.max_seq_len:
                raise ConfigError(f"{name}={v} exceeds model max_seq_len {self.shape.max_seq_len}")
        self.loader = BatchLoader(self.train_split, t.batch_size, self.seq_for(0), d.rank, d.world, t.seed)

        # Model: identical init on every rank (DDP also broadcasts rank 0's weights).
        torch.manual_seed(t.seed)
        self.fsdp = self._want_fsdp()
        self.raw = self._build_model()
        self.model: torch.nn.Module = self.raw
        if self.fsdp:
            self._shard()
        elif d.world > 1:
            self.model = torch.nn.parallel.DistributedDataParallel(
                self.raw, device_ids=[d.local_rank] if self.cuda else None)
        if self.cuda:
            select_attention(cfg.hardware.attention)
        if cfg.hardware.compile and self.cuda:
            self.raw.compile_blocks(cfg.hardware.compile_mode)
        self.optimizer = build_optimizer(self.model, cfg, fused=self.cuda)
        self.staging = ckpt.HostStaging() if self.cuda else None
        torch.manual_seed(t.seed + 1000 * d.rank)  # dropout differs across ranks, reproducibly

        # Loop state (all of it is in the checkpoint).
        self.step = 0
        self.tokens_seen = 0
        self.best_val: float | None = None
        self.bad_vals = 0
        self.elapsed_before = 0.0
        self.last_train_loss: float | None = None
        self.last_val_loss: float | None = None
        self.last_ckpt_step = -1
        self.last_val_step = -1

        self.metrics = MetricsLogger(self.out_dir, enabled=d.master)
        tg = cfg.notifications.telegram
        self.notifier = Notifier(expand_env(tg.bot_token), expand_env(tg.chat_id), enabled=tg.enabled and d.master,
                                 events=cfg.notifications.events, timeout_s=tg.timeout_s)
        self.next_cost_update_h = math.inf
        self.spikes = SpikeDetector(factor=t.spike_factor)
        self.tcf = TCFTracker()
        self.peak = peak_flops(torch.cuda.get_device_name(d.device) if self.cuda else None)
        self.stop_requested = 0  # signal number
        self.pending_losses: list[tuple[int, torch.Tensor, np.ndarray]] = []

    # -- setup helpers ---------------------------------------------------------------------

    def seq_for(self, step: int) -> int:
        s1 = self.cfg.training.stage1_steps
        return self.seq2 if s1 is not None and step >= s1 else self.seq1

    def stage_for(self, step: int) -> int:
        s1 = self.cfg.training.stage1_steps
        return 2 if s1 is not None and step >= s1 else 1

    def _want_fsdp(self) -> bool:
        mode = self.cfg.hardware.fsdp
        if mode == "on":
            if not dist.is_initialized():
                raise ConfigError("hardware.fsdp=on needs torchrun (torchrun --nproc_per_node=N -m trainer.train)")
            return True
        if mode == "off" or self.d.world == 1 or not self.cuda:
            return False
        s = self.shape
        approx_params = 12 * s.n_layers * s.d_model**2 + s.vocab_size * s.d_model
        # fp32 weights + grads + two Adam moments = 16 bytes/param; shard when that passes half the GPU.
        return approx_params * 16 > 0.5 * torch.cuda.get_device_properties(self.device).total_memory

    def _build_model(self) -> GPT:
        if self.fsdp:
            with torch.device("meta"):
                model = GPT(self.shape)
        else:
            with torch.device(self.device):
                model = GPT(self.shape)
        model.loss_chunk_rows = self.cfg.hardware.loss_chunk_rows
        return model

    def _shard(self) -> None:
        """FSDP2: shard each block and the root; weights materialize only as shards."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.amp else None
        kw = {"mp_policy": mp} if mp is not None else {}
        for block in self.raw.blocks:
            fully_shard(block, **kw)
        fully_shard(self.raw, **kw)
        self.raw.to_empty(device=self.device)
        with torch.no_grad():
            self.raw.reset_parameters()

    def autocast(self):
        if self.amp:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def eager(self):
        """Run compiled blocks eagerly: generation grows the sequence one token at a time, which
        would otherwise recompile the blocks for each new length."""
        stance = getattr(torch.compiler, "set_stance", None)
        if stance is None or not (self.cfg.hardware.compile and self.cuda):
            return contextlib.nullcontext()
        return stance("force_eager")

    def to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        if self.cuda:
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    # -- checkpoints -------------------------------------------------------------------------

    def model_state(self) -> dict | None:
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            sd = get_model_state_dict(self.raw, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            return sd if self.d.master else None
        if not self.d.master:
            return None
        return {k: v.detach() for k, v in self.raw.state_dict().items()}  # to host in save_checkpoint

    def optim_state(self) -> dict:
        """This rank's optimizer file: FSDP ranks each hold a shard; DDP ranks hold identical moments,
        so only rank 0 writes them (8 GPUs would otherwise write 8 copies, 12 bytes per parameter
        each) and the others write just their RNG state."""
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

            opt = get_optimizer_state_dict(self.raw, self.optimizer)
        else:
            opt = self.optimizer.state_dict() if self.d.master else None
        return {"optimizer": opt, "rng": rng_state(self.device)}

    def save(self, kind: str) -> Path:
        t0 = time.perf_counter()
        meta = {
            "kind": kind, "train_loss": self.last_train_loss, "val_loss": self.last_val_loss,
            "best_val_loss": self.best_val, "bad_vals": self.bad_vals, "tokens_seen": self.tokens_seen,
            "elapsed_s": self.elapsed(), "cost_usd": self.cost(), "data_state": self.loader.state_dict(),
            "stage": self.stage_for(self.step), "model_shape": self.shape.__dict__,
            "config": self.cfg.to_dict(), "trainer_version": __version__, "time": time.time(),
            "tokenizer": self.train_split.meta["tokenizer"],
        }
        extra = {"data_meta.json": self.data_dir / "meta.json"}
        if (self.data_dir / "tokenizer.json").exists():
            extra["tokenizer.json"] = self.data_dir / "tokenizer.json"
        path = ckpt.save_checkpoint(
            self.ckpt_root, self.step, rank=self.d.rank, world=self.d.world, model_state=self.model_state(),
            optim_state=self.optim_state(), meta=meta, extra_files=extra, barrier=self.d.barrier,
            gather=self.d.gather, staging=self.staging)
        self.last_ckpt_step = self.step
        self.last_ckpt_seconds = time.perf_counter() - t0
        if self.d.master:
            removed = ckpt.prune(self.ckpt_root, self.cfg.training.keep_last)
            print0(f"checkpoint {path.name} ({kind}) in {time.perf_counter() - t0:.1f}s"
                   + (f", pruned {', '.join(p.name for p in removed)}" if removed else ""))
            self.metrics.event("checkpoint", step=self.step, path=str(path), checkpoint_kind=kind,
                               val_loss=self.last_val_loss)
            self.notifier.checkpoint_saved(self.step, self.last_train_loss, safe_exp(self.last_train_loss)
                                           if self.last_train_loss is not None else None, kind)
        return path

    def resume(self, target: str) -> None:
        if target == "none":
            return
        if target == "auto":
            chosen = None
            if self.d.master:
                p = ckpt.find_resumable(self.ckpt_root, self.d.world, log=print0)
                chosen = str(p) if p else None
            chosen = self.d.broadcast(chosen)
            if chosen is None:
                print0("resume auto: no usable checkpoint, starting fresh")
                return
        else:
            chosen = target
            if self.d.master:
                ok, reason = ckpt.verify(Path(chosen))
                if not ok:
                    raise ConfigError(f"cannot resume from {chosen}: {reason}")
        path = Path(chosen)
        meta = ckpt.read_meta(path)
        assert meta is not None
        state = ckpt.load_model_state(path) if (self.d.master or not self.fsdp) else {}
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(self.raw, state, options=StateDictOptions(full_state_dict=True,
                                                                           broadcast_from_rank0=True))
        else:
            self.raw.load_state_dict(state)
        opt = ckpt.load_optim_state(path, self.d.rank, trusted=self.fsdp) if meta.get("world_size") == self.d.world else None
        if opt is not None and not self.fsdp and opt.get("optimizer") is None:
            # DDP: the moments are in rank 0's file only (older checkpoints: in every rank's file).
            shared = ckpt.load_optim_state(path, 0)
            opt["optimizer"] = shared["optimizer"] if shared else None
        if opt is not None and opt.get("optimizer") is not None:
            if self.fsdp:
                from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

                set_optimizer_state_dict(self.raw, self.optimizer, opt["optimizer"])
            else:
                self.optimizer.load_state_dict(opt["optimizer"])
            set_rng_state(opt["rng"], self.device)
        else:
            print0("resume: optimizer state not restored (different world size); moments restart from zero")
        self.step = int(meta["step"])
        self.tokens_seen = int(meta.get("tokens_seen", 0))
        self.best_val = meta.get("best_val_loss")
        self.bad_vals = int(meta.get("bad_vals", 0))
        self.elapsed_before = float(meta.get("elapsed_s", 0.0))
        self.last_train_loss, self.last_val_loss = meta.get("train_loss"), meta.get("val_loss")
        self.loader.load_state_dict(meta["data_state"])
        self.last_ckpt_step = self.step
        print0(f"resumed from {path.name} at step {self.step}")
        self.metrics.event("resumed", step=self.step, path=str(path))

    # -- clocks and money --------------------------------------------------------------------

    def elapsed(self) -> float:
        return self.elapsed_before + (time.time() - self.t_start)

    def cost(self) -> float | None:
        price = self.cfg.limits.price_per_hour
        return None if price is None else self.elapsed() / 3600 * price

    def reserve_s(self) -> float:
        """Time to keep in hand before an hour or dollar cap: one more step, the final checkpoint
        and shutdown, so the run ends *at* the cap rather than one checkpoint past it."""
        return 2.0 * getattr(self, "last_ckpt_seconds", 0.0) + getattr(self, "last_step_seconds", 0.0) + 5.0

    def maybe_cost_update(self) -> None:
        """Seed 000's cost update: elapsed hours and $ so far, every notifications.cost_update_hours."""
        every = self.cfg.notifications.cost_update_hours
        if every is None or not self.d.master:
            return
        hours = self.elapsed() / 3600
        if hours >= self.next_cost_update_h:
            self.notifier.cost_update(hours, self.cfg.limits.price_per_hour)
            self.next_cost_update_h = (math.floor(hours / every) + 1) * every

    # -- evaluation ----------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> float | None:
        batches = val_batches(self.val_split, self.cfg.training.val_batches, self.cfg.training.batch_size,
                              self.seq_for(self.step), self.d.rank, self.d.world)
        if not batches:
            return None
        self.model.eval()
        total = torch.zeros((), device=self.device)
        for b in batches:
            with self.autocast():
                total += self.model(self.to_device(b.x), self.to_device(b.y)).float()
        val = float(self.d.mean(total / len(batches)).item())
        row: dict[str, Any] = {"kind": "val", "step": self.step, "val_loss": val, "val_ppl": safe_exp(val),
                               "tokens": self.tokens_seen, "elapsed_s": self.elapsed()}
        if self.cfg.training.tcf and (self.d.master or self.fsdp):
            try:
                row.update(self.tcf_metrics(batches[0]))
            except Exception as e:  # noqa: BLE001 - geometry is diagnostic; never stop training for it
                log.warning("tcf metrics failed: %s", e)
        self.model.train()
        self.last_val_loss, self.last_val_step = val, self.step
        improved = self.best_val is None or val < self.best_val
        if improved:
            self.best_val, self.bad_vals = val, 0
        else:
            self.bad_vals += 1
        self.metrics.write(row)
        print0(f"step {self.step} val_loss {val:.4f} (best {self.best_val:.4f})")
        if self.d.master:
            self.notifier.validation_complete(self.step, val, self.best_val)
        return val

    def tcf_metrics(self, batch) -> dict[str, float]:
        x = self.to_device(batch.x[:1])
        with self.autocast(), self.eager():
            _, hidden = self.raw(x, return_hidden=True)  # type: ignore[misc]
        weights = {}
        if not self.fsdp:
            last = self.raw.blocks[-1]
            weights = {"w_last_attn_proj": last.attn.proj.weight, "w_last_mlp_fc": last.mlp.fc.weight}
        return self.tcf.compute([h.float() for h in hidden], weights)

    @torch.no_grad()
    def sample_prompts(self) -> None:
        prompts = self.cfg.training.eval_prompts
        if not prompts or not (self.d.master or self.fsdp):
            return
        tok = load_tokenizer(self.data_dir)
        gen = torch.Generator(device=self.device).manual_seed(self.step)  # private: training RNG untouched
        self.model.eval()
        rows = []
        for p in prompts:
            ids = tok.encode(p) or [tok.eot]
            idx = torch.tensor([ids], device=self.device)
            with self.autocast(), self.eager():
                out = self.raw.generate(idx, self.cfg.training.eval_max_new_tokens, generator=gen)
            rows.append({"step": self.step, "prompt": p, "text": tok.decode(out[0, len(ids):].tolist())})
        self.model.train()
        if self.d.master:
            with open(self.out_dir / "samples.jsonl", "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
            for r in rows:
                print0(f"sample @{self.step} {r['prompt']!r} -> {r['text'][:120]!r}")

    # -- the loop ------------------------------------------------------------------------------

    def on_signal(self, signum: int, _frame: Any) -> None:
        # Only a flag: the step in flight finishes, then an emergency checkpoint is written. A second
        # signal (Ctrl-C twice, or a peer rank died and we are stuck in a collective) exits at once.
        if self.stop_requested:
            os._exit(128 + signum)
        self.stop_requested = signum

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        t, cfg = self.cfg.training, self.cfg
        seq = self.seq_for(self.step)
        if seq != self.loader.seq_len:
            self.loader.set_seq_len(seq)
            print0(f"stage {self.stage_for(self.step)} from step {self.step}: seq_len {seq}")
            self.metrics.event("stage_transition", step=self.step, stage=self.stage_for(self.step), seq_len=seq)
            if self.d.master:
                self.notifier.stage_transition(self.stage_for(self.step), self.step, seq)
        f = lr_factor(self.step, t.warmup_steps, self.max_steps, t.min_lr / t.learning_rate)
        for g in self.optimizer.param_groups:
            g["lr"] = t.learning_rate * f * g["lr_scale"]
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(t.grad_accum_steps):
            batch = self.loader.next()
            x, y = self.to_device(batch.x), self.to_device(batch.y)
            last = micro == t.grad_accum_steps - 1
            sync: Any = contextlib.nullcontext()
            if isinstance(self.model, torch.nn.parallel.DistributedDataParallel) and not last:
                sync = self.model.no_sync()  # all-reduce once per step, not per micro-batch
            elif self.fsdp:
                self.raw.set_requires_gradient_sync(last)  # type: ignore[operator]
            with sync:
                with self.autocast():
                    loss = self.model(x, y)
                (loss / t.grad_accum_steps).backward()
            loss_sum += loss.detach()
            if t.high_loss_threshold is not None:
                self.pending_losses.append((self.step + 1, loss.detach(), batch.starts))
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.training.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        tokens = t.grad_accum_steps * t.batch_size * seq * self.d.world
        self.tokens_seen += tokens
        return loss_sum / t.grad_accum_steps, grad_norm, tokens

    def flush_high_losses(self) -> None:
        """Check the micro-batch losses since the last log in one device sync."""
        if not self.pending_losses:
            return
        values = torch.stack([v.float() for _, v, _ in self.pending_losses]).tolist()
        thr = self.cfg.training.high_loss_threshold
        rows = []
        for (step, _, starts), v in zip(self.pending_losses, values, strict=True):
            if thr is not None and v > thr:
                srcs = [f"{f}:{line}" for f, line in (self.train_split.source(int(s)) for s in starts)]
                rows.append({"step": step, "loss": v, "ppl": safe_exp(v), "rank": self.d.rank,
                             "sources": srcs, "time": time.time()})
        self.pending_losses.clear()
        if rows:
            # Every rank appends its own lines (each line is one small write, so lines never interleave).
            with open(self.out_dir / "high_loss.jsonl", "a") as fh:
                for r in rows:
                    fh.write(json.dumps(r) + "\n")

    def log_row(self, loss: torch.Tensor, grad_norm: torch.Tensor, tokens: int, dt: float) -> None:
        loss_v = float(self.d.mean(loss.detach().clone()).item())
        gn = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        self.last_train_loss = loss_v
        tok_s = tokens / dt if dt > 0 else 0.0
        ppl = safe_exp(loss_v)
        lrs = {g.get("name"): g["lr"] for g in self.optimizer.param_groups}
        row = {
            "kind": "train", "step": self.step, "loss": loss_v, "ppl": ppl, "lr": lrs.get("matrix"),
            "embedding_lr": lrs.get("embedding"), "grad_norm": float(gn.item()), "tok_per_s": tok_s,
            "mfu": mfu(tok_s, self.raw.flops_per_token(self.loader.seq_len), self.peak, self.d.world),
            "mem_gib": memory_gib(self.device), "elapsed_s": self.elapsed(), "cost_usd": self.cost(),
            "tokens": self.tokens_seen, "stage": self.stage_for(self.step - 1), "seq_len": self.loader.seq_len,
        }
        self.metrics.write(row)
        print0(f"step {self.step}/{self.max_steps} loss {loss_v:.4f} lr {row['lr']:.2e} "
               f"gnorm {row['grad_norm']:.2f} {tok_s:,.0f} tok/s"
               + (f" mfu {row['mfu'] * 100:.1f}%" if row["mfu"] is not None else ""))
        mean = self.spikes.update(ppl)
        if mean is not None:
            self.metrics.event("ppl_spike", step=self.step, ppl=ppl, rolling_mean_ppl=mean)
            if self.d.master:
                self.notifier.ppl_spike(self.step, ppl, mean)
        self.flush_high_losses()

    def stop_reason(self) -> str | None:
        lim = self.cfg.limits
        reserve = self.reserve_s()
        ahead = self.elapsed() + reserve
        price = lim.price_per_hour
        flags = self.d.max_flags([
            float(self.stop_requested),
            float(lim.max_hours is not None and ahead >= lim.max_hours * 3600),
            float(lim.max_cost_usd is not None and price is not None and ahead / 3600 * price >= lim.max_cost_usd),
        ])
        if flags[0]:
            self.stop_requested = self.stop_requested or int(flags[0])
            return "signal"
        if self.step >= self.max_steps:
            return "max_steps"
        if flags[1]:
            return "max_hours"
        if flags[2]:
            return "max_cost"
        p = self.cfg.training.val_patience
        if p and self.bad_vals >= p:
            return "early_stop"
        return None

    def run(self) -> str:
        t, d = self.cfg.training, self.d
        # This process's share of elapsed() (and so of the caps and cost_usd) includes its own startup.
        self.t_start = self.started_at or time.time()
        self.resume(t.resume)
        print0(f"model {self.raw.num_params() / 1e6:.2f}M params (excl. positions), "
               f"{'FSDP' if self.fsdp else 'DDP' if d.world > 1 else 'single'} x{d.world} on {self.device}, "
               f"seq {self.seq1}" + (f"/{self.seq2}" if self.seq2 != self.seq1 else "")
               + f", {self.max_steps} steps, out_dir {self.out_dir}")
        self.metrics.event("started", step=self.step, world_size=d.world, device=str(self.device),
                           params=self.raw.num_params(), trainer_version=__version__, pid=os.getpid())
        if d.master:
            write_status(self.out_dir, state="running", step=self.step, pid=os.getpid())
        kill_at = int(os.environ.get(FAULT_KILL_ENV, "0") or 0)
        raise_at = int(os.environ.get(FAULT_RAISE_ENV, "0") or 0)
        every = self.cfg.notifications.cost_update_hours
        if every is not None:  # a resumed run does not repeat the update it already sent
            self.next_cost_update_h = (math.floor(self.elapsed() / 3600 / every) + 1) * every
        hang_at = int(os.environ.get(FAULT_HANG_ENV, "0") or 0)
        self.model.train()
        t_log, tokens_since = time.perf_counter(), 0
        reason = self.stop_reason()
        while reason is None:
            t_step = time.perf_counter()
            loss, grad_norm, tokens = self.train_step()
            self.last_step_seconds = time.perf_counter() - t_step
            tokens_since += tokens
            if self.step % t.log_interval == 0 or self.step >= self.max_steps:
                now = time.perf_counter()
                self.log_row(loss, grad_norm, tokens_since, now - t_log)
                t_log, tokens_since = now, 0
            if self.step % t.val_interval == 0 or self.step % t.checkpoint_interval == 0:
                self.validate()
            if self.step % t.checkpoint_interval == 0:
                self.save("regular")
                self.sample_prompts()
            if kill_at and self.step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if raise_at and self.step == raise_at:
                raise RuntimeError(f"fault injected by {FAULT_RAISE_ENV} at step {self.step}")
            self.maybe_cost_update()
            if hang_at and self.step == hang_at:
                while True:  # a wedged collective or dataloader, as the watchdog sees it
                    time.sleep(3600)
            reason = self.stop_reason()
        if reason == "early_stop":
            self.metrics.event("early_stop", step=self.step, best_val_loss=self.best_val)
        if self.last_ckpt_step != self.step:
            if reason != "signal" and self.last_val_step not in (-1, self.step):
                self.validate()  # the final checkpoint carries its own val loss
            self.save("emergency" if reason == "signal" else "final")
        if d.master:
            self.metrics.event("finished", reason=reason, step=self.step, train_loss=self.last_train_loss,
                               val_loss=self.last_val_loss, best_val_loss=self.best_val,
                               elapsed_s=self.elapsed(), cost_usd=self.cost())
            write_status(self.out_dir, state="finished", reason=reason, step=self.step)
            final = self.last_val_loss if self.last_val_loss is not None else self.last_train_loss
            self.notifier.training_complete(self.step, safe_exp(final) if final is not None else None,
                                            self.elapsed() / 3600, reason, self.cost())
        print0(f"finished: {reason} at step {self.step}")
        return reason

    def close(self) -> None:
        self.flush_high_losses()
        self.metrics.close()
        if self.notifier.enabled:
            self.notifier.close(wait_s=min(5.0, self.cfg.notifications.telegram.timeout_s))
            n = self.notifier
            print0(f"telegram: {n.sent} sent, {n.failed} failed, {n.dropped} dropped"
                   + (f", {n.pending} abandoned at exit" if n.pending else ""))


# ---------------------------------------------------------------------------------------------
# Entry


def parse_argv(argv: list[str]) -> tuple[str | None, list[str]]:
    config_path: str | None = None
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(__doc__)
            raise SystemExit(0)
        if a == "--config" or a == "--resume":
            if i + 1 >= len(argv):
                raise ConfigError(f"{a} needs a value")
            val = argv[i + 1]
            i += 2
        elif a.startswith("--config=") or a.startswith("--resume="):
            a, _, val = a.partition("=")
            i += 1
        elif a.startswith("--"):
            overrides.append(a)
            i += 1
            continue
        else:
            raise ConfigError(f"unexpected argument '{a}' (use --config FILE and --section.key=value)")
        if a == "--config":
            config_path = val
        else:
            overrides.append(f"--training.resume={val}")
    return config_path, overrides


def process_started_at() -> float | None:
    """When this process started (epoch s), from /proc; None where there is no /proc."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def main(argv: list[str] | None = None) -> int:
    # The hour and dollar caps count from the process's start: the pod bills while the trainer imports
    # torch, prepares data and builds the model. Called in-process (argv given), the run starts now.
    started_at = (process_started_at() if argv is None else None) or time.time()
    argv = sys.argv[1:] if argv is None else argv
    trainer: Trainer | None = None
    try:
        config_path, overrides = parse_argv(argv)
        cfg = load_config(config_path, overrides)
        d = setup_dist(cfg)
        out_dir = Path(cfg.training.out_dir)
        if d.master:
            out_dir.mkdir(parents=True, exist_ok=True)
        d.barrier()
        setup_logging(out_dir, d.master)
        trainer = Trainer(cfg, d, started_at=started_at)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, trainer.on_signal)
    signal.signal(signal.SIGINT, trainer.on_signal)
    try:
        reason = trainer.run()
    except ConfigError as e:  # e.g. --resume DIR that does not verify
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        log.exception("training failed at step %s", trainer.step)
        if trainer.d.master:
            trainer.metrics.event("error", step=trainer.step, error=f"{type(e).__name__}: {e}"[:500])
            write_status(trainer.out_dir, state="failed", step=trainer.step, error=type(e).__name__)
            trainer.notifier.error_occurred(f"{type(e).__name__}: {e}", trainer.step,
                                            read_log_tail(trainer.out_dir / "train.log"))
        return 1
    finally:
        trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    if reason == "signal":
        return 128 + (trainer.stop_requested or signal.SIGTERM)
    return 0


if __name__ == "__main__":
    sys.exit(main())
