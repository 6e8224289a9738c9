"""The catalogue: GPUs, prices, profiles, phases, model presets and calibration entries, loaded once.

The records are in ``schema.py``, the YAML readers in ``parse.py``; this module loads a catalogue
directory and caches it, and re-exports the record types for importers (``from gpucli.plan.catalog
import Gpu``). The model presets come from ``trainer/spec/presets.py``: one list for planner and trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpucli.plan.parse import (
    _parse_calibration,
    _parse_gpus,
    _parse_phases,
    _parse_prices,
    _parse_profiles,
    _read_yaml,
    match_gpu_name,
)
from gpucli.plan.schema import (
    INTERCONNECTS,
    PRICE_KINDS,
    CalibrationEntry,
    Catalog,
    ClusterProfile,
    Defaults,
    Gpu,
    ModelShape,
    Phase,
    PhaseBatch,
    Price,
    SingleProfile,
)
from gpucli.settings import catalog_dir, home
from trainer.spec.presets import MODELS, nanochat_spec

__all__ = [
    "INTERCONNECTS", "PRICE_KINDS", "CalibrationEntry", "Catalog", "ClusterProfile", "Defaults", "Gpu",
    "ModelShape", "Phase", "PhaseBatch", "Price", "SingleProfile", "clear_cache", "load_catalog",
    "match_gpu_name", "nanochat_shape",
]

nanochat_shape = nanochat_spec  # the planner's earlier name


_CACHE: dict[Path, Catalog] = {}


def load_catalog(directory: Path | None = None) -> Catalog:
    """Load and validate every catalogue file in ``directory`` (default: the configured catalogue)."""
    directory = Path(directory) if directory is not None else catalog_dir()
    directory = directory.resolve()
    if directory in _CACHE:
        return _CACHE[directory]

    def read(name: str, parse: Callable[..., Any], *args: Any) -> Any:
        return parse(_read_yaml(directory / name), name, *args)

    defaults, gpus = read("gpus.yaml", _parse_gpus)
    phases = read("phases.yaml", _parse_phases)
    singles, clusters = read("profiles.yaml", _parse_profiles, gpus, phases)
    # Measured entries: the catalogue's own, then this user's (`gpucli calibrate RUN` writes those).
    calibration: tuple[CalibrationEntry, ...] = ()
    for path in (directory / "calibration.yaml", home() / "calibration.yaml"):
        if path.exists():
            calibration += _parse_calibration(_read_yaml(path), str(path.name if path.parent == directory
                                                                    else path), gpus)
    catalog = Catalog(
        directory=directory, defaults=defaults, gpus=gpus, prices=read("prices.yaml", _parse_prices, gpus),
        single_profiles=singles, cluster_profiles=clusters, phases=phases, models=MODELS,
        calibration=calibration)
    _CACHE[directory] = catalog
    return catalog


def clear_cache() -> None:
    _CACHE.clear()
