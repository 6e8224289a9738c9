"""Train a GPT: one process or many, on GPUs or CPU, resumable at any step.

    torchrun --standalone --nproc_per_node=8 -m trainer.train --config run.yaml --resume auto
    python -m trainer.train --config run.yaml --training.max_steps=20 --hardware.device=cpu

Any config key can be overridden as ``--section.key=value`` (YAML scalars); ``--resume X`` is
``--training.resume=X``. A bad key or value is a one-line error with exit status 2.

Outputs, all under ``training.out_dir``: metrics.jsonl, train.log, high_loss.jsonl, samples.jsonl,
tb/, status.json and checkpoints/step_NNNNNN/{model.pt, optim_rank*.pt, meta.json}. The run ends
with a final checkpoint and a ``{"kind": "event", "event": "finished", "reason": ...}`` row;
reasons: max_steps, max_hours, max_cost (limits.budget_usd), early_stop, signal, disk_full. Exit status 0, or
143/130 after SIGTERM/SIGINT (after the emergency checkpoint is on disk).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainer import __version__
from trainer.data.loader import BatchLoader, TokenSplit, load_tokenizer, prepare, val_batches
from trainer.data.pipeline import PrepareOptions
from trainer.loop.checkpointer import Checkpointer
from trainer.loop.dist import Dist, build_model, start_process
from trainer.loop.entry import parse_argv, work_started_at
from trainer.loop.limits import RunClock
from trainer.loop.nodes import multi_node, share_files
from trainer.loop.optim import build_optimizer, set_schedule
from trainer.model.memory import MemoryState
from trainer.spec.config import DEMO_MAX_BYTES, Config, ConfigError
from trainer.spec.load import load_config
from trainer.spec.resolve import ModelShape, model_spec
from trainer.watch.components import (
    ModelWatch,
    make_alerts,
    make_cost_updates,
    make_fault_hook,
    make_high_loss_log,
)
from trainer.watch.metrics import (
    MetricsLogger,
    SpikeDetector,
    append_samples,
    memory_gib,
    mfu,
    peak_flops,
    safe_exp,
    write_status,
)
from trainer.watch.notify import read_log_tail
from trainer.watch.tcf import TCFTracker, last_block_weights
from trainer.watch.trackers import open_tracker

log = logging.getLogger("trainer")
print0 = log.info  # rank 0 logs at INFO; the other ranks only warnings and errors


class Trainer:
    """One run. Everything is built here, once: data, model on its ranks, optimizer, the loop state
    (all of it in each checkpoint), and the components around the loop, real or null."""

    def __init__(self, cfg: Config, d: Dist, started_at: float | None = None) -> None:
        self.cfg, self.d = cfg, d
        t = cfg.training
        self.out_dir = Path(t.out_dir)
        self.max_steps = cfg.resolved_max_steps()
        self.device = d.device
        self.cuda = d.device.type == "cuda"
        self.amp = self.cuda and cfg.hardware.mixed_precision

        # Data first: the model's vocabulary comes from it.
        self.data_dir = Path(cfg.data.dir) if cfg.data.dir else self.out_dir / "data"
        if d.master and not (self.data_dir / "meta.json").exists():
            dc = cfg.data
            max_bytes = dc.max_bytes if dc.max_bytes is not None or dc.inputs else DEMO_MAX_BYTES
            prepare(dc.inputs, self.data_dir, dc.tokenizer, dc.bpe_vocab_size, dc.val_split, max_bytes,
                    log=print0, options=PrepareOptions(
                        tokenizer_file=dc.tokenizer_file, text_field=dc.text_field, include=tuple(dc.include),
                        exclude=tuple(dc.exclude), shard_tokens=dc.shard_tokens, min_val_tokens=dc.min_val_tokens,
                        workers=dc.workers, progress_file=dc.progress_file))
        d.barrier()
        if multi_node():  # prepared once, on node 0; the other nodes get its files over the group
            share_files(self.data_dir, d.rank, d.ctrl)
        self.train_split = TokenSplit(self.data_dir, "train")
        self.val_split = TokenSplit(self.data_dir, "val")
        self.shape: ModelShape = model_spec(cfg.model, data_vocab_size=self.train_split.meta["vocab_size"])
        self.seq1 = t.seq_len or self.shape.max_seq_len
        self.seq2 = t.stage2_seq_len or self.seq1
        for name, v in (("training.seq_len", self.seq1), ("training.stage2_seq_len", self.seq2)):
            if v > self.shape.max_seq_len:
                raise ConfigError(f"{name}={v} exceeds model max_seq_len {self.shape.max_seq_len}")
        # With memory, TNT's two stages are two chunk sizes (the memory's update granularity) at the
        # same sequence length (the Atlas 1B build plan §6.2); the Atlas 1B build plan's stage-1 chunk is the default.
        if not self.shape.memory and (t.stage1_chunk_size or t.stage2_chunk_size):
            raise ConfigError("training.stage1_chunk_size/stage2_chunk_size set the memory's chunk size: "
                              "they need a model with memory (model.memory: true, or model.d_key ...)")
        self.chunk1 = t.stage1_chunk_size or 2048
        self.chunk2 = t.stage2_chunk_size or self.chunk1
        self.loader = BatchLoader(self.train_split, t.batch_size, self.seq_for(0), d.rank, d.world, t.seed)

        torch.manual_seed(t.seed)  # identical init on every rank
        self.raw, self.model, self.fsdp = build_model(cfg, d, self.shape, self.amp)
        self.raw.set_memory_options(self.chunk_for(0), t.memory.max_norm)
        self.raw.set_refinement(t.refinement.supervision_weight_base, t.refinement.improvement_reward_scale)
        self.mem_chunk = self.chunk_for(0)
        self.mem_states: list[MemoryState] = []  # carried between micro-batches with training.memory.carry
        self.optimizer = build_optimizer(self.model, cfg, fused=self.cuda, rank=d.rank, world=d.world,
                                         sharded=self.fsdp)
        torch.manual_seed(t.seed + 1000 * d.rank)  # dropout differs across ranks, reproducibly

        # Loop state (all of it is in the checkpoint).
        self.step = 0
        self.tokens_seen = 0
        self.best_val: float | None = None
        self.bad_vals = 0
        self.last_train_loss: float | None = None
        self.last_val_loss: float | None = None
        self.last_ckpt_step = -1
        self.last_ckpt_time, self.ckpt_due = time.monotonic(), False  # checkpoint_every_s; agreed in stop_reason
        self.last_val_step = -1

        # fp32 weights + AdamW's two moments: what a checkpoint writes (gpucli.plan.disk says the same)
        self.clock = RunClock(cfg.limits, started_at, checkpoint_bytes=12 * self.raw.num_params(),
                              val_batches=t.val_batches)
        self.metrics = MetricsLogger(self.out_dir, enabled=d.master)

        self.metrics.tracker = open_tracker(cfg, d.master, self.out_dir, print0)
        self.alerts = make_alerts(cfg, d.master)
        self.checkpoints = Checkpointer(self.out_dir / "checkpoints", d, self.raw, self.optimizer, self.fsdp, print0,
                                        keep_last=t.keep_last, metrics=self.metrics, alerts=self.alerts)
        self.cost_updates = make_cost_updates(cfg, self.alerts)
        self.high_losses = make_high_loss_log(cfg, self.train_split, d.rank, self.out_dir)
        self.faults = make_fault_hook(cfg.faults)
        self.spikes = SpikeDetector(factor=t.spike_factor)
        self.tcf = TCFTracker()
        self.watch = ModelWatch(cfg, self.shape.memory, bool(self.shape.refine_steps), self.metrics, self.alerts,
                                d.master, print0)
        self.objective_t = torch.zeros(())  # the refinement objective of the last step
        self.peak = peak_flops(torch.cuda.get_device_name(d.device) if self.cuda else None)
        self.stop_requested = 0  # signal number

    # -- small helpers ---------------------------------------------------------------------------

    def stage_for(self, step: int) -> int:
        s1 = self.cfg.training.stage1_steps
        return 2 if s1 is not None and step >= s1 else 1

    def seq_for(self, step: int) -> int:
        return self.seq2 if self.stage_for(step) == 2 else self.seq1

    def chunk_for(self, step: int) -> int:
        return self.chunk2 if self.stage_for(step) == 2 else self.chunk1

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()

    def eager(self):
        """Run compiled blocks eagerly: generation grows the sequence one token at a time, which
        would otherwise recompile the blocks for each new length."""
        stance = getattr(torch.compiler, "set_stance", None)
        if stance is None or not (self.cfg.hardware.compile != "off" and self.cuda):
            return contextlib.nullcontext()
        return stance("force_eager")

    def to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t.pin_memory().to(self.device, non_blocking=True) if self.cuda else t

    # -- checkpoints -----------------------------------------------------------------------------

    def save(self, kind: str) -> Path | None:
        t0 = time.perf_counter()
        meta = {
            "kind": kind, "train_loss": self.last_train_loss, "val_loss": self.last_val_loss,
            "best_val_loss": self.best_val, "bad_vals": self.bad_vals, "tokens_seen": self.tokens_seen,
            "elapsed_s": self.clock.elapsed(), "cost_usd": self.clock.cost(), "data_state": self.loader.state_dict(),
            "stage": self.stage_for(self.step), "model_shape": self.shape.__dict__,
            "config": self.cfg.to_dict(), "trainer_version": __version__, "time": time.time(),
            "tokenizer": self.train_split.meta["tokenizer"], "model_watch": self.watch.state_dict(),
        }
        if self.shape.memory:
            meta["memory_chunk"] = self.mem_chunk
        self.checkpoints.memory_states = self.mem_states
        extra = {"data_meta.json": self.data_dir / "meta.json"}
        if (self.data_dir / "tokenizer.json").exists():
            extra["tokenizer.json"] = self.data_dir / "tokenizer.json"
        if kind == "best":  # the weights alone, at each improvement (Checkpointer.save_best)
            return self.checkpoints.save_best(self.step, meta, extra)
        path = self.checkpoints.save(self.step, meta, extra, kind)  # None: no room on disk (logged, alerted)
        self.last_ckpt_step = self.step
        self.last_ckpt_time = time.monotonic()
        self.clock.timings.checkpoint(time.perf_counter() - t0)
        if path is None:
            return None
        loss = self.last_train_loss
        self.alerts.checkpoint_saved(self.step, loss, safe_exp(loss) if loss is not None else None, kind)
        return path

    def resume(self, target: str) -> None:
        path = self.checkpoints.choose(target)
        if path is None:
            return
        meta = self.checkpoints.load(path)
        self.step = int(meta["step"])
        self.tokens_seen = int(meta.get("tokens_seen", 0))
        self.best_val = meta.get("best_val_loss")
        self.bad_vals = int(meta.get("bad_vals", 0))
        self.clock.elapsed_before = float(meta.get("elapsed_s", 0.0))
        self.last_train_loss, self.last_val_loss = meta.get("train_loss"), meta.get("val_loss")
        self.loader.load_state_dict(meta["data_state"])
        self.watch.load_state_dict(meta.get("model_watch"))
        self.mem_states = self.checkpoints.memory_states
        if self.mem_states and self.mem_states[0].M.shape[0] != self.cfg.training.batch_size:
            print0("resume: the saved memory states are for another batch size; memory restarts from zero")
            self.mem_states = []
        self.mem_chunk = self.chunk_for(self.step)
        self.raw.set_memory_options(self.mem_chunk, self.cfg.training.memory.max_norm)
        self.last_ckpt_step = self.step
        print0(f"resumed from {path.name} at step {self.step}")
        self.metrics.event("resumed", step=self.step, path=str(path))

    # -- evaluation ------------------------------------------------------------------------------

    @torch.no_grad()
    def validate(self) -> float | None:
        t0 = time.perf_counter()
        t = self.cfg.training
        batches = val_batches(self.val_split, t.val_batches, t.batch_size, self.seq_for(self.step),
                              self.d.rank, self.d.world)
        if not batches:
            return None
        self.model.eval()
        total = torch.zeros((), device=self.device)
        self.watch.begin()
        for b in batches:
            with self.autocast():
                total += self.model(self.to_device(b.x), self.to_device(b.y)).float()
            self.watch.after_batch(self.raw)
        val = float(self.d.mean(total / len(batches)).item())
        row: dict[str, Any] = {"kind": "val", "step": self.step, "val_loss": val, "val_ppl": safe_exp(val),
                               "tokens": self.tokens_seen, "elapsed_s": self.clock.elapsed()}
        row.update(self.watch.finish(self.step, self.d.mean))
        if t.tcf and (self.d.master or self.fsdp):
            try:
                row.update(self.tcf_metrics(batches[0]))
            except Exception as e:  # noqa: BLE001 - geometry is diagnostic; never stop training for it
                log.warning("tcf metrics failed: %s", e)
        self.model.train()
        self.last_val_loss, self.last_val_step = val, self.step
        if self.best_val is None or val < self.best_val:
            self.best_val, self.bad_vals = val, 0
            self.save("best")
        else:
            self.bad_vals += 1
        self.metrics.write(row)
        print0(f"step {self.step} val_loss {val:.4f} (best {self.best_val:.4f})")
        self.alerts.validation_complete(self.step, val, self.best_val)
        self.clock.timings.validation(time.perf_counter() - t0)
        return val

    def tcf_metrics(self, batch) -> dict[str, float]:
        x = self.to_device(batch.x[:1])
        with self.autocast(), self.eager():
            _, hidden = self.raw(x, return_hidden=True)  # type: ignore[misc]
        return self.tcf.compute([h.float() for h in hidden], {} if self.fsdp else last_block_weights(self.raw))

    @torch.no_grad()
    def sample_prompts(self) -> None:
        prompts = self.cfg.training.eval_prompts
        if not prompts or not (self.d.master or self.fsdp):
            return
        t0 = time.perf_counter()
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
            append_samples(self.out_dir, rows, print0)
        self.clock.timings.sampling(time.perf_counter() - t0)

    # -- the loop --------------------------------------------------------------------------------

    def on_signal(self, signum: int, _frame: Any) -> None:
        # Only a flag: the step in flight finishes, then an emergency checkpoint is written. A second
        # signal (Ctrl-C twice, or a peer rank died and we are stuck in a collective) exits at once.
        if self.stop_requested:
            os._exit(128 + signum)
        self.stop_requested = signum

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        t = self.cfg.training
        seq = self.seq_for(self.step)
        chunk = self.chunk_for(self.step)
        if self.shape.memory and chunk != self.mem_chunk:
            self.mem_chunk = chunk
            self.raw.set_memory_options(chunk, t.memory.max_norm)
            if seq == self.loader.seq_len:  # TNT's stage 2: same sequences, smaller memory chunks
                stage = self.stage_for(self.step)
                print0(f"stage {stage} from step {self.step}: memory chunk size {chunk}")
                self.metrics.event("stage_transition", step=self.step, stage=stage, seq_len=seq, chunk_size=chunk)
                self.alerts.stage_transition(stage, self.step, seq, chunk)
        if seq != self.loader.seq_len:
            self.loader.set_seq_len(seq)
            stage = self.stage_for(self.step)
            print0(f"stage {stage} from step {self.step}: seq_len {seq}")
            self.metrics.event("stage_transition", step=self.step, stage=stage, seq_len=seq)
            self.alerts.stage_transition(stage, self.step, seq)
        set_schedule(self.optimizer, t, self.step, self.max_steps)  # LR and Muon's momentum
        loss_sum = torch.zeros((), device=self.device)
        objective = torch.zeros((), device=self.device)
        carry = self.shape.memory and t.memory.carry
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
                    loss = self.model(x, y, memory_states=self.mem_states or None) if carry else self.model(x, y)
                (loss / t.grad_accum_steps).backward()
            if self.shape.memory:
                self.mem_states = list(self.raw.memory_out)  # detached: what a checkpoint saves (and carry reuses)
            # With refinement the reported loss is the last step's cross-entropy (what generation uses);
            # the objective it was trained on is logged beside it.
            ce = self.raw.refine_losses[-1] if self.shape.refine_steps and self.raw.refine_losses is not None \
                else loss.detach()
            loss_sum += ce
            objective += loss.detach()
            self.high_losses.add(self.step + 1, ce, batch.starts)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        tokens = t.grad_accum_steps * t.batch_size * seq * self.d.world
        self.tokens_seen += tokens
        self.objective_t = objective / t.grad_accum_steps
        return loss_sum / t.grad_accum_steps, grad_norm, tokens

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
            "dt_ms": dt * 1000, "mfu": mfu(tok_s, self.raw.flops_per_token(self.loader.seq_len), self.peak, self.d.world),
            "mem_gib": memory_gib(self.device), "elapsed_s": self.clock.elapsed(), "cost_usd": self.clock.cost(),
            "tokens": self.tokens_seen, "stage": self.stage_for(self.step - 1), "seq_len": self.loader.seq_len,
        }
        if self.shape.memory:
            row["chunk_size"] = self.mem_chunk
        if self.shape.refine_steps:
            row["objective"] = float(self.d.mean(self.objective_t.detach().clone()).item())
        self.metrics.write(row)
        print0(f"step {self.step}/{self.max_steps} loss {loss_v:.4f} lr {row['lr']:.2e} "
               f"gnorm {row['grad_norm']:.2f} {tok_s:,.0f} tok/s"
               + (f" mfu {row['mfu'] * 100:.1f}%" if row["mfu"] is not None else ""))
        mean = self.spikes.update(ppl)
        if mean is not None:
            self.metrics.event("ppl_spike", step=self.step, ppl=ppl, rolling_mean_ppl=mean)
            self.alerts.ppl_spike(self.step, ppl, mean)
        self.high_losses.flush()

    def stop_reason(self) -> str | None:
        over_hours, over_budget = self.clock.caps_ahead()
        every = self.cfg.training.checkpoint_every_s
        due = every is not None and time.monotonic() - self.last_ckpt_time >= every
        flags = self.d.max_flags([float(self.stop_requested), float(over_hours), float(over_budget), float(due)])
        self.ckpt_due = bool(flags[3])  # one collective: every rank saves on the same step
        if flags[0]:  # every rank stops on the same step
            self.stop_requested = self.stop_requested or int(flags[0])
            return "signal"
        if self.step >= self.max_steps:
            return "max_steps"
        if flags[1]:
            return "max_hours"
        if flags[2]:
            return "max_cost"
        if self.checkpoints.refused >= 2:  # another hour of training could not be saved either
            return "disk_full"
        p = self.cfg.training.val_patience
        if p and self.bad_vals >= p:
            return "early_stop"
        return None

    def run(self) -> str:
        t, d = self.cfg.training, self.d
        self.clock.start()
        self.resume(t.resume)
        count = self.shape.param_count()
        print0(f"model {count.total / 1e6:.2f}M params ({count.flop_params / 1e6:.2f}M in matmuls), "
               f"{t.optimizer}, "
               f"{'FSDP' if self.fsdp else 'DDP' if d.world > 1 else 'single'} x{d.world} on {self.device}, "
               f"seq {self.seq1}" + (f"/{self.seq2}" if self.seq2 != self.seq1 else "")
               + f", {self.max_steps} steps, out_dir {self.out_dir}")
        self.metrics.event("started", step=self.step, world_size=d.world, device=str(self.device),
                           params=count.total, trainer_version=__version__, pid=os.getpid())
        if d.master:
            write_status(self.out_dir, state="running", step=self.step, pid=os.getpid())
        self.cost_updates.start(self.clock.elapsed())
        self.model.train()
        t_log, tokens_since = time.perf_counter(), 0
        reason = self.stop_reason()
        while reason is None:
            t_step = time.perf_counter()
            loss, grad_norm, tokens = self.train_step()
            self.clock.timings.step(time.perf_counter() - t_step)
            tokens_since += tokens
            if self.step % t.log_interval == 0 or self.step >= self.max_steps:
                now = time.perf_counter()
                self.log_row(loss, grad_norm, tokens_since, now - t_log)
                t_log, tokens_since = now, 0
            checkpoint = self.step % t.checkpoint_interval == 0 or self.ckpt_due
            if self.step % t.val_interval == 0 or checkpoint:
                self.validate()
            if checkpoint:
                self.save("regular")
                self.sample_prompts()
            self.faults.after_step(self.step)
            self.cost_updates.tick(self.clock.elapsed())
            reason = self.stop_reason()
        self.finish(reason)
        return reason

    def finish(self, reason: str) -> None:
        if reason == "early_stop":
            self.metrics.event("early_stop", step=self.step, best_val_loss=self.best_val)
        if self.last_ckpt_step != self.step:
            if reason != "signal" and self.last_val_step not in (-1, self.step):
                self.validate()  # the final checkpoint carries its own val loss
            self.save("emergency" if reason == "signal" else "final")
        elapsed, cost = self.clock.elapsed(), self.clock.cost()
        self.metrics.event("finished", reason=reason, step=self.step, train_loss=self.last_train_loss,
                           val_loss=self.last_val_loss, best_val_loss=self.best_val, elapsed_s=elapsed,
                           cost_usd=cost)
        if self.d.master:
            write_status(self.out_dir, state="finished", reason=reason, step=self.step)
        final = self.last_val_loss if self.last_val_loss is not None else self.last_train_loss
        self.alerts.training_complete(self.step, safe_exp(final) if final is not None else None,
                                      elapsed / 3600, reason, cost)
        print0(f"finished: {reason} at step {self.step}")

    def failed(self, e: Exception) -> None:
        """The error row, status and alert for an exception out of run()."""
        log.exception("training failed at step %s", self.step)
        self.metrics.event("error", step=self.step, error=f"{type(e).__name__}: {e}"[:500])
        if self.d.master:
            write_status(self.out_dir, state="failed", step=self.step, error=type(e).__name__)
            self.alerts.error_occurred(f"{type(e).__name__}: {e}", self.step, read_log_tail(self.out_dir / "train.log"))

    def close(self) -> None:
        self.high_losses.flush()
        self.metrics.close()
        self.alerts.close(wait_s=min(5.0, self.cfg.notifications.telegram.timeout_s))
        summary = self.alerts.summary()
        if summary:
            print0(summary)


def main(argv: list[str] | None = None) -> int:
    # The hour and dollar caps count from the process's start: the pod bills while the trainer imports
    # torch, prepares data and builds the model. Called in-process (argv given), the run starts now.
    started_at = (work_started_at() if argv is None else None) or time.time()
    argv = sys.argv[1:] if argv is None else argv
    try:
        config_path, overrides = parse_argv(argv, usage=__doc__ or "")
        cfg = load_config(config_path, overrides)
        d = start_process(cfg)
        trainer = Trainer(cfg, d, started_at=started_at)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, trainer.on_signal)
    signal.signal(signal.SIGINT, trainer.on_signal)
    try:
        reason = trainer.run()
        if dist.is_initialized():  # all ranks done before any tears the group down (gloo aborted under load)
            dist.barrier()
    except ConfigError as e:  # e.g. --resume DIR that does not verify
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        trainer.failed(e)
        return 1
    finally:
        trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 128 + (trainer.stop_requested or signal.SIGTERM) if reason == "signal" else 0


if __name__ == "__main__":
    sys.exit(main())
