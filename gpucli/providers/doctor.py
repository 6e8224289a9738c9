"""`gpucli doctor`: read-only checks a user runs before the first real launch.

Nothing here creates, rents, registers or spends anything: every call is a GET or a GraphQL query
(RunPod: the key is checked against REST v2 ``GET /v2/pods``, the balance is GraphQL ``myself`` because
v2 has none, the SSH keys are ``GET /v2/account/ssh-keys``; vast ``GET /api/v0/users/current`` and
``GET /api/v0/ssh/``). The report also lists which API and version each provider call goes through
(the provider's ``API_CALLS``), so the calls left on an API about to be retired are visible. Each check ends in
one :class:`Check` whose ``detail`` is safe to print (keys are never part of it); the caller renders.

How a failed API check is told apart: :class:`~gpucli.providers.http.NetworkError` (no connection was
ever made: no network, a proxy, a wrong base URL) is "no network"; :class:`~gpucli.providers.http.AuthError`
(HTTP 401/403) is "key refused"; any other provider error after the bounded retries is "provider down".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpucli.errors import ProviderError
from gpucli.providers.clients import get_provider
from gpucli.providers.credentials import MissingKeyError, resolve_key
from gpucli.providers.http import AuthError, HttpClient, NetworkError, RetryPolicy

#: Few, quick retries: a doctor should answer in seconds, not wait out a long outage.
DOCTOR_POLICY = RetryPolicy(max_attempts=2, base_delay_s=0.2, max_delay_s=1.0, deadline_s=20.0)

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"


@dataclass(frozen=True)
class Check:
    """One line of the report: ``status`` is ok / warn / fail / info."""

    subject: str  # "API key", "API", "balance", "SSH key", "Telegram"
    status: str
    detail: str


@dataclass(frozen=True)
class DoctorReport:
    """Every check of one subject (a provider name, or "notifications")."""

    subject: str
    checks: tuple[Check, ...]

    @property
    def failed(self) -> bool:
        return any(c.status == FAIL for c in self.checks)


def _api_problem(exc: ProviderError, service: str) -> Check:
    if isinstance(exc, NetworkError):
        return Check("API", FAIL, f"no network: {exc.message}")
    if isinstance(exc, AuthError):
        return Check("API", FAIL, f"key refused: {exc.message}")
    return Check("API", FAIL, f"{service} down or failing: {exc.message}")


def check_provider(name: str, *, public_key: str | None, key_path: str,
                   provider_factory: Callable[..., object] | None = None) -> DoctorReport:
    """Key, reachability, balance and SSH key of provider ``name``. ``public_key`` is gpucli's key
    (None when it does not exist yet); ``key_path`` is where it lives, for the message."""
    factory = provider_factory or get_provider
    checks: list[Check] = []
    try:
        key = resolve_key(name)
    except MissingKeyError as exc:
        return DoctorReport(name, (Check("API key", FAIL, str(exc)),))
    checks.append(Check("API key", OK, f"from {key.source}"))
    provider = factory(name, policy=DOCTOR_POLICY)
    service = getattr(provider, "service", name)
    verify = getattr(provider, "verify_key", None)
    try:
        where = verify() if verify is not None else None
        balance = provider.balance_usd() if verify is None else None  # type: ignore[attr-defined]
    except ProviderError as exc:
        checks.append(_api_problem(exc, service))
        return DoctorReport(name, tuple(checks))
    base = getattr(getattr(provider, "http", None), "base_url", "")
    checks.append(Check("API", OK, f"reachable at {base}; the key is accepted" + (f" by {where}" if where else "")))
    if verify is not None:
        try:
            balance = provider.balance_usd()  # type: ignore[attr-defined]
        except ProviderError as exc:
            checks.append(Check("balance", WARN, f"could not read it: {exc.message}"))
            balance = float("nan")
    if balance is None:
        checks.append(Check("balance", INFO, "the API does not report it"))
    elif balance == balance:  # not NaN (already reported)
        status = OK if balance > 0 else WARN
        checks.append(Check("balance", status, f"${balance:,.2f}"))
    checks.append(_ssh_check(provider, name, public_key, key_path))
    calls = getattr(provider, "API_CALLS", ())
    if calls:
        checks.append(Check("calls", INFO, "; ".join(f"{what}: {api}" for what, api in calls)))
    if name == "runpod":
        # No RunPod source says REST v2 takes the pod-scoped RUNPOD_API_KEY (environment-variables.mdx
        # L89 only names it); GraphQL is rate-limited and retires in early 2027 (release-notes.mdx).
        checks.append(Check("pod key", INFO, "a pod ends itself (watchdog, boot guard) with its own "
                            "RUNPOD_API_KEY: REST v2 first, which no RunPod source documents for that key, then "
                            "GraphQL (rate-limited, retired early 2027); a run's watchdog.json `ended_by` says "
                            "which worked: check it on your first pod (docs/clouds.md)"))
    return DoctorReport(name, tuple(checks))


def _ssh_check(provider: object, name: str, public_key: str | None, key_path: str) -> Check:
    if not public_key:
        return Check("SSH key", INFO, f"gpucli has no SSH key yet; the first launch creates {key_path}")
    try:
        has = provider.account_has_ssh_key(public_key)  # type: ignore[attr-defined]
    except ProviderError as exc:
        return Check("SSH key", WARN, f"{key_path}; could not read the account's keys: {exc.message}")
    if name == "runpod":
        where = "also on the account" if has else "not on the account (not needed)"
        return Check("SSH key", OK, f"{key_path}; sent to each pod as PUBLIC_KEY/SSH_PUBLIC_KEY; {where}")
    if has:
        return Check("SSH key", OK, f"{key_path}; registered on the account")
    if has is None:
        return Check("SSH key", INFO, f"{key_path}; the account's keys could not be read")
    return Check("SSH key", INFO, f"{key_path}; not on the account yet: the first launch registers it")


def check_telegram(token: str | None, source: str | None, api_base: str) -> Check:
    """Whether the bot token is accepted (Telegram ``getMe``; read-only). The token stays in the path
    of one request and never in the message."""
    if not token:
        return Check("Telegram", INFO, "no bot token set (notifications off)")
    client = HttpClient(api_base, api_key=None, service="Telegram", policy=DOCTOR_POLICY)
    try:
        resp = client.request("POST", f"/bot{token}/getMe", json_body={}, idempotent=True, what="getMe")
    except NetworkError as exc:
        return Check("Telegram", FAIL, f"no network: {exc.message}")
    except AuthError:
        return Check("Telegram", FAIL, f"bot token from {source} refused")
    except ProviderError as exc:
        return Check("Telegram", WARN, f"could not check the token: {exc.message}")
    finally:
        client.close()
    if resp.status == 401:
        return Check("Telegram", FAIL, f"bot token from {source} refused (HTTP 401)")
    if resp.ok:
        return Check("Telegram", OK, f"bot token from {source} accepted")
    return Check("Telegram", WARN, f"could not confirm the token from {source} (HTTP {resp.status})")
