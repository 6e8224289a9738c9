"""The one HTTP helper every provider client uses: timeouts, bounded retries, rate limits, no key leaks.

Why one helper: retry policy is where money is lost or saved. Retrying a read is always safe;
retrying a *create* after the request may have reached the server can rent a second paid pod. So the
helper retries idempotent calls on 429, 5xx and connection errors, but for a non-idempotent call it
retries only when the server provably did not act (HTTP 429, or a connection that was never made),
and otherwise raises :class:`RequestMaybeSent` so the caller can look the pod up by its label.

Rate limits: ``Retry-After`` is honoured in seconds or as an HTTP date (vast.ai's docs say it is
never sent, its newer SDK honours it anyway); 429 bodies may be plain text ("API requests too
frequent"); vast's daily search quota (``search_quota_exceeded``) is reported as such and never
retried, because it resets at UTC midnight.

``requests`` is imported lazily so that ``gpucli --help`` does not pay for it.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from gpucli import __version__
from gpucli.errors import NoCapacityError, ProviderError
from gpucli.providers.vast.words import is_auth_answer

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

#: Sent on every request. Cloudflare in front of RunPod's API answers Python's default agent
#: (``Python-urllib/3.x``, ``python-requests/x``) with 403 "error 1010" (reported by users of RunPod's
#: REST API, lumpenspace/raft#14); the official clients send their own name too (runpod/runpodctl:
#: internal/api/client.go ``buildUserAgent``). The pod-side watchdog must send the same value.
USER_AGENT = f"gpucli/{__version__}"


class AuthError(ProviderError):
    """HTTP 401/403 (vast: also 404 ``auth_error``): the key is wrong or lacks permission. ``status``
    and ``detail`` (the answer, shortened; never the key) let a caller whose provider gives a status
    another meaning on one route read it that way (RunPod createPod 403: see :class:`PoolRefusedError`)."""

    def __init__(self, message: str, *, hint: str | None = None, status: int | None = None,
                 detail: str = "") -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.detail = detail


class RateLimitError(ProviderError):
    """Still rate limited (HTTP 429) after the bounded retries, or asked to wait past the deadline."""


class QuotaExceededError(RateLimitError):
    """vast.ai's daily search quota is used up; it resets at UTC midnight. Never retried."""


class PoolRefusedError(NoCapacityError):
    """RunPod ``createPod`` HTTP 403: "Your account cannot access the requested pool. | Skip this
    candidate, keep going." (runpod/docs api-reference-v2/openapi.json, createPod's error table). That
    offer is closed to this account, the key is fine: the next offer is tried."""


class NetworkError(ProviderError):
    """The provider could not be reached at all (DNS, refused or timed-out connections): no network,
    a proxy, or a wrong base URL - not a provider that answered with an error."""


class RequestMaybeSent(ProviderError):
    """A non-idempotent request may have reached the server, but no answer came back."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: at most ``max_attempts`` tries and ``deadline_s`` seconds in total.

    The delay before retry *n* (0-based) is ``min(max_delay_s, base_delay_s * 2**n)`` scaled by a
    random factor in ``[1 - jitter, 1]`` so that many clients do not retry in lockstep; a
    ``Retry-After`` header replaces it (capped at ``max_retry_after_s``).
    """

    max_attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    deadline_s: float = 120.0
    jitter: float = 0.5
    max_retry_after_s: float = 60.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The default policy, with ``GPUCLI_HTTP_BACKOFF_S`` overriding the base delay.

        The override exists for end-to-end tests against the emulators (so a fault-laden launch
        retries in milliseconds); users have no reason to set it.
        """
        raw = os.environ.get("GPUCLI_HTTP_BACKOFF_S")
        if not raw:
            return cls()
        try:
            base = max(0.0, float(raw))
        except ValueError:
            return cls()
        return cls(base_delay_s=base, max_delay_s=max(base * 8, base), max_retry_after_s=max(base * 8, base))

    def backoff_s(self, attempt: int, rng: random.Random) -> float:
        delay = min(self.max_delay_s, self.base_delay_s * (2 ** attempt))
        return delay * (1.0 - self.jitter * rng.random())


@dataclass(frozen=True)
class HttpResponse:
    """A provider answer: status, parsed JSON (or None) and the text (for plain-text errors)."""

    status: int
    body: Any
    text: str
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def parse_retry_after(value: str | None, *, now: Callable[[], datetime] | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date; None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    current = now() if now else datetime.now(timezone.utc)
    return max(0.0, (when - current).total_seconds())


def is_search_quota_exceeded(body: Any, text: str) -> bool:
    if isinstance(body, Mapping) and body.get("error") == "search_quota_exceeded":
        return True
    return "search_quota_exceeded" in (text or "")


class HttpClient:
    """A small JSON client bound to one base URL and one key.

    ``sleep``, ``clock`` and ``rng`` are injectable so tests run retries in milliseconds and
    deterministically. The key goes only into the ``Authorization`` header; it is never logged, never
    put in a URL and never part of an error message or ``repr``.
    """

    def __init__(self, base_url: str, *, api_key: str | None, service: str,
                 connect_timeout_s: float = 10.0, read_timeout_s: float = 60.0,
                 policy: RetryPolicy | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 user_agent: str = USER_AGENT) -> None:
        self.base_url = base_url.rstrip("/")
        self.service = service  # "RunPod" / "vast.ai", for messages
        self._api_key = api_key
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.policy = policy or RetryPolicy.from_env()
        self._sleep = sleep
        self._clock = clock
        self._rng = rng or random.Random()
        self._user_agent = user_agent
        self._session: Any = None

    def __repr__(self) -> str:
        return f"<HttpClient {self.service} {self.base_url} key={'set' if self._api_key else 'none'}>"

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def _get_session(self) -> Any:
        if self._session is None:
            import requests  # lazy: keeps CLI start-up fast

            self._session = requests.Session()
        return self._session

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self._user_agent}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def request(self, method: str, path: str, *, json_body: Any = None,
                params: Mapping[str, Any] | None = None, idempotent: bool | None = None,
                what: str | None = None) -> HttpResponse:
        """Send one logical request with bounded retries; returns any non-retryable answer.

        ``idempotent`` defaults to True for GET/DELETE/HEAD and False otherwise. 401/403 raise
        :class:`AuthError`; 429 and 5xx are retried and raise :class:`RateLimitError` /
        ``ProviderError`` when retries run out; other 4xx answers are returned for the caller to
        interpret (``no_such_instance`` and friends are not errors for every caller).
        """
        import requests  # lazy: requests costs ~0.1 s of start-up

        method = method.upper()
        if idempotent is None:
            idempotent = method in ("GET", "DELETE", "HEAD")
        what = what or f"{method} {path}"
        url = self.base_url + path
        start = self._clock()
        deadline = start + self.policy.deadline_s
        attempt = 0
        last_problem = ""
        never_connected = False
        while True:
            wait: float | None = None
            try:
                resp = self._get_session().request(
                    method, url, json=json_body, params=params, headers=self._headers(),
                    timeout=(self.connect_timeout_s, self.read_timeout_s))
            except requests.exceptions.RequestException as exc:
                sent = _maybe_sent(exc)
                last_problem = f"{type(exc).__name__}"
                never_connected = not sent
                log.info("%s %s: %s (attempt %d)", self.service, what, last_problem, attempt + 1)
                if sent and not idempotent:
                    raise RequestMaybeSent(
                        f"{self.service} {what}: the connection failed after the request was sent "
                        f"({type(exc).__name__}); it may have been carried out") from None
            else:
                never_connected = False
                text = resp.text or ""
                body = _json_or_none(text)
                log.debug("%s %s -> HTTP %d", self.service, what, resp.status_code)
                status = resp.status_code
                if status == 403 and "1010" in text:
                    raise ProviderError(f"{self.service} refused gpucli's User-Agent (HTTP 403, Cloudflare "
                                        "error 1010)", hint="a proxy or old gpucli may be rewriting it")
                if is_auth_answer(status, body):  # vast answers a revoked key 404 auth_error (vastwords.py)
                    raise AuthError(f"{self.service} rejected the API key (HTTP {status})",
                                    hint=f"check it with `gpucli keys set {self.service_key_name}`",
                                    status=status, detail=_short(text))
                if status == 429 and is_search_quota_exceeded(body, text):
                    raise QuotaExceededError(
                        f"{self.service} daily search quota exceeded; it resets at UTC midnight",
                        hint="wait until then, or use cached/catalogue prices")
                if status not in RETRY_STATUSES:
                    return HttpResponse(status, body, text, dict(resp.headers))
                if status != 429 and not idempotent:
                    # A 5xx on a create may come from a proxy after the backend acted: ambiguous.
                    raise RequestMaybeSent(f"{self.service} {what}: HTTP {status}; the request may have "
                                           "been carried out")
                last_problem = f"HTTP {status}" + (f" ({_short(text)})" if status == 429 and text else "")
                if status == 429:
                    retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                    if retry_after is not None:
                        if retry_after > self.policy.max_retry_after_s or \
                                self._clock() + retry_after > deadline:
                            raise RateLimitError(
                                f"{self.service} is rate limiting gpucli and asks to wait "
                                f"{retry_after:.0f} s", hint="try again later")
                        wait = retry_after
            attempt += 1
            if attempt >= self.policy.max_attempts:
                break
            if wait is None:
                wait = self.policy.backoff_s(attempt - 1, self._rng)
            if self._clock() + wait > deadline:
                break
            self._sleep(wait)
        if never_connected:
            raise NetworkError(f"could not reach {self.service} at {self.base_url} ({last_problem} after "
                               f"{attempt} tries)", hint="check the network connection, proxy or base URL")
        if last_problem.startswith("HTTP 429"):
            raise RateLimitError(f"{self.service} kept answering {last_problem} after {attempt} tries",
                                 hint="wait a minute and try again")
        raise ProviderError(f"{self.service} {what} failed after {attempt} tries: {last_problem}",
                            hint=f"{self.service} may be down; try again later")

    @property
    def service_key_name(self) -> str:
        low = self.service.lower()
        return "runpod" if "runpod" in low else "telegram" if "telegram" in low else "vast"


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_or_none(text: str) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _maybe_sent(exc: BaseException) -> bool:
    """False only when the request provably never reached the server (connect refused/timed out)."""
    import requests  # lazy: requests costs ~0.1 s of start-up

    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return False
    if isinstance(exc, requests.exceptions.ConnectionError):
        seen: set[int] = set()
        cur: BaseException | None = exc
        while cur is not None and id(cur) not in seen:
            seen.add(id(cur))
            name = type(cur).__name__
            if name in ("NewConnectionError", "ConnectTimeoutError", "NameResolutionError"):
                return False
            reason = getattr(cur, "reason", None)
            if isinstance(reason, BaseException):
                cur = reason
                continue
            args0 = cur.args[0] if cur.args and isinstance(cur.args[0], BaseException) else None
            cur = args0 or cur.__cause__ or cur.__context__
        return True
    return True
