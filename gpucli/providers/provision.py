"""Create a pod and wait until SSH answers, without ever leaving a paid pod behind.

The loop the launcher drives, kept here so both clouds share one audited copy:

1. create on the next offer (bounded number of offers);
2. hand the id to ``on_created`` *before* waiting, so a crash during the wait still knows the pod;
3. wait with a ``time.monotonic()`` deadline for RUNNING + an SSH endpoint + an SSH banner, trying each
   of the pod's SSH routes (vast: direct, then proxy) with a bounded banner wait and keeping the one
   that answers;
4. read back the billed $/h right after create: a pod billed more than ``PRICE_TOLERANCE`` above its
   quote is terminated before anything is set up on it and the next offer is tried (``keep_overpriced``:
   ``--force`` keeps it);
5. on a dead state, a vanished pod or the deadline: terminate it (idempotent) and try the next offer;
6. when a create answer was lost, look the pod up by its label before creating another one;
7. if every offer failed, sweep the label once more so nothing this attempt created stays up.

Only pods carrying this launch's label are ever terminated, so a retry never touches anything else.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gpucli.errors import NoCapacityError, ProviderError
from gpucli.providers.api import (
    CreateAnswerLost,
    Instance,
    InstanceNotFound,
    LaunchSpec,
    Offer,
    Provider,
    SpotRefusedError,
    SshRoute,
)
from gpucli.providers.credentials import MissingKeyError
from gpucli.providers.http import AuthError, QuotaExceededError

log = logging.getLogger(__name__)

# No other offer would fare better: a refused key, no quota, or a provider that refuses spot
# altogether (trying more offers would only repeat it; on-demand is never tried silently).
_FATAL = (AuthError, MissingKeyError, QuotaExceededError, SpotRefusedError)


@dataclass(frozen=True)
class Attempt:
    """What happened to one offer: the pod id (if any) and one clear reason."""

    offer_id: str | None
    instance_id: str | None
    ok: bool
    reason: str


#: A pod billed more than this fraction above its quote is not used (issue: "the price is what is billed").
PRICE_TOLERANCE = 0.05
#: How long a running pod may publish no SSH port before it is given up. Full SSH needs "an instance
#: that supports a public IP address" (runpod/docs pods/configuration/use-ssh.mdx L110) and REST v2 has
#: no filter for one (``supportPublicIp`` is gone: runpod-plugins-official runpod-migrate
#: breaking-changes.md, Class 3), so a Community host without one runs and never exposes 22/tcp.
#: Waiting the whole ``--ready-timeout`` for it, three times, bills three pods for nothing.
UNEXPOSED_GRACE_S = 180.0
UNEXPOSED_REASON = "running without a public SSH port"


@dataclass(frozen=True)
class ProvisionResult:
    instance: Instance
    attempts: tuple[Attempt, ...]
    billed_usd_per_hour: float | None = None  # what the provider says the pod bills, read after create
    quoted_usd_per_hour: float | None = None


def quote_of(offer: Offer | None, spec: LaunchSpec) -> float | None:
    """What the offer was quoted at for this launch: the bid (plus storage) for spot, else the price."""
    if offer is None:
        return None
    if spec.spot and spec.bid_per_hour_usd is not None:
        return spec.bid_per_hour_usd + offer.storage_usd_per_hour
    return offer.price_per_hour_usd


def billed_price(provider: Provider, inst: Instance) -> float | None:
    """The pod's billed $/h: from the create answer, else one ``get`` (None when the provider says nothing)."""
    if inst.price_per_hour_usd:
        return inst.price_per_hour_usd
    try:
        return provider.get(inst.instance_id).price_per_hour_usd or None
    except ProviderError as exc:
        log.info("could not read the billed price of %s: %s", inst.instance_id, exc)
        return None


class ProvisionFailed(ProviderError):
    """No offer produced a reachable pod; every pod this attempt created has been terminated."""

    def __init__(self, message: str, attempts: Sequence[Attempt], *, left_running: Sequence[str] = ()) -> None:
        hint = "try other offers, a higher bid, or a longer --ready-timeout"
        if left_running:
            hint = "could not terminate " + ", ".join(left_running) + ": end them in the provider console"
        super().__init__(message, hint=hint)
        self.attempts = tuple(attempts)
        self.left_running = tuple(left_running)


def ssh_banner_check(inst: Instance, timeout_s: float = 3.0) -> bool:
    """True when something at the SSH endpoint speaks SSH (reads the ``SSH-`` banner)."""
    if not inst.ssh_host or not inst.ssh_port:
        return False
    try:
        with socket.create_connection((inst.ssh_host, inst.ssh_port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def provision_with_retries(
    provider: Provider,
    spec: LaunchSpec,
    offers: Sequence[Offer | None] = (None,),
    *,
    on_created: Callable[[Instance], None] = lambda inst: None,
    on_event: Callable[[str], None] = lambda msg: None,
    ready_timeout_s: float = 600.0,
    poll_interval_s: float = 5.0,
    max_offers: int = 3,
    ssh_check: Callable[[Instance], bool] | None = ssh_banner_check,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    keep_overpriced: bool = False,
    unexposed_grace_s: float = UNEXPOSED_GRACE_S,
    cancelled: Callable[[], bool] = lambda: False,
) -> ProvisionResult:
    """Create a pod from the first workable offer and return it once SSH answers.

    ``offers`` are tried in order (at most ``max_offers``); ``None`` means "use ``spec`` as given"
    (RunPod picks the machine itself). ``on_created`` receives each new pod before any wait.
    Raises ``ProvisionFailed`` listing one reason per attempt; auth, missing-key and quota errors
    are raised at once because no other offer would fare better.
    """
    attempts: list[Attempt] = []
    left_running: list[str] = []
    created_ids: list[str] = []
    unexposed_clouds: set[str] = set()  # clouds whose hosts ran without a public SSH port: not tried again
    for offer in list(offers)[: max(1, max_offers)]:
        if cancelled():
            _end_cancelled(provider, spec.label, created_ids, on_event, sleep, left_running)
        if offer is not None and offer.cloud_type in unexposed_clouds:
            attempts.append(Attempt(offer.offer_id, None, False, f"skipped: a {offer.cloud_type} pod ran "
                                                                 "without a public SSH port"))
            on_event(attempts[-1].reason)
            continue
        this_spec = spec if offer is None else replace(
            spec, offer_id=offer.offer_id, gpu_name=offer.gpu_name,
            cloud_type=offer.cloud_type if spec.network_volume_id is None else spec.cloud_type,
            data_center_id=spec.data_center_id if spec.network_volume_id else offer.data_center_id)
        offer_id = None if offer is None else offer.offer_id
        inst: Instance | None = None
        try:
            inst = provider.create(this_spec)
        except CreateAnswerLost as exc:
            on_event(f"create answer lost ({exc.message}); looking for the pod by label {spec.label}")
            try:
                inst = provider.find_by_label(spec.label)
            except _FATAL:
                raise
            except ProviderError as find_exc:
                inst = None
                on_event(f"label lookup failed: {find_exc.message}")
            if inst is None:
                attempts.append(Attempt(offer_id, None, False, "create answer lost and no pod carries the label"))
                continue
            if inst.instance_id in created_ids:
                inst = None
                attempts.append(Attempt(offer_id, None, False, "create answer lost; only an older pod found"))
                continue
        except NoCapacityError as exc:
            attempts.append(Attempt(offer_id, None, False, f"no capacity: {exc.message}"))
            on_event(attempts[-1].reason)
            continue
        except _FATAL:
            raise
        except ProviderError as exc:
            attempts.append(Attempt(offer_id, None, False, f"create failed: {exc.message}"))
            on_event(attempts[-1].reason)
            continue

        created_ids.append(inst.instance_id)
        on_created(inst)
        quote = quote_of(offer, this_spec)
        billed = billed_price(provider, inst)
        if billed is not None and quote and billed > quote * (1 + PRICE_TOLERANCE):
            reason = f"billed ${billed:.4f}/h, more than 5% above the quote ${quote:.4f}/h"
            if not keep_overpriced:
                attempts.append(Attempt(offer_id, inst.instance_id, False, reason))
                on_event(f"pod {inst.instance_id}: {reason}; terminating it before setup (--force keeps it)")
                if not _terminate(provider, inst.instance_id, sleep):
                    left_running.append(inst.instance_id)
                continue
            on_event(f"pod {inst.instance_id}: {reason}; kept (--force)")
        elif billed is not None:
            on_event(f"pod {inst.instance_id} bills ${billed:.4f}/h (quote ${quote or 0:.4f}/h)")
        on_event(f"created {provider.name} pod {inst.instance_id}; waiting up to {ready_timeout_s:.0f} s for SSH")
        ready, reason = _wait_ready(provider, inst, ready_timeout_s, poll_interval_s, ssh_check, clock, sleep,
                                    on_event, unexposed_grace_s=unexposed_grace_s, cancelled=cancelled)
        if reason == CANCELLED or (ready is not None and cancelled()):
            _end_cancelled(provider, spec.label, created_ids, on_event, sleep, left_running)
        if ready is None and reason.startswith(UNEXPOSED_REASON) and offer is not None and offer.cloud_type:
            unexposed_clouds.add(offer.cloud_type)
        if ready is not None:
            attempts.append(Attempt(offer_id, inst.instance_id, True, "ready"))
            # A create whose answer was lost earlier may have made a pod after all; only one is kept.
            _sweep_label(provider, spec.label, keep=ready.instance_id, on_event=on_event, sleep=sleep,
                         left_running=left_running)
            return ProvisionResult(ready, tuple(attempts), billed_usd_per_hour=billed or ready.price_per_hour_usd,
                                   quoted_usd_per_hour=quote)
        attempts.append(Attempt(offer_id, inst.instance_id, False, reason))
        on_event(f"pod {inst.instance_id}: {reason}; terminating it")
        if not _terminate(provider, inst.instance_id, sleep):
            left_running.append(inst.instance_id)

    # Sweep: a pod whose create answer was lost may have appeared since; it carries our label.
    _sweep_label(provider, spec.label, keep=None, on_event=on_event, sleep=sleep, left_running=left_running)
    reasons = "; ".join(f"{a.offer_id or 'offer'}: {a.reason}" for a in attempts) or "no offers to try"
    raise ProvisionFailed(f"could not get a reachable {provider.name} pod ({reasons})", attempts,
                          left_running=left_running)


class ProvisionCancelled(ProviderError):
    """The run was ended (``gpucli down``) while its launch was creating or waiting for a pod."""


CANCELLED = "the run was ended while its pod was starting"


def _end_cancelled(provider: Provider, label: str, created_ids: list[str], on_event: Callable[[str], None],
                   sleep: Callable[[float], None], left_running: list[str]) -> None:
    """The run was ended elsewhere (``gpucli down``) during the launch: end every pod this launch made
    (each id, then the label), create nothing more, and raise."""
    for pod_id in created_ids:
        if not _terminate(provider, pod_id, sleep):
            left_running.append(pod_id)
    _sweep_label(provider, label, keep=None, on_event=on_event, sleep=sleep, left_running=left_running)
    left = f"; still running: {', '.join(left_running)} (end them by hand)" if left_running else ""
    raise ProvisionCancelled(f"the run was ended (gpucli down) while its pod was starting: the launch ended "
                             f"every pod it had created{left}")


def _sweep_label(provider: Provider, label: str, *, keep: str | None, on_event: Callable[[str], None],
                 sleep: Callable[[float], None], left_running: list[str]) -> None:
    """Terminate every pod carrying ``label`` except ``keep``; failures go to ``left_running``."""
    try:
        for stray in provider.list_instances():
            if stray.label == label and stray.instance_id != keep and stray.instance_id not in left_running:
                on_event(f"terminating stray pod {stray.instance_id} labelled {label}")
                if not _terminate(provider, stray.instance_id, sleep):
                    left_running.append(stray.instance_id)
    except ProviderError as exc:
        on_event(f"could not list pods to sweep strays: {exc.message}")


def _wait_ready(provider: Provider, inst: Instance, timeout_s: float, poll_s: float,
                ssh_check: Callable[[Instance], bool] | None, clock: Callable[[], float],
                sleep: Callable[[float], None], on_event: Callable[[str], None] = lambda msg: None,
                *, unexposed_grace_s: float = UNEXPOSED_GRACE_S,
                cancelled: Callable[[], bool] = lambda: False) -> tuple[Instance | None, str]:
    deadline = clock() + timeout_s
    unexposed_since: float | None = None
    last = inst
    silent: list[SshRoute] = []  # routes that gave no banner yet: tried after the others
    while True:
        if cancelled():
            return None, CANCELLED
        try:
            last = provider.get(inst.instance_id)
        except InstanceNotFound:
            return None, "the pod disappeared while starting"
        except _FATAL:
            raise
        except ProviderError as exc:  # transient API trouble: keep polling until the deadline
            log.info("polling %s: %s", inst.instance_id, exc)
        else:
            if last.state.is_dead:
                return None, f"pod went {last.state.value} ({last.raw_status})"
            if last.ssh_unexposed:
                unexposed_since = clock() if unexposed_since is None else unexposed_since
                if clock() - unexposed_since >= unexposed_grace_s:
                    return None, f"{UNEXPOSED_REASON} after {unexposed_grace_s:.0f} s (a host without a public IP)"
            else:
                unexposed_since = None
            if last.ssh_ready:
                if ssh_check is None:
                    return last, "ready"
                found = _answering_route(last, ssh_check, silent, on_event)
                if found is not None:
                    return found, "ready"
        if clock() >= deadline:
            if silent:
                tried = ", ".join(str(r) for r in silent)
                return None, f"no SSH banner within {timeout_s:.0f} s on any route ({tried})"
            return None, f"not reachable over SSH within {timeout_s:.0f} s (last: {last.raw_status})"
        sleep(min(poll_s, max(0.0, deadline - clock())))


def _answering_route(inst: Instance, ssh_check: Callable[[Instance], bool], silent: list[SshRoute],
                     on_event: Callable[[str], None]) -> Instance | None:
    """``inst`` through the first of its SSH routes that speaks SSH, or None. Each try is bounded
    (``ssh_banner_check``'s timeout); a route that gave no banner is tried after the others on later
    polls, and named once. The returned Instance's ``ssh_host``/``ssh_port`` are the route that
    answered: the launch records it, so every later SSH use (sync, status, fetch-best, watch, down)
    goes the same way."""
    routes = inst.routes()
    ordered = [r for r in routes if r not in silent] + [r for r in routes if r in silent]
    for route in ordered:
        if ssh_check(inst.via(route)):
            if route != routes[0]:
                on_event(f"SSH answers on the {route} route ({routes[0]} gave no SSH banner); using it")
            return inst.via(route)
        if route not in silent:
            silent.append(route)
            if len(routes) > 1:
                on_event(f"no SSH banner on the {route} route yet")
    return None


def _terminate(provider: Provider, instance_id: str, sleep: Callable[[float], None], tries: int = 3) -> bool:
    for n in range(tries):
        try:
            provider.terminate(instance_id)
            return True
        except ProviderError as exc:
            log.warning("terminate %s failed (%s), try %d/%d", instance_id, exc, n + 1, tries)
            sleep(0.05 * (n + 1))
    return False
