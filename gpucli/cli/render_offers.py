"""The presentation of live offers: the table and its JSON (`gpucli offers`).

Part of the presentation layer (with render.py, whose consoles and number formats it uses).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpucli.cli.render import money, out, table

if TYPE_CHECKING:
    from gpucli.providers.offers import OfferView


def offers_table(views: Sequence[OfferView], *, spot: bool) -> None:
    """One table of live offers across providers; the speed column is the catalogue's estimate."""
    from rich.markup import escape

    value = "at the spot floor" if spot else "on-demand"
    t = table(f"Live {'spot' if spot else 'on-demand'} offers ({len(views)}; TFLOP/s = dense BF16 peak from the "
               f"catalogue x GPUs; TFLOP/s per $/h {value})")
    for col, kw in (("provider", {}), ("offer", {"no_wrap": True}), ("GPU", {}), ("n", {"justify": "right"}),
                    ("VRAM", {"justify": "right"}), ("$/GPU/h", {"justify": "right"}),
                    ("$/h", {"justify": "right"}), ("spot $/GPU/h", {"justify": "right"}),
                    ("reliab.", {"justify": "right"}), ("inet down", {"justify": "right"}),
                    ("$/GB in/out", {"justify": "right"}), ("location", {}),
                    ("TFLOP/s", {"justify": "right"}), ("TFLOP/s per $/h", {"justify": "right"})):
        t.add_column(col, **kw)
    for v in views:
        o = v.offer
        gpu = escape(v.gpu.name) if v.gpu is not None else f"[dim]{escape(o.gpu_display_name or o.gpu_name)}?[/]"
        t.add_row(
            o.provider, escape(o.offer_id), gpu, str(o.gpu_count), f"{o.vram_gb_per_gpu:.0f} GB",
            money(o.price_per_gpu_hour_usd), money(o.price_per_hour_usd), money(o.spot_price_per_gpu_hour_usd),
            "-" if o.reliability is None else f"{o.reliability:.1%}",
            "-" if o.inet_down_mbps is None else f"{o.inet_down_mbps:,.0f} Mb/s", _per_gb(o),
            escape(o.location or "-"),
            "-" if v.bf16_tflops is None else f"{v.bf16_tflops:,.0f}",
            "-" if v.tflops_per_usd_hour is None else f"{v.tflops_per_usd_hour:,.0f}")
    out().print(t)
    if any(v.offer.inet_down_usd_per_gb or v.offer.inet_up_usd_per_gb for v in views):
        out().print("[dim]$/GB in/out: what the host bills per GB reaching it (data) and leaving it (checkpoints to a "
                    "store or here); a launch quotes and ranks on them. RunPod bills no bandwidth (pods/pricing.mdx).[/]")
    if any(v.gpu is None for v in views):
        out().print("[dim]GPU? = not in the catalogue (gpus.yaml vast_names/runpod_ids): no speed estimate.[/]")


def _unbilled(provider: str) -> bool:
    """The provider bills no bytes moved (its target's declared capability)."""
    from gpucli.providers.registry import (
        get_target,  # lazy: the plan's face loads no target until offers are shown
    )

    return get_target(provider).caps.bills_transfer is False


def _per_gb(o: Any) -> str:
    """vast's $/GB in (inet_down_cost) and out (inet_up_cost); RunPod bills none."""
    if _unbilled(o.provider):
        return "0/0"
    if o.inet_down_usd_per_gb is None and o.inet_up_usd_per_gb is None:
        return "-"
    return f"{o.inet_down_usd_per_gb or 0:.3g}/{o.inet_up_usd_per_gb or 0:.3g}"


def offers_json(views: Sequence[OfferView], *, spot: bool) -> dict[str, Any]:
    rows = []
    for v in views:
        o = v.offer
        rows.append({
            "provider": o.provider, "offer_id": o.offer_id, "gpu_name": o.gpu_name,
            "gpu_display_name": o.gpu_display_name, "gpu": None if v.gpu is None else v.gpu.id,
            "gpu_count": o.gpu_count, "vram_gb_per_gpu": o.vram_gb_per_gpu,
            "price_per_hour_usd": o.price_per_hour_usd, "price_per_gpu_hour_usd": o.price_per_gpu_hour_usd,
            "spot_price_per_hour_usd": o.spot_price_per_hour_usd,
            "spot_price_per_gpu_hour_usd": o.spot_price_per_gpu_hour_usd,
            "reliability": o.reliability, "inet_down_mbps": o.inet_down_mbps, "inet_up_mbps": o.inet_up_mbps,
            "inet_down_usd_per_gb": 0.0 if _unbilled(o.provider) else o.inet_down_usd_per_gb,
            "inet_up_usd_per_gb": 0.0 if _unbilled(o.provider) else o.inet_up_usd_per_gb,
            "location": o.location, "dlperf": o.dlperf, "stock": o.stock, "verified": o.verified,
            "bf16_tflops": v.bf16_tflops, "tflops_per_usd_hour": v.tflops_per_usd_hour,
        })
    return {"spot": spot, "offers": rows}
