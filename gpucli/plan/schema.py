"""The catalogue's records: frozen dataclasses for GPUs, prices, profiles, phases and measured speeds.

``gpucli/plan/parse.py`` fills them from the YAML files and ``gpucli/plan/catalog.py`` loads and
caches the whole :class:`Catalog`. The model presets are not a catalogue file: they are the trainer's
own descriptions (``trainer/spec/presets.py``), so the model planned is the model trained.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpucli.errors import UnknownNameError, UsageError
from trainer.spec.modelspec import ModelSpec
from trainer.spec.presets import lookup

INTERCONNECTS = ("nvlink", "pcie")
_N_X_GPU = re.compile(r"(\d{1,4})\s*[xX]\s*([A-Za-z][\w .-]*)")
PRICE_KINDS = ("spot", "on-demand", "owned")

ModelShape = ModelSpec
"""The planner's name for the one model description (``trainer.spec.modelspec.ModelSpec``)."""


@dataclass(frozen=True)
class Defaults:
    """Modelling constants of the planner, each stated in gpus.yaml."""

    train_mfu: float
    train_mfu_source: str
    scaling_per_doubling: Mapping[str, float]
    train_state_bytes_per_param: float
    logits_bytes_per_token_vocab: float
    cuda_overhead_gb: float
    usable_vram_fraction: float
    max_micro_batch: int
    decode_bandwidth_efficiency: float
    decode_bytes_per_param: float
    decode_context_tokens: int
    decode_parallel_efficiency: float
    decode_io_overhead_fraction: float
    decode_load_minutes: float
    stale_after_days: int
    env_build_minutes: float = 5.0  # the trainer's pinned environment, built once on a pod's volume


@dataclass(frozen=True)
class Gpu:
    id: str
    name: str
    aliases: tuple[str, ...]
    vram_gb: float
    architecture: str
    bf16_dense_tflops: float
    memory_bandwidth_gbps: float
    interconnect: str
    source: str
    vast_names: tuple[str, ...] = ()
    runpod_ids: tuple[str, ...] = ()
    train_mfu: float | None = None
    compute_capability: str | None = None  # "9.0", "10.0": sm_90, sm_100
    min_cuda: str | None = None  # the oldest CUDA with kernels for it ("12.8" for Blackwell)


@dataclass(frozen=True)
class Price:
    gpu: str
    usd_per_hour: float
    per: str  # "gpu" or "node"
    count: int | None  # GPUs in the node when per == "node"
    kind: str  # spot | on-demand | owned
    as_of: dt.date | None
    as_of_text: str  # as written in the file ("2025-01"), or "undated"
    source: str
    usd_per_hour_high: float | None = None
    provider: str | None = None
    note: str | None = None

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.count if self.per == "node" and self.count else self.usd_per_hour

    def age_days(self, today: dt.date) -> int | None:
        return None if self.as_of is None else (today - self.as_of).days


@dataclass(frozen=True)
class SingleProfile:
    name: str
    gpu: str | None
    batch_size: int
    grad_accum: int
    bf16: bool
    compile: bool
    description: str

    @property
    def count(self) -> int:
        return 1


@dataclass(frozen=True)
class PhaseBatch:
    micro_batch: int
    grad_accum: int
    sec_per_step: tuple[float, float] | None


@dataclass(frozen=True)
class ClusterProfile:
    name: str
    gpu: str
    count: int
    description: str
    phases: Mapping[str, PhaseBatch]


@dataclass(frozen=True)
class Stages:
    """Two training stages (the Atlas 1B build plan's TNT): steps and the memory's chunk size in each. A model without
    memory runs both stages at the same settings (the chunk sizes are the memory's)."""

    stage1_steps: int
    stage2_steps: int
    stage1_chunk_size: int | None = None
    stage2_chunk_size: int | None = None

    @property
    def steps(self) -> int:
        return self.stage1_steps + self.stage2_steps

    def shares(self) -> tuple[tuple[float, int | None], ...]:
        """(share of the steps, chunk size) per stage."""
        return ((self.stage1_steps / self.steps, self.stage1_chunk_size),
                (self.stage2_steps / self.steps, self.stage2_chunk_size or self.stage1_chunk_size))


@dataclass(frozen=True)
class Phase:
    name: str
    description: str
    iterations: int
    matrix_lr: float
    embedding_lr: float
    batch_scale: float
    # the cloud training guide's refinement knobs (trainer/model/refine.py); a launch writes them for a model with refine_steps
    supervision_weight_base: float | None = None
    improvement_reward_scale: float | None = None
    stages: Stages | None = None  # two stages with their own steps and memory chunk sizes (the Atlas 1B build plan)


@dataclass(frozen=True)
class CalibrationEntry:
    """One measured speed. ``mfu`` for training entries, ``tokens_per_s`` always."""

    workload: str  # train | generate
    gpu: str
    gpu_count: int
    model: str
    tokens_per_s: float
    mfu: float | None
    seq_len: int | None
    micro_batch: int | None
    precision: str | None
    compile: bool | None
    peak_mem_gib: float | None
    date: str
    source: str
    trainer_version: str | None = None
    shape: ModelShape | None = None


@dataclass(frozen=True)
class Catalog:
    directory: Path
    defaults: Defaults
    gpus: Mapping[str, Gpu]
    prices: tuple[Price, ...]
    single_profiles: Mapping[str, SingleProfile]
    cluster_profiles: Mapping[str, ClusterProfile]
    phases: Mapping[str, Phase]
    models: Mapping[str, ModelShape]
    calibration: tuple[CalibrationEntry, ...]

    # -- lookups with helpful errors -------------------------------------------------------------
    def gpu(self, name: str) -> Gpu:
        key = name.strip().lower()
        if key in self.gpus:
            return self.gpus[key]
        for gpu in self.gpus.values():
            if key in gpu.aliases or key == gpu.name.lower() or key.replace(" ", "-") in gpu.aliases:
                return gpu
        names = list(self.gpus) + [a for g in self.gpus.values() for a in g.aliases]
        raise UnknownNameError("GPU", name, names)

    def model(self, name: str) -> ModelShape:
        spec = lookup(name)
        if spec is not None:
            return spec
        raise UnknownNameError("model", name, list(self.models) + ["dN (nanochat depth N)"])

    def profile(self, name: str) -> SingleProfile | ClusterProfile:
        """A named profile, or ``NxGPU`` for any catalogue GPU and count (``8xH100-PCIe``, ``4xRTX3090``)."""
        for table in (self.single_profiles, self.cluster_profiles):
            for key, value in table.items():
                if key.lower() == name.strip().lower():
                    return value
        m = _N_X_GPU.fullmatch(name.strip())
        if m:
            try:
                gpu = self.gpu(m.group(2))
            except UnknownNameError:
                gpu = self.gpu(m.group(2).replace("-", "").replace(" ", ""))
            return self.cluster_for(gpu, int(m.group(1)), name.strip())
        raise UnknownNameError("profile", name, list(self.single_profiles) + list(self.cluster_profiles)
                               + ["NxGPU (e.g. 8xH100-PCIe, 4xRTX3090)"])

    def cluster_for(self, gpu: Gpu, count: int, name: str | None = None) -> ClusterProfile:
        """``count`` x ``gpu`` as the named cluster profiles are made (the cloud training guide): every GPU count keeps the
        same sequences per optimizer step for a phase (its 8x and 4x profiles of one GPU agree: 8xH100 and
        4xH100 512 fast, 256 extreme; A100 448 and 224), split over the GPUs, with the micro-batch of the
        named profile of this GPU (else 8xH100's), never more than a GPU's share; grad accumulation makes
        up the rest. The launch
        still lowers the micro-batch to what fits in memory, keeping the batch (keep_global_batch)."""
        if not 1 <= count <= 1024:
            raise UsageError(f"profile {name or count}: the GPU count must be between 1 and 1024")
        for cp in self.cluster_profiles.values():
            if cp.gpu == gpu.id and cp.count == count:
                return cp
        base = self.cluster_profiles.get("8xH100") or next(iter(self.cluster_profiles.values()))
        same_gpu = sorted((cp for cp in self.cluster_profiles.values() if cp.gpu == gpu.id), key=lambda cp: -cp.count)
        phases = {}
        for phase_name, pb in base.phases.items():
            own = next((cp for cp in same_gpu if phase_name in cp.phases), None)
            ref, ref_count = (own.phases[phase_name], own.count) if own else (pb, base.count)
            sequences = ref.micro_batch * ref.grad_accum * ref_count
            per_gpu = max(1, sequences // count)
            micro = max(1, min(ref.micro_batch, per_gpu))
            phases[phase_name] = PhaseBatch(micro_batch=micro, grad_accum=max(1, per_gpu // micro), sec_per_step=None)
        return ClusterProfile(
            name=name or f"{count}x{gpu.id}", gpu=gpu.id, count=count, phases=phases,
            description=f"derived: {base.name}'s sequences a step split over {count}x {gpu.name}")

    def phase(self, name: str) -> Phase:
        key = name.strip().lower()
        if key in self.phases:
            return self.phases[key]
        raise UnknownNameError("phase", name, list(self.phases))

    def prices_for(self, gpu_id: str) -> list[Price]:
        return [p for p in self.prices if p.gpu == gpu_id]
