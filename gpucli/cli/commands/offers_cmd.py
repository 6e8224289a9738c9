"""`gpucli offers`: live offers from vast.ai and RunPod in one table, filtered by vast's query language."""

from __future__ import annotations

import typer

PROVIDER_CHOICES = ("all", "vast", "runpod")


def resolve_providers(provider: str) -> tuple[list[str], bool]:
    """``--provider`` text -> (provider names, whether the user named them: then a missing key is an error)."""
    from gpucli.errors import UsageError
    from gpucli.providers.clients import ALIASES, REGISTRY

    key = provider.strip().lower()
    if key == "all":
        return sorted(REGISTRY), False
    key = ALIASES.get(key, key)
    if key not in REGISTRY:
        raise UsageError(f"unknown provider '{provider}'", hint="use " + ", ".join(PROVIDER_CHOICES))
    return [key], True


def offers(
    query: str = typer.Argument(None, metavar="[QUERY]",
                                help="vast.ai query, e.g. 'gpu_name=RTX_3090 num_gpus>=4 reliability>0.95'. "
                                     "Sent to vast.ai, applied to RunPod offers here."),
    provider: str = typer.Option("all", "--provider", "-p", help="vast, runpod or all."),
    order: str = typer.Option(None, "--order", "-o",
                              help="Sort fields, '-' for descending: dph_total, dlperf_usd-, reliability- "
                                   "(default: dph_total; min_bid with --spot)."),
    spot: bool = typer.Option(False, "--spot", help="Interruptible offers, sorted by and valued at the spot floor (min bid)."),
    limit: int = typer.Option(30, "--limit", "-n", help="At most this many offers (per provider, then overall)."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Live GPU offers across providers: $/h per GPU and machine, spot floor, reliability, speed estimate."""
    from gpucli.cli import render, render_offers
    from gpucli.plan.catalog import load_catalog
    from gpucli.providers.offers import DEFAULT_ORDER, DEFAULT_SPOT_ORDER, describe_offers, search_all
    from gpucli.providers.query import parse_query

    names, required = resolve_providers(provider)
    parsed = parse_query(query)
    catalog = load_catalog()
    found, warnings = search_all(names, parsed, spot=spot, limit=limit,
                                 order=order or (DEFAULT_SPOT_ORDER if spot else DEFAULT_ORDER), required=required)
    for message in warnings:
        render.warn(message)
    views = describe_offers(catalog, found, spot=spot)
    if json_:
        render.json_out(render_offers.offers_json(views, spot=spot))
    else:
        render_offers.offers_table(views, spot=spot)


def register(app: typer.Typer) -> None:
    app.command("offers")(offers)
