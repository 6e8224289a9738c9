"""YAML to catalogue records: one ``_parse_*`` function per file, each field checked where it is read.

A bad file fails with ``file: key: what is wrong`` (CatalogError, exit 2); no raw dict leaves this
module. Loading and caching are in ``gpucli/plan/catalog.py``.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpucli.errors import CatalogError
from gpucli.plan.schema import (
    INTERCONNECTS,
    PRICE_KINDS,
    CalibrationEntry,
    ClusterProfile,
    Defaults,
    Gpu,
    ModelShape,
    Phase,
    PhaseBatch,
    Price,
    SingleProfile,
    Stages,
)
from trainer.spec.modelspec import MLP_KINDS, NORMS, POSITIONS, SpecError

# --------------------------------------------------------------------------------------------------
# Field readers: each raises CatalogError("file: key: problem")


class _Reader:
    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, key: str, problem: str) -> CatalogError:
        return CatalogError(self.file, key, problem)

    def mapping(self, data: Any, key: str) -> Mapping[str, Any]:
        if not isinstance(data, Mapping):
            raise self.fail(key, f"expected a mapping, got {type(data).__name__}")
        return data

    def require(self, data: Mapping[str, Any], key: str, where: str) -> Any:
        if key not in data or data[key] is None:
            raise self.fail(f"{where}.{key}" if where else key, "missing")
        return data[key]

    def number(self, data: Mapping[str, Any], key: str, where: str, *, minimum: float | None = 0.0,
               maximum: float | None = None, optional: bool = False, integer: bool = False,
               default: Any = None) -> Any:
        full = f"{where}.{key}" if where else key
        if key not in data or data[key] is None:
            if optional:
                return default
            raise self.fail(full, "missing")
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(full, f"expected a number, got {value!r}")
        if integer and int(value) != value:
            raise self.fail(full, f"expected a whole number, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(full, f"must be >= {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise self.fail(full, f"must be <= {maximum}, got {value!r}")
        return int(value) if integer else float(value)

    def text(self, data: Mapping[str, Any], key: str, where: str, *, optional: bool = False,
             choices: Iterable[str] | None = None, default: str | None = None) -> Any:
        full = f"{where}.{key}" if where else key
        if key not in data or data[key] is None:
            if optional:
                return default
            raise self.fail(full, "missing")
        value = data[key]
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise self.fail(full, f"expected text, got {value!r}")
        value = str(value)
        if choices is not None and value not in choices:
            raise self.fail(full, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def flag(self, data: Mapping[str, Any], key: str, where: str, default: bool | None = None) -> Any:
        full = f"{where}.{key}" if where else key
        if key not in data or data[key] is None:
            if default is not None:
                return default
            raise self.fail(full, "missing")
        if not isinstance(data[key], bool):
            raise self.fail(full, f"expected true or false, got {data[key]!r}")
        return data[key]

    def names(self, data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, (str, int)) for v in value):
            raise self.fail(f"{where}.{key}", "expected a list of names")
        return tuple(str(v) for v in value)

    def unknown_keys(self, data: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
        extra = sorted(set(map(str, data)) - set(allowed))
        if extra:
            raise self.fail(f"{where}.{extra[0]}" if where else extra[0],
                            f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _parse_date(reader: _Reader, value: Any, key: str) -> tuple[dt.date | None, str]:
    if value is None:
        return None, "undated"
    if isinstance(value, dt.datetime):
        return value.date(), value.date().isoformat()
    if isinstance(value, dt.date):
        return value, value.isoformat()
    text = str(value)
    m = re.fullmatch(r"(\d{4})-(\d{2})(?:-(\d{2}))?", text)
    if not m:
        raise reader.fail(key, f"expected a date YYYY-MM or YYYY-MM-DD, got {value!r}")
    try:
        return dt.date(int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)), text
    except ValueError as exc:
        raise reader.fail(key, f"not a date: {value!r}") from exc


# --------------------------------------------------------------------------------------------------
# One parser per file


def _parse_gpus(data: Any, file: str) -> tuple[Defaults, dict[str, Gpu]]:
    r = _Reader(file)
    root = r.mapping(data, "(top)")
    d = r.mapping(r.require(root, "defaults", ""), "defaults")
    scaling = r.mapping(r.require(d, "scaling_per_doubling", "defaults"), "defaults.scaling_per_doubling")
    for ic in INTERCONNECTS:
        r.number(scaling, ic, "defaults.scaling_per_doubling", minimum=0.01, maximum=1.0)
    w = "defaults"
    defaults = Defaults(
        train_mfu=r.number(d, "train_mfu", w, minimum=0.001, maximum=1.0),
        train_mfu_source=r.text(d, "train_mfu_source", w, optional=True, default="catalogue default"),
        scaling_per_doubling={ic: float(scaling[ic]) for ic in INTERCONNECTS},
        train_state_bytes_per_param=r.number(d, "train_state_bytes_per_param", w, minimum=1),
        logits_bytes_per_token_vocab=r.number(d, "logits_bytes_per_token_vocab", w),
        cuda_overhead_gb=r.number(d, "cuda_overhead_gb", w),
        usable_vram_fraction=r.number(d, "usable_vram_fraction", w, minimum=0.1, maximum=1.0),
        max_micro_batch=r.number(d, "max_micro_batch", w, minimum=1, integer=True),
        decode_bandwidth_efficiency=r.number(d, "decode_bandwidth_efficiency", w, minimum=0.001, maximum=1.0),
        decode_bytes_per_param=r.number(d, "decode_bytes_per_param", w, minimum=0.1),
        decode_context_tokens=r.number(d, "decode_context_tokens", w, minimum=1, integer=True),
        decode_parallel_efficiency=r.number(d, "decode_parallel_efficiency", w, minimum=0.01, maximum=1.0),
        decode_io_overhead_fraction=r.number(d, "decode_io_overhead_fraction", w),
        decode_load_minutes=r.number(d, "decode_load_minutes", w),
        stale_after_days=r.number(d, "stale_after_days", w, minimum=1, integer=True),
        env_build_minutes=r.number(d, "env_build_minutes", w, optional=True, default=5.0),
    )
    gpus: dict[str, Gpu] = {}
    table = r.mapping(r.require(root, "gpus", ""), "gpus")
    allowed = {"name", "aliases", "vram_gb", "architecture", "bf16_dense_tflops", "memory_bandwidth_gbps",
               "interconnect", "source", "vast_names", "runpod_ids", "train_mfu", "compute_capability", "min_cuda"}
    for gid, raw in table.items():
        where = f"gpus.{gid}"
        g = r.mapping(raw, where)
        r.unknown_keys(g, allowed, where)
        gpus[str(gid).lower()] = Gpu(
            id=str(gid).lower(),
            name=r.text(g, "name", where),
            aliases=tuple(a.lower() for a in r.names(g, "aliases", where)),
            vram_gb=r.number(g, "vram_gb", where, minimum=1),
            architecture=r.text(g, "architecture", where),
            bf16_dense_tflops=r.number(g, "bf16_dense_tflops", where, minimum=0.1),
            memory_bandwidth_gbps=r.number(g, "memory_bandwidth_gbps", where, minimum=1),
            interconnect=r.text(g, "interconnect", where, choices=INTERCONNECTS),
            source=r.text(g, "source", where),
            vast_names=r.names(g, "vast_names", where),
            runpod_ids=r.names(g, "runpod_ids", where),
            train_mfu=r.number(g, "train_mfu", where, minimum=0.001, maximum=1.0, optional=True),
            compute_capability=_version(r, g, "compute_capability", where),
            min_cuda=_version(r, g, "min_cuda", where),
        )
    if not gpus:
        raise r.fail("gpus", "no GPUs defined")
    return defaults, gpus


def _version(r: _Reader, g: Any, key: str, where: str) -> str | None:
    """A "major.minor" version ("12.8", "10.0"), or None when the entry has none."""
    if g.get(key) is None:
        return None
    text = str(g[key]).strip()
    if not re.fullmatch(r"\d+\.\d+", text):
        raise r.fail(f"{where}.{key}", f"expected a version such as 12.8, got {g[key]!r}")
    return text


def _parse_prices(data: Any, file: str, gpus: Mapping[str, Gpu]) -> tuple[Price, ...]:
    r = _Reader(file)
    root = r.mapping(data, "(top)")
    rows = root.get("prices")
    if not isinstance(rows, list):
        raise r.fail("prices", "expected a list of price entries")
    allowed = {"gpu", "usd_per_hour", "per", "count", "kind", "as_of", "source", "usd_per_hour_high",
               "provider", "note"}
    prices = []
    for i, raw in enumerate(rows):
        where = f"prices[{i}]"
        p = r.mapping(raw, where)
        r.unknown_keys(p, allowed, where)
        gpu = r.text(p, "gpu", where).lower()
        if gpu not in gpus:
            raise r.fail(f"{where}.gpu", f"unknown GPU '{gpu}' (not in gpus.yaml)")
        per = r.text(p, "per", where, choices=("gpu", "node"))
        count = r.number(p, "count", where, minimum=1, integer=True, optional=(per == "gpu"))
        as_of, as_of_text = _parse_date(r, p.get("as_of"), f"{where}.as_of")
        low = r.number(p, "usd_per_hour", where)
        high = r.number(p, "usd_per_hour_high", where, optional=True)
        if high is not None and high < low:
            raise r.fail(f"{where}.usd_per_hour_high", f"{high} is below usd_per_hour {low}")
        prices.append(Price(
            gpu=gpu, usd_per_hour=low, per=per, count=count, kind=r.text(p, "kind", where, choices=PRICE_KINDS),
            as_of=as_of, as_of_text=as_of_text, source=r.text(p, "source", where), usd_per_hour_high=high,
            provider=r.text(p, "provider", where, optional=True), note=r.text(p, "note", where, optional=True)))
    return tuple(prices)


def _parse_profiles(data: Any, file: str, gpus: Mapping[str, Gpu], phases: Mapping[str, Phase]
                    ) -> tuple[dict[str, SingleProfile], dict[str, ClusterProfile]]:
    r = _Reader(file)
    root = r.mapping(data, "(top)")
    singles: dict[str, SingleProfile] = {}
    for name, raw in r.mapping(root.get("single") or {}, "single").items():
        where = f"single.{name}"
        p = r.mapping(raw, where)
        r.unknown_keys(p, {"gpu", "batch_size", "grad_accum", "bf16", "compile", "description"}, where)
        gpu = p.get("gpu")
        if gpu is not None and str(gpu).lower() not in gpus:
            raise r.fail(f"{where}.gpu", f"unknown GPU '{gpu}' (not in gpus.yaml)")
        singles[str(name)] = SingleProfile(
            name=str(name), gpu=None if gpu is None else str(gpu).lower(),
            batch_size=r.number(p, "batch_size", where, minimum=1, integer=True),
            grad_accum=r.number(p, "grad_accum", where, minimum=1, integer=True, optional=True, default=1),
            bf16=r.flag(p, "bf16", where), compile=r.flag(p, "compile", where),
            description=r.text(p, "description", where, optional=True, default=""))
    clusters: dict[str, ClusterProfile] = {}
    for name, raw in r.mapping(root.get("cluster") or {}, "cluster").items():
        where = f"cluster.{name}"
        p = r.mapping(raw, where)
        r.unknown_keys(p, {"gpu", "count", "description", "phases"}, where)
        gpu = r.text(p, "gpu", where).lower()
        if gpu not in gpus:
            raise r.fail(f"{where}.gpu", f"unknown GPU '{gpu}' (not in gpus.yaml)")
        batches = {}
        for phase_name, braw in r.mapping(r.require(p, "phases", where), f"{where}.phases").items():
            pw = f"{where}.phases.{phase_name}"
            if str(phase_name) not in phases:
                raise r.fail(pw, f"unknown phase (phases.yaml has {', '.join(phases)})")
            b = r.mapping(braw, pw)
            r.unknown_keys(b, {"micro_batch", "grad_accum", "sec_per_step"}, pw)
            sps = b.get("sec_per_step")
            if sps is not None and (not isinstance(sps, list) or len(sps) != 2
                                    or not all(isinstance(x, (int, float)) for x in sps)):
                raise r.fail(f"{pw}.sec_per_step", "expected [low, high] seconds")
            batches[str(phase_name)] = PhaseBatch(
                micro_batch=r.number(b, "micro_batch", pw, minimum=1, integer=True),
                grad_accum=r.number(b, "grad_accum", pw, minimum=1, integer=True),
                sec_per_step=None if sps is None else (float(sps[0]), float(sps[1])))
        clusters[str(name)] = ClusterProfile(
            name=str(name), gpu=gpu, count=r.number(p, "count", where, minimum=1, integer=True),
            description=r.text(p, "description", where, optional=True, default=""), phases=batches)
    return singles, clusters


def _parse_phases(data: Any, file: str) -> dict[str, Phase]:
    r = _Reader(file)
    root = r.mapping(data, "(top)")
    phases = {}
    for name, raw in r.mapping(r.require(root, "phases", ""), "phases").items():
        where = f"phases.{name}"
        p = r.mapping(raw, where)
        r.unknown_keys(p, {"description", "iterations", "matrix_lr", "embedding_lr", "batch_scale",
                           "refinement", "stages"}, where)
        stages = None
        if p.get("stages") is not None:
            sw = f"{where}.stages"
            st = r.mapping(p["stages"], sw)
            r.unknown_keys(st, {"stage1_steps", "stage2_steps", "stage1_chunk_size", "stage2_chunk_size"}, sw)
            stages = Stages(
                stage1_steps=r.number(st, "stage1_steps", sw, minimum=1, integer=True),
                stage2_steps=r.number(st, "stage2_steps", sw, minimum=0, integer=True),
                stage1_chunk_size=r.number(st, "stage1_chunk_size", sw, minimum=1, integer=True, optional=True),
                stage2_chunk_size=r.number(st, "stage2_chunk_size", sw, minimum=1, integer=True, optional=True))
        ref = r.mapping(p.get("refinement") or {}, f"{where}.refinement")
        r.unknown_keys(ref, {"supervision_weight_base", "improvement_reward_scale"}, f"{where}.refinement")
        knobs = {k: r.number(ref, k, f"{where}.refinement", minimum=0, maximum=1000) if k in ref else None
                 for k in ("supervision_weight_base", "improvement_reward_scale")}
        phases[str(name).lower()] = Phase(
            name=str(name).lower(), description=r.text(p, "description", where, optional=True, default=""),
            iterations=r.number(p, "iterations", where, minimum=1, integer=True),
            matrix_lr=r.number(p, "matrix_lr", where, minimum=0, maximum=1),
            embedding_lr=r.number(p, "embedding_lr", where, minimum=0, maximum=10),
            batch_scale=r.number(p, "batch_scale", where, minimum=0.01, maximum=16), stages=stages,
            **knobs)
    return phases


def _parse_shape(r: _Reader, m: Mapping[str, Any], name: str, where: str) -> ModelShape:
    """A measured shape (a calibration entry's ``model`` or ``shape`` mapping) as a model description;
    what is left out is the trainer's default (GELU, learned positions, tied head, LayerNorm)."""
    r.unknown_keys(m, {"d_model", "n_layers", "n_heads", "d_ff", "vocab_size", "max_seq_len", "mlp",
                       "pos_embedding", "tied_embeddings", "n_kv_heads", "norm", "qk_norm", "logit_softcap",
                       "source"}, where)
    spec = dict(
        name=name, d_model=r.number(m, "d_model", where, minimum=1, integer=True),
        n_layers=r.number(m, "n_layers", where, minimum=1, integer=True),
        n_heads=r.number(m, "n_heads", where, minimum=1, integer=True),
        n_kv_heads=r.number(m, "n_kv_heads", where, minimum=1, integer=True, optional=True),
        d_ff=r.number(m, "d_ff", where, minimum=1, integer=True),
        vocab_size=r.number(m, "vocab_size", where, minimum=2, integer=True),
        max_seq_len=r.number(m, "max_seq_len", where, minimum=1, integer=True),
        mlp=r.text(m, "mlp", where, optional=True, default="gelu", choices=MLP_KINDS),
        pos_embedding=r.text(m, "pos_embedding", where, optional=True, default="learned", choices=POSITIONS),
        tied_embeddings=r.flag(m, "tied_embeddings", where, default=True),
        norm=r.text(m, "norm", where, optional=True, default="layernorm", choices=NORMS),
        qk_norm=r.flag(m, "qk_norm", where, default=False),
        logit_softcap=r.number(m, "logit_softcap", where, minimum=1e-9, optional=True),
        source=r.text(m, "source", where, optional=True, default=""))
    try:
        return ModelShape(**spec)
    except SpecError as exc:  # what the description itself refuses: d_model not divisible by n_heads, ...
        raise r.fail(f"{where}.{exc.field}", exc.problem) from None


def match_gpu_name(gpus: Mapping[str, Gpu], name: str) -> Gpu | None:
    """A catalogue GPU from an id, alias, name, or a device / provider name ("NVIDIA H100 80GB HBM3")."""
    key = name.strip().lower()
    norm = key.replace("_", " ").replace("-", " ")
    for gpu in gpus.values():
        names = {gpu.id, gpu.name.lower(), *gpu.aliases, *(n.lower() for n in gpu.runpod_ids),
                 *(n.lower() for n in gpu.vast_names)}
        if key in names or norm in {n.replace("_", " ").replace("-", " ") for n in names}:
            return gpu
    return None




def _parse_calibration(data: Any, file: str, gpus: Mapping[str, Gpu]) -> tuple[CalibrationEntry, ...]:
    """Measured entries: a list (what bench_trainer.py and `gpucli calibrate` append) or
    ``{entries: [...]}``. ``gpu`` may be a catalogue id or a device name as torch reports it; ``model``
    a preset name or a mapping with the measured shape."""
    r = _Reader(file)
    if data is None:
        return ()
    rows = data if isinstance(data, list) else r.mapping(data, "(top)").get("entries") or []
    if not isinstance(rows, list):
        raise r.fail("entries", "expected a list")
    out = []
    for i, raw in enumerate(rows):
        where = f"entries[{i}]"
        e = r.mapping(raw, where)
        gpu_name = r.text(e, "gpu", where)
        gpu = match_gpu_name(gpus, gpu_name)
        if gpu is None:
            if gpu_name.lower() == "cpu":
                continue  # a CPU smoke measurement: nothing to plan with
            raise r.fail(f"{where}.gpu", f"unknown GPU '{gpu_name}' (not in gpus.yaml)")
        model = e.get("model")
        shape = None
        if isinstance(model, Mapping):
            m = dict(model)
            name = str(m.pop("name", "custom")).lower()
            m.pop("params", None)
            m.setdefault("max_seq_len", e.get("seq_len") or 1024)
            shape = _parse_shape(r, m, name, f"{where}.model")
            model_name = name
        else:
            model_name = r.text(e, "model", where).lower()
            if isinstance(e.get("shape"), Mapping):
                shape = _parse_shape(r, e["shape"], model_name, f"{where}.shape")
        out.append(CalibrationEntry(
            workload=r.text(e, "workload", where, optional=True, default="train", choices=("train", "generate")),
            gpu=gpu.id, gpu_count=r.number(e, "gpu_count", where, minimum=1, integer=True, optional=True, default=1),
            model=model_name,
            tokens_per_s=r.number(e, "tokens_per_s", where, minimum=1e-9),
            mfu=r.number(e, "mfu", where, minimum=0, maximum=1, optional=True),
            seq_len=r.number(e, "seq_len", where, minimum=1, integer=True, optional=True),
            micro_batch=r.number(e, "micro_batch", where, minimum=1, integer=True, optional=True),
            precision=r.text(e, "precision", where, optional=True),
            compile=e.get("compile") if isinstance(e.get("compile"), bool) else None,
            peak_mem_gib=r.number(e, "peak_mem_gib", where, optional=True),
            date=r.text(e, "date", where, optional=True, default="undated"),
            source=r.text(e, "source", where),
            trainer_version=r.text(e, "trainer_version", where, optional=True),
            shape=shape))
    return tuple(out)


def _read_yaml(path: Path) -> Any:
    import yaml  # lazy: yaml only when a catalogue file is read (gpucli --help stays fast)

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader is ~10x faster
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.load(fh, Loader=loader)  # noqa: S506 - a safe loader
    except FileNotFoundError as exc:
        raise CatalogError(path.name, "(file)", f"missing from the catalogue directory {path.parent}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(parse)"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CatalogError(path.name, where, f"invalid YAML: {problem}") from exc
    except OSError as exc:
        raise CatalogError(path.name, "(file)", f"cannot read: {exc.strerror}") from exc
