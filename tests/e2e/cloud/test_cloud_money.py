"""Money guards before renting: offers priced with the launch's disk, and the account's balance.

vast.ai prices storage into ``dph_total`` at the search's ``allocated_storage`` (vastai/cli/commands/
offers.py ``--storage``); the launch searches with its own ``--disk``. The balance guard refuses to rent
when the provider reports less credit than ``--budget`` (or the planned cost), unless ``--force``.
"""

from __future__ import annotations

import pytest

from gpucli.errors import ExitCode
from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import emulator_for, error_lines, launch


def bundle_searches(emu) -> list[dict]:
    return [body for method, path, body in emu.requests if path.rstrip("/").endswith("/bundles")]


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_low_balance_refuses_with_the_numbers_and_rents_nothing(provider, request, capsys, tmp_path):
    emu = emulator_for(request, provider)
    emu.balance_usd = 3.25
    code, out, err = launch(capsys, tmp_path, provider, "poor", "--budget", "5", "--disk", "80")
    assert code == ExitCode.MONEY, err
    (line,) = error_lines(err)
    assert f"{provider} balance $3.25 is below --budget $5.00" in line and "--force" in line
    assert "Traceback" not in err
    assert emu.ledger.created() == []  # nothing rented
    assert not (runs.runs_dir() / "poor.json").exists()
    # ... and the name is free again.
    assert runs.unique_name("poor") == "poor"
    if provider == "vast":  # the offers were priced with the launch's disk
        assert bundle_searches(emu) and all(b.get("allocated_storage") == 80 for b in bundle_searches(emu))


def test_balance_guard_numbers_force_and_unknown_balance(request, monkeypatch):
    from gpucli.plan.catalog import load_catalog
    from gpucli.providers.registry import get_target
    from gpucli.run.inputs.launch import LaunchRequest, resolve
    from gpucli.run.inputs.money import BalanceTooLowError, balance_guard
    from gpucli.runs.limits import Limits

    emu = emulator_for(request, "runpod")
    target = get_target("runpod")
    catalog = load_catalog()

    def resolved(budget):
        return resolve(catalog, LaunchRequest(profile="rtx4090", provider="runpod",
                                              limits=Limits(budget_usd=budget, price_per_hour_usd=0.5)),
                       run_name="guarded")

    emu.balance_usd = 10.0
    assert balance_guard(target, resolved(9.99)) == 10.0  # enough
    with pytest.raises(BalanceTooLowError) as exc:
        balance_guard(target, resolved(10.01))
    assert exc.value.exit_code == ExitCode.MONEY and "$10.00 is below --budget $10.01" in str(exc.value)
    assert balance_guard(target, resolved(10.01), force=True) is None  # --force: not even asked
    emu.balance_usd = None  # the API does not say: not guarded
    assert balance_guard(target, resolved(1e6)) is None
    assert balance_guard(get_target("local"), resolved(1e6)) is None  # nothing is rented locally


def test_force_launches_despite_a_low_balance(request, capsys, tmp_path):
    from tests.support.cli import cli

    emu = emulator_for(request, "runpod")
    emu.balance_usd = 0.01
    code, out, err = launch(capsys, tmp_path, "runpod", "forced", "--budget", "5", "--force")
    assert code == 0, err
    assert len(emu.ledger.created()) == 1
    assert "force" not in (runs.load("forced").launch or {}).get("request", {})  # a resume asks again
    code, _, err = cli(capsys, "down", "forced")
    assert code == 0, err
    assert emu.ledger.alive() == set()
