"""The store's quote (gpucli/plan/storecost.py), by hand."""

import pytest

from gpucli.plan.storecost import store_quote


def test_vast_bills_every_uploaded_byte_and_the_store_keeps_keep_last_plus_best():
    q = store_quote(checkpoint_gb=2.0, written=10, keep_last=3, hours=73.0, transfer_usd_per_gb=0.02,
                    storage_usd_per_gb_month=0.023)
    assert q.upload_gb == 20.0 and q.transfer_usd == pytest.approx(0.40)
    assert q.kept == 4 and q.stored_gb == 8.0
    assert q.storage_usd_per_month == pytest.approx(0.184)
    assert q.storage_usd_during_run == pytest.approx(0.0184)  # 73 h is a tenth of a 730-hour month
    assert "$0.40 ($0.02/GB out)" in q.line()


def test_runpod_bills_no_transfer_and_an_unknown_rate_says_so():
    assert "not billed" in store_quote(checkpoint_gb=1, written=2, keep_last=3, hours=1, transfer_usd_per_gb=0.0).line()
    q = store_quote(checkpoint_gb=1, written=2, keep_last=3, hours=None, transfer_usd_per_gb=None)
    assert q.transfer_usd is None and "not known" in q.line() and q.kept == 2
