"""Which tensors a checkpoint holds and how each rank writes and reads them, whether the model is
whole on every rank (one process, DDP) or sharded (FSDP2). The files themselves (atomic writes,
sha256, pruning, choosing one to resume) are :mod:`trainer.loop.checkpoint`'s.

A model with memory also has per-rank memory states (the Atlas 1B build plan §2.3): each layer's ``M`` and ``S``
[B, d_value, d_key] at the end of the rank's last micro-batch. They differ across ranks (each rank
reads its own sequences), so they go in the rank's own ``optim_rank*.pt`` next to its RNG state,
in fp32, and come back bit for bit."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.loop import checkpoint as ckpt
from trainer.loop import diskguard, sharded
from trainer.loop.dist import Dist, rng_state, set_rng_state
from trainer.model.gpt import GPT
from trainer.model.memory import MemoryState
from trainer.spec.config import ConfigError

if TYPE_CHECKING:
    from trainer.watch.components import Alerts
    from trainer.watch.metrics import MetricsLogger


class Checkpointer:
    """Writes, prunes and loads the run's checkpoints; before each write it makes room on disk
    (:mod:`trainer.loop.diskguard`) or, when there is none, writes nothing, says so and alerts."""

    def __init__(self, root: Path, d: Dist, raw: GPT, optimizer: torch.optim.Optimizer, fsdp: bool,
                 log: Callable[[str], None], *, keep_last: int, metrics: MetricsLogger, alerts: Alerts) -> None:
        self.root, self.d, self.raw, self.optimizer, self.fsdp, self.log = root, d, raw, optimizer, fsdp, log
        self.keep_last, self.metrics, self.alerts = keep_last, metrics, alerts
        self.refused = 0
        """Checkpoints refused in a row for lack of disk (the same on every rank); a saved one resets it."""
        self.staging = ckpt.HostStaging() if d.device.type == "cuda" else None
        self.memory_states: list[MemoryState] = []
        """Set by the loop before save; after load, the states the checkpoint held (empty if none)."""

    def model_state(self) -> dict | None:
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import (  # lazy: torch.distributed.checkpoint only for sharded (FSDP) runs
                StateDictOptions,
                get_model_state_dict,
            )

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
            # lazy: torch.distributed.checkpoint only for sharded (FSDP) runs
            from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

            opt: dict[str, Any] | None = get_optimizer_state_dict(self.raw, self.optimizer)
        else:
            opt = self.optimizer.state_dict() if self.d.master else None
        state: dict[str, Any] = {"optimizer": opt, "rng": rng_state(self.d.device)}
        if self.memory_states:
            state["memory"] = [{"M": s.M.detach().float().cpu().clone(), "S": s.S.detach().float().cpu().clone()}
                               for s in self.memory_states]
        return state

    def save(self, step: int, meta: dict[str, Any], extra_files: dict[str, Path], kind: str = "regular"
             ) -> Path | None:
        """Collective. The checkpoint written and the old ones pruned; None when the disk has no room
        for it even after dropping old optimizer files (nothing written, the newest checkpoint stays)."""
        d, t0 = self.d, time.perf_counter()
        if not self.make_room(step):
            return None
        if sharded.wanted():  # a run over several nodes: each rank writes its own part (trainer.loop.sharded)
            path = sharded.save(self, step, meta, extra_files, kind)
            if d.master:
                self.log(f"checkpoint {path.name} ({kind}, sharded) in {time.perf_counter() - t0:.1f}s")
                self.metrics.event("checkpoint", step=step, path=str(path), checkpoint_kind=kind,
                                   val_loss=meta.get("val_loss"))
            return path
        path = ckpt.save_checkpoint(
            self.root, step, rank=d.rank, world=d.world, model_state=self.model_state(),
            optim_state=self.optim_state(), meta=meta, extra_files=extra_files, barrier=d.barrier,
            gather=d.gather, staging=self.staging)
        if d.master:
            removed = ckpt.prune(self.root, self.keep_last)
            self.log(f"checkpoint {path.name} ({kind}) in {time.perf_counter() - t0:.1f}s"
                     + (f", pruned {', '.join(p.name for p in removed)}" if removed else ""))
            self.metrics.event("checkpoint", step=step, path=str(path), checkpoint_kind=kind,
                               val_loss=meta.get("val_loss"))
        return path

    def save_best(self, step: int, meta: dict[str, Any], extra_files: dict[str, Path]) -> Path | None:
        """Collective (an FSDP model is gathered). The weights alone into ``checkpoints/best``
        (:func:`trainer.loop.checkpoint.save_best`), replacing the previous best; a failed write
        (a full disk) is logged and training goes on."""
        state, t0 = self.model_state(), time.perf_counter()
        if not self.d.master or state is None:
            return None
        try:
            path = ckpt.save_best(self.root, state, dict(meta, step=step), extra_files)
        except OSError as e:
            self.log(f"best checkpoint at step {step} NOT written: {e}")
            return None
        self.log(f"best checkpoint (step {step}, val loss {meta.get('val_loss')}) in {time.perf_counter() - t0:.1f}s")
        self.metrics.event("best_checkpoint", step=step, path=str(path), val_loss=meta.get("val_loss"))
        return path

    def state_bytes(self) -> int:
        """What this checkpoint's tensors take in all the files together: the fp32 model state (twice
        where model.safetensors is written beside model.pt) and every optimizer moment (a DTensor counts its whole logical size: the ranks' shards add up to it)."""
        def nbytes(obj: Any) -> int:
            if isinstance(obj, torch.Tensor):
                return obj.numel() * obj.element_size()
            if isinstance(obj, dict):
                return sum(nbytes(v) for v in obj.values())
            if isinstance(obj, (list, tuple)):
                return sum(nbytes(v) for v in obj)
            return 0

        memory = sum(self.d.world * (s.M.numel() + s.S.numel()) * 4 for s in self.memory_states)
        weights = nbytes(self.raw.state_dict()) * (1 + ckpt.writes_safetensors())  # model.pt (+ model.safetensors)
        return weights + nbytes(self.optimizer.state_dict()) + memory

    def make_room(self, step: int) -> bool:
        """Whether the next checkpoint fits on disk (rank 0 decides, after dropping old optimizer files
        if it must; every rank gets the same answer). A refusal is logged, recorded and alerted."""
        ok = True
        if self.d.master:
            try:
                need, basis = diskguard.expected_bytes(self.root, self.state_bytes())
                room = diskguard.make_room(self.root, need, basis, log=self.log)
            except Exception as e:  # noqa: BLE001 - the other ranks wait for the answer: never leave them stuck
                self.log(f"disk: free space not checked ({type(e).__name__}: {e}); writing the checkpoint")
                room = diskguard.Room(True, 0, 0, "not checked")
            if room.dropped:
                self.metrics.event("optimizer_dropped", step=step, checkpoints=list(room.dropped),
                                   freed_bytes=room.freed)
            if not room.ok:
                newest = ckpt.list_checkpoints(self.root)
                keeps = f"{newest[0][1].name} stays the newest checkpoint" if newest else "no checkpoint yet"
                line = (f"disk full: checkpoint {ckpt.step_dir_name(step)} NOT written: it needs "
                        f"{room.need / 1e9:.2f} GB ({room.basis} + margin), {room.free / 1e9:.2f} GB free in "
                        f"{self.root} after dropping old optimizer files; {keeps}. Free space or lower "
                        f"training.keep_last; training goes on and stops if the next checkpoint cannot be "
                        f"written either")
                self.log(line)
                self.metrics.event("checkpoint_refused", step=step, need_bytes=room.need, free_bytes=room.free)
                self.alerts.error_occurred(line, step)
            ok = room.ok
        ok = bool(self.d.broadcast(ok))
        self.refused = 0 if ok else self.refused + 1
        return ok

    def choose(self, target: str) -> Path | None:
        """The checkpoint ``training.resume`` names, the same on every rank; None: start fresh."""
        if target == "none":
            return None
        if target == "auto":
            chosen = None
            if self.d.master:
                p = ckpt.find_resumable(self.root, self.d.world, log=self.log)
                chosen = str(p) if p else None
            chosen = self.d.broadcast(chosen)
            if chosen is None:
                self.log("resume auto: no usable checkpoint, starting fresh")
                return None
            return Path(chosen)
        if self.d.master:
            ok, reason = ckpt.verify(Path(target))
            if not ok:
                raise ConfigError(f"cannot resume from {target}: {reason}")
        return Path(target)

    def load(self, path: Path) -> dict[str, Any]:
        """Weights, optimizer moments and RNG state into place; returns the checkpoint's meta.json."""
        d, fsdp = self.d, self.fsdp
        if sharded.wanted() or sharded.is_sharded(path):
            return sharded.load(self, path)
        meta = ckpt.read_meta(path)
        assert meta is not None
        state = ckpt.load_model_state(path) if (d.master or not fsdp) else {}
        if fsdp:
            from torch.distributed.checkpoint.state_dict import (  # lazy: torch.distributed.checkpoint only for sharded (FSDP) runs
                StateDictOptions,
                set_model_state_dict,
            )

            set_model_state_dict(self.raw, state, options=StateDictOptions(full_state_dict=True,
                                                                           broadcast_from_rank0=True))
        else:
            self.raw.load_state_dict(state)
        opt = ckpt.load_optim_state(path, d.rank, trusted=fsdp) if meta.get("world_size") == d.world else None
        if opt is not None and not fsdp and opt.get("optimizer") is None:
            # DDP: the moments are in rank 0's file only (older checkpoints: in every rank's file).
            shared = ckpt.load_optim_state(path, 0)
            opt["optimizer"] = shared["optimizer"] if shared else None
        if opt is not None and opt.get("optimizer") is not None:
            if fsdp:
                # lazy: torch.distributed.checkpoint only for sharded (FSDP) runs
                from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

                set_optimizer_state_dict(self.raw, self.optimizer, opt["optimizer"])
            else:
                self.optimizer.load_state_dict(opt["optimizer"])
            set_rng_state(opt["rng"], d.device)
        elif meta.get("optimizer_dropped"):
            self.log(f"resume: {path.name} has its weights only (its optimizer files were dropped to free disk): "
                     "optimizer moments and RNG restart from zero")
        else:
            self.log("resume: optimizer state not restored (different world size); moments restart from zero")
        saved = (opt or {}).get("memory") or []
        self.memory_states = [MemoryState(s["M"].to(d.device), s["S"].to(d.device)) for s in saved]
        return meta
