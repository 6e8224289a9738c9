"""A launch's planned bytes, sized before anything is rented, and where they are billed (gpucli.plan.transfercost):

- the data: a local ``--data`` folder uploaded (its bytes); ``https://`` files downloaded by the host (each
  URL's ``Content-Length`` from a ``HEAD``); ``hf://datasets/ORG/NAME[/GLOB]`` downloaded by the host (the
  sizes the Hub lists for the repository's files, ``huggingface_hub`` ``list_repo_tree``, matched as
  ``snapshot_download``'s ``allow_patterns`` matches them); ``pod:`` paths move nothing;
- the store (``--store``): each checkpoint written is uploaded once (gpucli.run.files.store.quote);
- the mirror (``--mirror-checkpoints``/``--recover``): ``watch`` copies each new checkpoint here once, so
  the pulls are the checkpoints written x one checkpoint's size.

On vast.ai these bytes bill at the offer's $/GB, so offers are ranked on them (lifecycle.offer_ask), the
launch shows them, and the planned amount at the highest rate among the offers it may rent is reserved from
``--budget`` before the caps (trainer, watchdog) are written: the caps stop compute at what is left.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from gpucli.errors import UsageError
from gpucli.plan.transfercost import Leg, TransferPlan, worst_rates
from gpucli.run.files.store import quote as store_quote
from gpucli.run.inputs.launch import folder_bytes
from gpucli.settings import lookup_key

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpucli.providers.api import Offer
    from gpucli.providers.target import Provisioner, Target
    from gpucli.run.inputs.datasources import DataSource
    from gpucli.run.inputs.launch import LaunchRequest, ResolvedLaunch

HEAD_TIMEOUT_S = 10.0
MAX_HEADS = 64  # a longer URL list is not sized one by one before a launch: said "size unknown"


def _url_bytes(url: str) -> int | None:
    from gpucli.providers.http import USER_AGENT  # lazy: the HTTP client's module

    req = urllib.request.Request(url, method="HEAD", headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(req, timeout=HEAD_TIMEOUT_S) as resp:  # noqa: S310 - http(s) only (parse_data)
            length = resp.headers.get("Content-Length")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return int(length) if length is not None and length.isdigit() else None


def hf_files(repo: str, pattern: str | None) -> tuple[tuple[tuple[str, int], ...] | None, str]:
    """The dataset's files the pattern chooses, (path, bytes) as the Hub lists them, or None and why not."""
    try:
        from huggingface_hub import HfApi  # lazy: ~0.5 s, only for an hf:// source
    except ImportError:
        return None, "huggingface_hub is not installed here"
    token = lookup_key("hf")
    try:
        # the endpoint is passed: huggingface_hub reads $HF_ENDPOINT once, when it is first imported
        api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
        files = [f for f in api.list_repo_tree(repo, repo_type="dataset", recursive=True,
                                                   token=token[0] if token else None)
                 if getattr(f, "size", None) is not None]
    except Exception as exc:  # noqa: BLE001 - any Hub answer short of a listing leaves the size unknown
        return None, f"the Hub did not list it: {type(exc).__name__}"
    chosen = tuple((str(f.path), int(getattr(f, "size", 0) or 0)) for f in files
                   if pattern is None or fnmatch.fnmatch(f.path, pattern))
    return chosen, f"{len(chosen)} file(s) as the Hub lists them"


def _hf_bytes(repo: str, pattern: str | None) -> tuple[int | None, str]:
    files, how = hf_files(repo, pattern)
    return (None if files is None else sum(size for _, size in files)), how


@functools.lru_cache(maxsize=8)  # sized once a launch: offer_ask and reserve both ask
def data_leg(source: DataSource | None) -> Leg | None:
    """The data's leg: its bytes and how they were found; None when the data moves nothing billable."""
    if source is None or source.kind == "pod":
        return None  # the demo corpus is read on the host; pod: paths are there already
    if source.kind == "local" and source.local is not None:
        return Leg(f"data upload ({source.local})", "in", folder_bytes(source.local) / 1e9, "the folder's files")
    if source.kind == "url":
        if len(source.downloads) > MAX_HEADS:
            return Leg(f"data download ({len(source.downloads)} URLs)", "in", None,
                       f"more than {MAX_HEADS} URLs are not sized before the launch")
        sizes = [_url_bytes(d.url) for d in source.downloads]
        missing = sum(s is None for s in sizes)
        if missing:
            return Leg(f"data download ({len(sizes)} URL(s))", "in", None,
                       f"{missing} URL(s) gave no Content-Length")
        return Leg(f"data download ({len(sizes)} URL(s))", "in", sum(s or 0 for s in sizes) / 1e9, "Content-Length")
    if source.kind == "hf" and source.repo:
        n, how = _hf_bytes(source.repo, source.pattern)
        return Leg(f"data download ({source.spec})", "in", None if n is None else n / 1e9, how)
    return None


def plan_transfer(resolved: ResolvedLaunch) -> TransferPlan:
    """Every leg of the run's planned bytes (see the module's docstring)."""
    legs = [leg for leg in (data_leg(resolved.data),) if leg is not None]
    q = store_quote(resolved)
    if q is not None:
        legs.append(Leg(f"store uploads ({resolved.store})", "out", q.upload_gb,
                        f"{q.written} checkpoints x {q.checkpoint_gb:.3f} GB"))
    d = resolved.disk
    if resolved.mirror and d is not None:
        each = d.checkpoints.checkpoint_gb
        legs.append(Leg("mirror pulls", "out", None if d.written is None else d.written * each,
                        f"each checkpoint written pulled once: {d.written} x {each:.3f} GB" if d.written else
                        "the number of checkpoints is not known"))
    return TransferPlan(tuple(legs))


def offer_rates(offers: Iterable[Offer]) -> list[tuple[float | None, float | None]]:
    return [(o.inet_down_usd_per_gb, o.inet_up_usd_per_gb) for o in offers]


def reserve(req: LaunchRequest, resolved: ResolvedLaunch, target: Target,
            provision: Provisioner | None) -> tuple[LaunchRequest, list[str]]:
    """``req`` with the planned bandwidth reserved from ``--budget`` (at the highest $/GB among the offers
    the launch may rent), and the quote's lines; a budget the bandwidth alone uses up is refused. Only
    cloud targets: an ssh host or this machine bills no bytes gpucli can know."""
    if not target.cloud:
        return req, []
    plan = plan_transfer(resolved)
    if not plan.legs:
        return req, []
    billed = target.caps.bills_transfer is not False
    offers = provision.offers if provision is not None else ()
    # no offers yet (the machines of a run over several nodes are chosen later): the sizes, priced then
    rates = (worst_rates(offer_rates(offers)) if offers else None) if billed else (0.0, 0.0)
    lines = plan.lines(rates, billed=billed)
    if billed and len(offers) > 1:
        lines[-1] += f" (at the highest $/GB of the {len(offers)} offers it may rent)"
    usd = plan.usd(*rates) if billed and rates is not None else 0.0
    budget = req.limits.budget_usd
    if budget is None or usd <= 0:
        return req, lines
    if usd >= budget:
        gb_in, gb_out = plan.gb()
        raise UsageError(f"--budget ${budget:g} does not cover the planned bandwidth alone (${usd:.2f}: "
                         f"{gb_in:.2f} GB in, {gb_out:.2f} GB out)",
                         hint="raise --budget, or move less: fewer checkpoints, no --mirror-checkpoints, another offer")
    lines.append(f"--budget ${budget:g}: ${usd:.4f} reserved for bandwidth; the caps stop compute at "
                 f"${budget - usd:.4f}")
    return dataclasses.replace(req, limits=req.limits.with_(budget_usd=round(budget - usd, 6))), lines
