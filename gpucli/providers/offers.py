"""Live offers: map provider GPU names onto the catalogue, turn offers into planner setups, search.

``match_gpu``, ``describe_offers`` and ``offers_to_setups`` are pure (dataclasses in, dataclasses out).
``search_all`` is the only function here that does I/O: it asks each provider for offers and
returns them with the warnings a caller should show; it never prints.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucli.errors import GpucliError, ProviderError
from gpucli.plan.planner import PriceQuote, Setup
from gpucli.providers.clients import get_provider
from gpucli.providers.credentials import MissingKeyError
from gpucli.providers.query import (
    DEFAULT_ALLOCATED_STORAGE_GB,
    DEFAULT_FILTERS,
    OFFER_FIELDS,
    Query,
    QueryError,
    parse_order,
    sort_by_order,
)

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog, Gpu
    from gpucli.providers.api import Offer

#: A live offer whose VRAM differs from the catalogue GPU's by more than this is not that GPU
#: (vast reports "A100 PCIE" for both the 40 GB and the 80 GB card). Rounding (81559 MiB for an
#: 80 GB H100, 24564 for a 24 GB 4090) is far inside it.
VRAM_TOLERANCE = 0.15

#: Cheapest first (the vastai CLI's default is ``score-``); with --spot, the lowest bid floor first.
DEFAULT_ORDER = "dph_total"
DEFAULT_SPOT_ORDER = "min_bid"


def _norm(name: str) -> str:
    """``"NVIDIA GeForce RTX_4090"`` -> ``"rtx4090"``: case, spaces, ``_``/``-`` and vendor words dropped."""
    text = name.strip().lower().replace("_", " ").replace("-", " ")
    text = re.sub(r"^(nvidia|amd)\s+", "", text)
    text = re.sub(r"\b(geforce|tesla)\b", " ", text)
    return re.sub(r"[^a-z0-9]+", "", text)


def match_gpu(catalog: Catalog, provider: str, gpu_name: str, *, vram_gb: float | None = None) -> Gpu | None:
    """The catalogue GPU a provider's GPU name means, or None when gpucli does not know it.

    Tries, in order: the provider's own names from gpus.yaml (``vast_names`` / ``runpod_ids``), then
    the catalogue id, name and aliases; each compared after :func:`_norm`, so case, ``_`` for space and
    an ``NVIDIA``/``GeForce`` prefix do not matter. When several GPUs share a name (vast's
    ``A100 PCIE`` is the 40 GB and the 80 GB card) ``vram_gb`` picks the closest; a GPU whose VRAM is
    off by more than :data:`VRAM_TOLERANCE` is not a match. An unknown GPU gives None rather than a
    wrong speed estimate.
    """
    key = _norm(gpu_name)
    if not key:
        return None
    gpus = list(catalog.gpus.values())

    def provider_names(gpu: Gpu) -> tuple[str, ...]:
        if provider == "vast":
            return gpu.vast_names
        if provider == "runpod":
            return gpu.runpod_ids
        return gpu.vast_names + gpu.runpod_ids

    tiers = (
        [g for g in gpus if any(_norm(n) == key for n in provider_names(g))],
        [g for g in gpus if key in {_norm(g.id), _norm(g.name), *(_norm(a) for a in g.aliases)}],
    )
    for candidates in tiers:
        if not candidates:
            continue
        if vram_gb is None or vram_gb <= 0:
            return candidates[0]
        best = min(candidates, key=lambda g: abs(g.vram_gb - vram_gb))
        if abs(best.vram_gb - vram_gb) <= VRAM_TOLERANCE * best.vram_gb:
            return best
        return None
    return None


def _offer_gpu(catalog: Catalog, offer: Offer) -> Gpu | None:
    for name in (offer.gpu_name, offer.gpu_display_name):
        if name:
            gpu = match_gpu(catalog, offer.provider, name, vram_gb=offer.vram_gb_per_gpu or None)
            if gpu is not None:
                return gpu
    return None


@dataclass(frozen=True)
class OfferView:
    """One live offer as ``gpucli offers`` shows it: the offer, its catalogue GPU and speed estimate."""

    offer: Offer
    gpu: Gpu | None  # None: a GPU the catalogue does not know (no speed estimate is guessed)
    spot: bool  # prices below are the spot floor

    @property
    def price_per_hour_usd(self) -> float | None:
        """The machine's hourly price in the mode asked for (the spot floor with ``spot``)."""
        return self.offer.spot_price_per_hour_usd if self.spot else self.offer.price_per_hour_usd

    @property
    def price_per_gpu_hour_usd(self) -> float | None:
        return self.offer.spot_price_per_gpu_hour_usd if self.spot else self.offer.price_per_gpu_hour_usd

    @property
    def bf16_tflops(self) -> float | None:
        """Dense BF16 peak of the whole machine (catalogue datasheet number x GPU count)."""
        return None if self.gpu is None else self.gpu.bf16_dense_tflops * self.offer.gpu_count

    @property
    def tflops_per_usd_hour(self) -> float | None:
        """Peak TFLOP/s bought per dollar-hour: the value measure that compares machines of any size."""
        price = self.price_per_hour_usd
        tflops = self.bf16_tflops
        if tflops is None or price is None or price <= 0:
            return None
        return tflops / price


def describe_offers(catalog: Catalog, offers: Sequence[Offer], *, spot: bool) -> list[OfferView]:
    """Attach the catalogue GPU (and so a speed estimate) to each offer, in the same order."""
    return [OfferView(offer=o, gpu=_offer_gpu(catalog, o), spot=spot) for o in offers]


def offers_to_setups(catalog: Catalog, offers: Sequence[Offer], *, spot: bool,
                     gpu_ids: Collection[str] | None = None, max_gpus: int | None = None) -> list[Setup]:
    """Planner setups priced by live offers: one per offer whose GPU the catalogue knows.

    The price is per GPU-hour (the spot floor with ``spot``; offers without one are left out), and
    each quote carries the offer id and provider so the plan says which offer every number came from.
    ``gpu_ids`` and ``max_gpus`` narrow the setups as ``--gpu`` and ``--max-gpus`` do for the catalogue.
    """
    kind = "spot" if spot else "on-demand"
    setups: list[Setup] = []
    for view in describe_offers(catalog, offers, spot=spot):
        offer, gpu = view.offer, view.gpu
        price = view.price_per_gpu_hour_usd
        if gpu is None or price is None or price <= 0 or offer.gpu_count < 1:
            continue
        if gpu_ids is not None and gpu.id not in gpu_ids:
            continue
        if max_gpus is not None and offer.gpu_count > max_gpus:
            continue
        quote = PriceQuote(
            usd_per_gpu_hour=price, kind=kind, source=f"live {offer.provider} offer {offer.offer_id}",
            as_of_text="live", age_days=0, stale=False, provider=offer.provider, offer_id=offer.offer_id)
        setups.append(Setup(gpu=gpu, n_gpus=offer.gpu_count, price=quote))
    return setups


def check_order(order: str) -> str:
    """Validate ``--order`` text against vast's fields so a typo is an error, not a silent no-op."""
    for field, _direction in parse_order(order):
        if field not in OFFER_FIELDS:
            raise QueryError(f"unknown sort field '{field}'",
                             hint="sort by a query field, e.g. dph_total, min_bid, dlperf_usd-, reliability-")
    return order


def unreported_fields(query: Query | None, offers: Sequence[Offer]) -> list[str]:
    """Fields the user filtered on that none of ``offers`` carries (so the filter was skipped for them).

    vast's default filters (verified, external, rentable) are not the user's and are not reported.
    """
    if query is None or not offers:
        return []
    defaults = {f for f, _op, _v in DEFAULT_FILTERS}
    present: set[str] = set()
    for offer in offers:
        present.update(offer.query_record())
    return [f for f in query.fields if f not in present and f not in defaults]


def search_all(providers: Sequence[str], query: Query | None, *, spot: bool, limit: int, order: str,
               required: bool = False,
               disk_gb: float | None = DEFAULT_ALLOCATED_STORAGE_GB) -> tuple[list[Offer], list[str]]:
    """Offers from every provider in ``providers``, merged, sorted by ``order``, at most ``limit``.

    ``disk_gb`` is the storage priced into vast.ai's $/h; it defaults to the vastai CLI's ``--storage``
    (5 GB) so `gpucli offers` shows what vast's own tools show. A launch passes its ``--disk``.

    A provider without a key, or one whose API fails, is skipped with a one-line warning, unless
    ``required`` (the user named it) or every provider failed: then the error is raised. Nothing is
    printed here; the caller shows the warnings.
    """
    if limit < 1:
        raise QueryError(f"--limit must be at least 1, got {limit}")
    check_order(order)
    merged: list[Offer] = []
    warnings: list[str] = []
    failures: list[GpucliError] = []
    for name in providers:
        provider = get_provider(name)
        try:
            found = provider.search_offers(query, spot=spot, limit=limit, order=order, disk_gb=disk_gb)
        except ProviderError as exc:  # MissingKeyError included
            if required:
                raise
            failures.append(exc)
            warnings.append(f"skipping {name}: {exc}")
            continue
        merged.extend(found)
        unknown = unreported_fields(query, found)
        if unknown:
            warnings.append(f"{name} does not report {', '.join(unknown)}: that part of the query "
                            f"was not applied to its {len(found)} offers")
    if providers and len(failures) == len(providers):
        if all(isinstance(f, MissingKeyError) for f in failures):
            names = " or ".join(providers)
            raise MissingKeyError(f"no API key for {names}",
                                  hint="run `gpucli keys set vast` / `gpucli keys set runpod`, "
                                       "or set VAST_API_KEY / RUNPOD_API_KEY")
        raise failures[0]
    return sort_by_order(merged, order)[:limit], warnings


__all__ = ["OfferView", "check_order", "describe_offers", "match_gpu", "offers_to_setups",
           "search_all"]
