"""What a run's bytes cost where the provider bills them: the data the host downloads, the checkpoints
it sends to a store or to this machine's mirror, a local ``--data`` folder uploaded. Pure: sizes and
$/GB in, a quote out.

- vast.ai: "Charges apply per byte transferred" (vast-ai/docs instances/pricing.mdx L70), billed on the
  instance's charges as ``bwd`` (data reaching it, at the offer's ``inet_down_cost`` $/GB) and ``bwu``
  (data leaving it, at ``inet_up_cost``) (vast-ai/docs api-reference show_charges.yaml; gpucli/providers/vast/bill.py).
- RunPod: "no fees for data ingress or egress" (runpod/docs pods/pricing.mdx L16): every leg is $0 there.

"in" is what reaches the host (downloads, uploads from here), "out" what leaves it (store uploads, the
mirror's pulls to this machine). A leg whose size cannot be known before the run says so: it is never
counted as 0 GB in silence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Leg:
    what: str  # "data download (hf://datasets/org/name)", "mirror pulls", ...
    direction: str  # "in": reaching the host (vast inet_down_cost) | "out": leaving it (inet_up_cost)
    gb: float | None  # None: the size is not known before the run
    note: str = ""  # how the size was found, or why it is not known


@dataclass(frozen=True)
class TransferPlan:
    legs: tuple[Leg, ...] = ()

    def gb(self) -> tuple[float, float]:
        """(GB in, GB out) of the legs whose size is known: what offers are ranked on."""
        return (round(sum(leg.gb or 0.0 for leg in self.legs if leg.direction == "in"), 3),
                round(sum(leg.gb or 0.0 for leg in self.legs if leg.direction == "out"), 3))

    @property
    def unknown(self) -> tuple[Leg, ...]:
        return tuple(leg for leg in self.legs if leg.gb is None)

    def usd(self, in_usd_per_gb: float | None, out_usd_per_gb: float | None) -> float:
        """The known legs at these rates (None: a rate the provider did not give, counted as $0)."""
        gb_in, gb_out = self.gb()
        return gb_in * (in_usd_per_gb or 0.0) + gb_out * (out_usd_per_gb or 0.0)

    def lines(self, rates: tuple[float | None, float | None] | None, *, billed: bool) -> list[str]:
        """One line a leg and a total: ``rates`` (in, out) $/GB of the chosen offer (None: not chosen yet);
        ``billed``: whether the provider bills bytes at all."""
        if not self.legs:
            return []
        out = []
        for leg in self.legs:
            size = "size unknown" if leg.gb is None else f"{leg.gb:.3f} GB"
            rate = None if rates is None else rates[0 if leg.direction == "in" else 1]
            if not billed:
                cost = "$0 (not billed)"
            elif rates is None:
                cost = f"at the offer's $/GB {leg.direction} (chosen at launch)"
            elif leg.gb is None:
                cost = f"${rate or 0.0:g}/GB, not counted"
            else:
                cost = f"x ${rate or 0.0:g}/GB = ${leg.gb * (rate or 0.0):.4f}"
            out.append(f"bandwidth {leg.direction}: {leg.what}: {size} {cost}" + (f" ({leg.note})" if leg.note else ""))
        gb_in, gb_out = self.gb()
        total = (f"${self.usd(*rates):.4f}" if billed and rates is not None else "$0" if not billed else
                 "priced once an offer is chosen")
        unknown = f"; {len(self.unknown)} leg(s) of unknown size not in it" if self.unknown and billed else ""
        out.append(f"bandwidth total: {gb_in:.3f} GB in, {gb_out:.3f} GB out: {total}{unknown}")
        return out


def worst_rates(rates: Sequence[tuple[float | None, float | None]]) -> tuple[float, float]:
    """The highest $/GB in and out among the offers a launch may rent: what is reserved from the budget."""
    return (max((r[0] or 0.0 for r in rates), default=0.0), max((r[1] or 0.0 for r in rates), default=0.0))
