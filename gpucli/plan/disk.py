"""Disk a run needs for its checkpoints, planned before renting (pure).

The trainer's checkpoint (trainer/loop/checkpoint.py) is the fp32 model state (4 bytes a parameter), twice:
model.pt and model.safetensors beside it (the train extra installs safetensors; a sharded multi-node
checkpoint has them only when consolidated, so counting both is the upper bound), plus the optimizer state: AdamW keeps two fp32 moments (8 bytes a parameter); Muon keeps one fp32 momentum for the
2-D hidden matrices (4 bytes) and AdamW's two for the rest. Under DDP the moments are written once, under
FSDP each rank writes its shard: either way the optimizer files add up to the same bytes. The trainer
keeps ``training.keep_last`` checkpoints plus the best by validation loss, and writes the next one before
it prunes, so ``keep_last + 2`` checkpoints can exist at once. A few MB of meta, RNG and data-loader state
per checkpoint are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.spec.modelspec import ModelSpec

GB = 1e9


@dataclass(frozen=True)
class CheckpointDisk:
    weights_gb: float  # the weight files together: model.pt (and model.safetensors, ``weight_copies`` 2)
    optimizer_gb: float  # all optim_rank*.pt together
    per_rank_optimizer_gb: float  # the largest single optimizer file (FSDP shards; DDP: rank 0 holds it all)
    at_once: int  # checkpoints on disk at the worst moment
    disk_gb: float  # at_once x (weights + optimizer)
    weight_copies: int = 2  # files holding the whole weights: model.pt + model.safetensors; own code: its one file

    @property
    def checkpoint_gb(self) -> float:
        return self.weights_gb + self.optimizer_gb


def checkpoint_disk(spec: ModelSpec, *, keep_last: int = 3, optimizer: str = "adamw", n_gpus: int = 1,
                    sharded: bool = False, weight_copies: int = 2) -> CheckpointDisk:
    """Bytes of one checkpoint of ``spec`` and the disk that ``keep_last`` of them need; the weights
    ``weight_copies`` times (the trainer's model.pt and model.safetensors)."""
    if keep_last < 1:
        raise ValueError("keep_last must be >= 1")
    if optimizer not in ("adamw", "muon"):
        raise ValueError(f"unknown optimizer {optimizer!r}")
    p = spec.param_count()
    weights = 4 * p.total * max(1, weight_copies)
    if optimizer == "muon":
        matrices = p.attention + p.mlp  # Muon's share: the blocks' 2-D weights
        moments = 4 * matrices + 8 * (p.total - matrices)
    else:
        moments = 8 * p.total
    ranks = max(1, n_gpus)
    per_rank = moments / ranks if sharded else moments
    at_once = keep_last + 2
    return CheckpointDisk(weights_gb=weights / GB, optimizer_gb=moments / GB, per_rank_optimizer_gb=per_rank / GB,
                          at_once=at_once, disk_gb=at_once * (weights + moments) / GB,
                          weight_copies=max(1, weight_copies))


HEADROOM_FIXED_GB = 1.0  # logs, metrics, TensorBoard events, the code, a pip cache
HEADROOM_SHARE = 0.05  # and a share of the rest: sizes here are estimates, files are a little larger


@dataclass(frozen=True)
class DiskNeed:
    """What a launch's disk must hold: the checkpoints the keep-policy has at once, the data (raw and
    prepared, when its size is known before the launch) and some headroom, against the disk there is."""

    checkpoints: CheckpointDisk
    keep_last: int
    data_gb: float | None  # None: not known before the launch (downloaded or already on the pod)
    have_gb: float | None  # the disk the run folder is on; None where it is not known before the launch
    where: str  # what ``have_gb`` is: "--disk 50 GB", "volume corpus (200 GB)", "free on /home", ...
    written: int | None = None  # checkpoints the run writes in all (by steps, by time, the final one)
    written_note: str = ""  # how that count came about

    @property
    def all_kept_gb(self) -> float | None:
        """Disk for keeping every checkpoint written (``training.keep_last`` = written)."""
        return None if self.written is None else self.written * self.checkpoints.checkpoint_gb

    @property
    def headroom_gb(self) -> float:
        return HEADROOM_FIXED_GB + HEADROOM_SHARE * (self.checkpoints.disk_gb + (self.data_gb or 0.0))

    @property
    def need_gb(self) -> float:
        return self.checkpoints.disk_gb + (self.data_gb or 0.0) + self.headroom_gb

    @property
    def fits(self) -> bool | None:
        return None if self.have_gb is None else self.need_gb <= self.have_gb

    def keep_last_that_fits(self) -> int | None:
        """The largest ``training.keep_last`` whose checkpoints fit in ``have_gb`` (None: not even 1)."""
        if self.have_gb is None:
            return None
        best = None
        for keep in range(1, self.keep_last):
            at_once = keep + 2
            ck = at_once * self.checkpoints.checkpoint_gb
            rest = self.data_gb or 0.0
            if ck + rest + HEADROOM_FIXED_GB + HEADROOM_SHARE * (ck + rest) <= self.have_gb:
                best = keep
        return best


def checkpoints_written(steps: int, interval_steps: int, hours: float | None, every_s: float | None) -> int:
    """Checkpoints a run writes: one each ``interval_steps``, one each ``every_s`` of its ``hours`` (an
    upper bound: a timed one can fall on a step's), and the final one."""
    by_steps = steps // interval_steps if interval_steps > 0 else 0
    by_time = int(hours * 3600 // every_s) if hours is not None and every_s else 0
    return by_steps + by_time + (0 if by_steps and steps % interval_steps == 0 else 1)


def disk_need(checkpoints: CheckpointDisk, *, keep_last: int, data_gb: float | None, have_gb: float | None,
              where: str, written: int | None = None, written_note: str = "") -> DiskNeed:
    for name, value in (("data_gb", data_gb), ("have_gb", have_gb)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return DiskNeed(checkpoints, keep_last, data_gb, have_gb, where, written, written_note)
