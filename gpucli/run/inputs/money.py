"""The balance guard: before renting, the provider's account must hold what the run may cost.

"What the run may cost" is ``--budget`` when given (the trainer and the pod's watchdog stop the run
there), else the planner's estimate. A provider that does not report a balance (or cannot be asked
just now) is not guarded: the create call that follows says what is wrong. ``--force`` skips it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gpucli.errors import ExitCode, GpucliError, ProviderError

if TYPE_CHECKING:
    from gpucli.providers.target import Target
    from gpucli.run.inputs.launch import ResolvedLaunch

log = logging.getLogger(__name__)


class BalanceTooLowError(GpucliError):
    """The account's balance is below what the run may cost; nothing was rented."""

    exit_code = ExitCode.MONEY


def needed_usd(resolved: ResolvedLaunch) -> tuple[float, str] | None:
    """What the run may cost, and what that number is; None when neither is known."""
    if resolved.limits.budget_usd is not None:
        return float(resolved.limits.budget_usd), "--budget"
    if resolved.planned.cost_usd is not None:
        return float(resolved.planned.cost_usd), "the planned cost"
    return None


def balance_guard(target: Target, resolved: ResolvedLaunch, *, force: bool = False) -> float | None:
    """Refuse (:class:`BalanceTooLowError`, one line with the numbers) when the provider reports a
    balance below what the run may cost, unless ``force``. Returns the balance read (None: none)."""
    if not target.cloud or force:
        return None
    need = needed_usd(resolved)
    if need is None:
        return None
    try:
        balance = target.balance_usd()
    except ProviderError as exc:
        log.warning("could not read the %s balance (%s); not checked", target.name, exc)
        return None
    if balance is None:
        return None
    amount, what = need
    if balance < amount:
        raise BalanceTooLowError(
            f"{target.name} balance ${balance:.2f} is below {what} ${amount:.2f}: not renting",
            hint="add credit, lower --budget, or pass --force to launch anyway")
    return balance
