"""What a run's checkpoint store (``--store``) costs: storage of what it keeps, and the transfer of every
checkpoint uploaded, where the provider bills bytes leaving the pod. Pure: numbers in, a quote out.

- Upload: each checkpoint the run writes is sent once (the store then keeps ``keep_last`` + the best, as
  the pod does), so the bytes sent are ``written x checkpoint size``.
- Transfer: vast.ai bills data leaving an instance at the offer's ``inet_up_cost`` $/GB ("Charges apply
  per byte": vast-ai/docs instances/pricing.mdx; the charges API's ``bwu`` item); RunPod has "no fees for
  data ingress or egress" (runpod/docs pods/pricing.mdx). Services that bill ingress are rare (S3, R2,
  B2 and the Hub do not).
- Storage: the store's own price, which gpucli cannot read: AWS S3 Standard's list price
  ($0.023/GB-month, first 50 TB, us-east-1) unless ``GPUCLI_STORE_USD_PER_GB_MONTH`` gives yours
  (Cloudflare R2 $0.015, Backblaze B2 $0.006; a Hub repository: $0 within its quota).
"""

from __future__ import annotations

from dataclasses import dataclass

S3_STANDARD_USD_PER_GB_MONTH = 0.023
HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class StoreQuote:
    checkpoint_gb: float
    written: int  # checkpoints uploaded over the run
    kept: int  # what the store holds at once: keep_last + the best (+ the trainer's best weights)
    upload_gb: float
    transfer_usd: float | None  # None: the provider's rate is not known
    transfer_rate_usd_per_gb: float | None
    stored_gb: float
    storage_usd_per_month: float
    storage_rate_usd_per_gb_month: float
    storage_usd_during_run: float

    def line(self) -> str:
        transfer = ("transfer not billed by the provider" if self.transfer_rate_usd_per_gb == 0 else
                    f"transfer ${self.transfer_usd:.2f} (${self.transfer_rate_usd_per_gb:g}/GB out)"
                    if self.transfer_usd is not None else "transfer at the provider's $/GB out (not known yet)")
        return (f"store: {self.written} checkpoints x {self.checkpoint_gb:.2f} GB uploaded ({self.upload_gb:.1f} GB), "
                f"{transfer}; keeps {self.kept} ({self.stored_gb:.1f} GB): ${self.storage_usd_per_month:.2f}/month "
                f"at ${self.storage_rate_usd_per_gb_month:g}/GB-month")


def store_quote(*, checkpoint_gb: float, written: int, keep_last: int, hours: float | None,
                transfer_usd_per_gb: float | None, storage_usd_per_gb_month: float = S3_STANDARD_USD_PER_GB_MONTH
                ) -> StoreQuote:
    """The quote for a run writing ``written`` checkpoints of ``checkpoint_gb`` each over ``hours``."""
    written = max(1, written)
    kept = min(written, keep_last + 1)
    stored = kept * checkpoint_gb
    upload = written * checkpoint_gb
    during = stored * storage_usd_per_gb_month * (hours or 0.0) / HOURS_PER_MONTH
    return StoreQuote(checkpoint_gb=checkpoint_gb, written=written, kept=kept, upload_gb=upload,
                      transfer_usd=None if transfer_usd_per_gb is None else upload * transfer_usd_per_gb,
                      transfer_rate_usd_per_gb=transfer_usd_per_gb, stored_gb=stored,
                      storage_usd_per_month=stored * storage_usd_per_gb_month,
                      storage_rate_usd_per_gb_month=storage_usd_per_gb_month, storage_usd_during_run=during)
