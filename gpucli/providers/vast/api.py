"""vast.ai over its REST API, with plain ``requests`` (no SDK: see providers.md §3).

Facts this relies on (providers.md §2): Bearer auth; search is ``POST /api/v0/bundles/`` with the body
:meth:`gpucli.providers.query.Query.to_vast_body` builds; create is ``PUT /api/v0/asks/{offer_id}/`` and a bid
goes in ``price`` (omitting it silently rents on-demand, vast-cli#403, so a spot spec always sends
it); a too-low bid can answer with an error that still carries ``new_contract`` - that contract is
destroyed at once; one instance is ``GET /api/v0/instances/{id}/`` (``{"instances": obj|null}``); the
collection is ``GET /api/v1/instances/`` paged by ``next_token`` (v0 is reported to answer 410);
destroy is ``DELETE /api/v0/instances/{id}/`` where ``no_such_instance`` means already gone; ``ports``
is a Docker map whose ``HostPort`` is a string.

SSH (vast-ai/vast-cli:vastai/cli/commands/instances.py ``get_runtype``): the official CLI sends
``runtype: "ssh_direc ssh_proxy"`` for direct SSH, so the instance has both a direct route
(``public_ipaddr`` + ``ports["22/tcp"]``) and the proxy route (``ssh_host``/``ssh_port``, e.g.
``ssh5.vast.ai``, a different host and port); gpucli keeps both (``Instance.ssh_routes``), tries direct
first and falls back to the proxy when direct is unmapped or gives no SSH banner. When direct SSH is wanted the search asks for ``direct_port_count >= 1`` (the docs'
hello-world.mdx example; dstack's vastai/compute.py does the same). The key: new instances take the
account's SSH keys (``POST /api/v0/ssh/``, vastai/api/keys.py ``create_ssh_key``; guides ssh.mdx), so
gpucli registers its key on the account first (only if absent) and also attaches it to the instance
(``POST /api/v0/instances/{id}/ssh/``, ``attach_ssh``). No source says whether an attach works while
the instance is still loading, so a failed attach is retried on later polls, never a reason to destroy.

Price (vastai/api/offers.py, cli/commands/offers.py ``--storage``): ``allocated_storage`` is the disk
used for pricing, so the search sends the launch's disk and the quoted ``dph_total`` includes storage.
Bids send ``cancel_unavail`` (vastai/api/instances.py ``create_instance``) so a bid that cannot be
scheduled is cancelled instead of leaving a stopped, storage-billed instance. Balance: ``credit`` of
``GET /api/v0/users/current`` (vastai/api/billing.py ``show_user``).
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Mapping
from typing import Any

from gpucli.errors import NoCapacityError, ProviderError, UsageError
from gpucli.providers.api import (
    DEFAULT_LAUNCH_DISK_GB,
    LABEL_PREFIX,
    Billed,
    Contract,
    CreateAnswerLost,
    Instance,
    InstanceNotFound,
    InstanceState,
    LaunchSpec,
    Offer,
    SshRoute,
)
from gpucli.providers.credentials import vast_base_url
from gpucli.providers.http import AuthError, HttpResponse, NetworkError, RequestMaybeSent
from gpucli.providers.httpapi import ApiProvider
from gpucli.providers.query import Query, as_number, parse_query
from gpucli.providers.vast.bill import MAX_PAGES as MAX_CHARGE_PAGES
from gpucli.providers.vast.bill import billed_in, charges_params
from gpucli.providers.vast.contract import PENDING_PATH, contract_of
from gpucli.providers.vast.words import GONE, instance_answer

log = logging.getLogger(__name__)

SERVICE = "vast.ai"
MAX_LIST_PAGES = 200  # 25 per page: 5000 instances is far beyond any account gpucli serves

_NO_CAPACITY_ERRORS = {"no_such_ask", "ask_not_available", "no_longer_available"}
_NO_CAPACITY_PHRASES = ("no longer any instances available", "no longer available", "not available",
                        "already rented", "no_such_ask")
_STATES = {
    "running": InstanceState.RUNNING,
    "loading": InstanceState.PENDING,
    "created": InstanceState.PENDING,
    "scheduling": InstanceState.PENDING,
    "connecting": InstanceState.PENDING,
    "exited": InstanceState.EXITED,
    "stopped": InstanceState.STOPPED,
    "frozen": InstanceState.STOPPED,
    "offline": InstanceState.FAILED,
    "unknown": InstanceState.UNKNOWN,
}


class VastProvider(ApiProvider):
    """vast.ai instances. Offers come from the live marketplace; a bid is always explicit."""

    name = "vast"
    service = SERVICE
    #: Every call gpucli makes to vast.ai and the API it goes through (``gpucli doctor`` prints it).
    API_CALLS = (
        ("offers", "REST v0 POST /api/v0/bundles/"), ("create", "REST v0 PUT /api/v0/asks/{id}/"),
        ("status", "REST v0 GET /api/v0/instances/{id}/"), ("list", "REST v1 GET /api/v1/instances/"),
        ("stop/start", "REST v0 PUT /api/v0/instances/{id}/ {state: stopped|running}"),
        ("terminate", "REST v0 DELETE /api/v0/instances/{id}/"),
        ("SSH keys", "REST v0 GET/POST /api/v0/ssh/, POST /api/v0/instances/{id}/ssh/"),
        ("balance", "REST v0 GET /api/v0/users/current"),
        ("rental terms", "REST v0 GET /api/v0/instances/pending-price-increases/ (shown, never accepted)"),
        ("charges", "REST v0 GET /api/v0/charges/ (compute, storage, bandwidth per instance)"),
        ("overlays", "REST v0 POST /api/v0/bundles/ (cluster_id), POST/GET/PUT/DELETE /api/v0/overlay/"),
        ("pod watchdog", "REST v0 PUT/DELETE /api/v0/instances/{id}/ with the instance key"),
        ("boot guard", "instance key, onstart at every container start: REST v0 DELETE /api/v0/instances/{id}/ "
                       "(its own launch) or PUT {state: stopped} (a restart)"),
    )

    def __init__(self, *, direct_ssh: bool = True, runtype: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.direct_ssh = direct_ssh
        # As the official CLI builds it: both routes with --direct, the proxy alone otherwise.
        self.runtype = runtype or ("ssh_direc ssh_proxy" if direct_ssh else "ssh_proxy")
        self._pending_attach: dict[str, str] = {}  # instance id -> key still to attach
        self._last_public_key: str | None = None

    def default_base_url(self) -> str:
        return vast_base_url()

    # -- offers ------------------------------------------------------------------------------------
    def search_offers(self, query: Query | None = None, *, spot: bool = False, limit: int = 50,
                      order: str = "dph_total", disk_gb: float | None = None) -> list[Offer]:
        q = query if query is not None else parse_query(None)
        storage = float(disk_gb) if disk_gb is not None else float(DEFAULT_LAUNCH_DISK_GB)
        if not storage > 0 or storage != storage or storage == float("inf"):
            raise UsageError(f"disk must be a positive number of GB, got {disk_gb!r}")
        body = q.to_vast_body(order=order, type="bid" if spot else "on-demand", limit=limit or None,
                              allocated_storage=storage)
        if self.direct_ssh and "direct_port_count" not in body:
            body["direct_port_count"] = {"gte": 1}
        resp = self.http.request("POST", "/api/v0/bundles/", json_body=body, idempotent=True,
                                 what="search offers")
        _raise_for_error(resp, what="search offers")
        offers = resp.body.get("offers") if isinstance(resp.body, Mapping) else None
        if isinstance(offers, Mapping):  # the docs' YAML example shows an object; real answers a list
            offers = list(offers.values())
        parsed = [parse_offer({**o, "allocated_storage": storage}) for o in offers or [] if isinstance(o, Mapping)]
        return [o for o in parsed if o is not None][: max(0, limit)]

    # -- account SSH keys --------------------------------------------------------------------------
    def _account_keys(self) -> list[str]:
        resp = self.http.request("GET", "/api/v0/ssh/", what="show ssh keys")
        if resp.status == 404 and "no ssh keys" in _error_text(resp).lower():
            return []  # documented: 404 "No SSH keys found" on an account with none (show_ssh_keys.yaml L54)
        _raise_for_error(resp, what="show ssh keys")
        return parse_account_keys(resp.body)

    def account_has_ssh_key(self, public_key: str) -> bool | None:
        return _same_key_in(public_key, self._account_keys())

    def ensure_account_ssh_key(self, public_key: str) -> bool:
        """Register ``public_key`` on the account unless it is there. Returns True when it added it."""
        if _same_key_in(public_key, self._account_keys()):
            return False
        resp = self.http.request("POST", "/api/v0/ssh/", json_body={"ssh_key": public_key.strip()},
                                 idempotent=False, what="create ssh key")
        _raise_for_error(resp, what="create ssh key")
        return True

    def billed(self, instance_id: str, since_epoch_s: float) -> Billed | None:
        """``GET /api/v0/charges/``: the instance's charges, bandwidth included (gpucli/providers/vast/bill.py)."""
        token: str | None = None
        for _ in range(MAX_CHARGE_PAGES):
            resp = self.http.request("GET", "/api/v0/charges/", params=charges_params(since_epoch_s, after_token=token),
                                     what="show charges")
            _raise_for_error(resp, what="show charges")
            found, token = billed_in(resp.body, _safe_id(instance_id))
            if found is not None or not token:
                return found
        return None

    def contract(self, instance_id: str) -> Contract | None:
        """The rental's end date and a price increase its host asks (gpucli/providers/vast/contract.py)."""
        resp = self.http.request("GET", f"/api/v0/instances/{_safe_id(instance_id)}/", params={"owner": "me"},
                                 what="show instance")
        inst = resp.body.get("instances") if resp.ok and isinstance(resp.body, Mapping) else None
        pending = self.http.request("GET", PENDING_PATH, what="show pending price increases")
        return contract_of(inst, pending.body if pending.ok else None, instance_id)

    def balance_usd(self) -> float | None:
        resp = self.http.request("GET", "/api/v0/users/current", what="show user")
        _raise_for_error(resp, what="show user")
        return as_number(resp.body.get("credit")) if isinstance(resp.body, Mapping) else None

    # -- lifecycle ---------------------------------------------------------------------------------
    def create(self, spec: LaunchSpec) -> Instance:
        if not spec.offer_id:
            raise UsageError("vast.ai needs an offer id to rent (search offers first)")
        pub = spec.ssh_public_key.strip()
        self._last_public_key = pub
        try:
            if self.ensure_account_ssh_key(pub):
                log.info("registered gpucli's SSH key on the vast.ai account")
        except (AuthError, NetworkError):
            raise
        except ProviderError as exc:  # the per-instance attach below is the second path
            log.warning("could not register the SSH key on the vast.ai account: %s", exc.message)
        body: dict[str, Any] = {
            "client_id": "me",
            "image": spec.image,
            "disk": spec.disk_gb,
            "label": spec.label,
            "runtype": self.runtype,
            "env": {str(k): str(v) for k, v in spec.env.items()},
            # A third path for images whose sshd starts from onstart: the key goes in at start.
            "onstart": "mkdir -p ~/.ssh && chmod 700 ~/.ssh && echo " + shlex.quote(pub)
                       + " >> ~/.ssh/authorized_keys && chmod 600 ~/.ssh/authorized_keys"
                       # the boot guard (gpucli/providers/bootguard.py), then the run's own start hook: a
                       # container vast starts again resumes the run
                       + (f"; {spec.boot_guard}" if spec.boot_guard else "")
                       + (f"; {spec.onstart}" if spec.onstart else ""),
        }
        if spec.spot:
            body["price"] = spec.bid_per_hour_usd  # never omitted: omitting it rents on-demand
            body["cancel_unavail"] = True  # an unschedulable bid is cancelled, not left stopped
        path = f"/api/v0/asks/{_safe_id(spec.offer_id)}/"
        try:
            resp = self.http.request("PUT", path, json_body=body, idempotent=False, what="create instance")
        except RequestMaybeSent as exc:
            raise CreateAnswerLost(f"vast.ai create: {exc.message}", label=spec.label) from None
        data = resp.body if isinstance(resp.body, Mapping) else {}
        contract = data.get("new_contract")
        if not resp.ok or data.get("success") is False or not contract:
            if contract:
                # e.g. a bid below the floor: vast may create the instance stopped *and* report an
                # error. Destroy that contract now so nothing is left behind.
                log.warning("vast.ai create failed but made contract %s; destroying it", contract)
                self._best_effort_terminate(str(contract))
            raise _create_error(resp)
        instance_id = str(contract)
        self._pending_attach[instance_id] = pub
        self._try_attach(instance_id)
        return Instance(provider=self.name, instance_id=instance_id, label=spec.label,
                        state=InstanceState.PENDING, ssh_host=None, ssh_port=None, ssh_user=self.ssh_user,
                        price_per_hour_usd=spec.bid_per_hour_usd, gpu_name=spec.gpu_name,
                        gpu_count=spec.gpu_count, raw_status="created")

    def attach_ssh_key(self, instance_id: str, public_key: str) -> None:
        """``POST /api/v0/instances/{id}/ssh/``: puts gpucli's key on one existing instance."""
        resp = self.http.request("POST", f"/api/v0/instances/{_safe_id(instance_id)}/ssh/",
                                 json_body={"ssh_key": public_key.strip()}, idempotent=True,
                                 what="attach ssh key")
        _raise_for_error(resp, what="attach ssh key")

    def _try_attach(self, instance_id: str) -> bool:
        """One attach attempt for a pending key; a failure is logged and retried on a later poll."""
        pub = self._pending_attach.get(instance_id)
        if pub is None:
            return True
        try:
            self.attach_ssh_key(instance_id, pub)
        except (AuthError, NetworkError):
            raise
        except ProviderError as exc:
            log.info("attaching the SSH key to vast.ai instance %s failed (%s); retrying later",
                     instance_id, exc.message)
            return False
        self._pending_attach.pop(instance_id, None)
        return True

    def find_by_label(self, label: str) -> Instance | None:
        found = super().find_by_label(label)
        if found is not None and self._last_public_key and found.instance_id not in self._pending_attach:
            # A lost create answer: the instance exists but never got the per-instance attach.
            self._pending_attach[found.instance_id] = self._last_public_key
            self._try_attach(found.instance_id)
        return found

    def get(self, instance_id: str) -> Instance:
        resp = self.http.request("GET", f"/api/v0/instances/{_safe_id(instance_id)}/",
                                 params={"owner": "me"}, what="show instance")
        # Gone on vast's words for it only; its 404 ``auth_error`` (a revoked key) never gets here: the
        # HTTP helper raises AuthError for it (gpucli/providers/vast/words.py).
        if instance_answer(resp.status, resp.body) == GONE:
            raise InstanceNotFound(f"vast.ai has no instance {instance_id}")
        _raise_for_error(resp, what="show instance")
        inst = resp.body.get("instances") if isinstance(resp.body, Mapping) else None
        if not isinstance(inst, Mapping):
            raise InstanceNotFound(f"vast.ai has no instance {instance_id}")
        if "id" not in inst:
            inst = {**inst, "id": instance_id}
        found = parse_instance(inst, ssh_user=self.ssh_user)
        if instance_id in self._pending_attach and found.state is InstanceState.RUNNING:
            self._try_attach(instance_id)
        return found

    def list_instances(self) -> list[Instance]:
        out: list[Instance] = []
        token: str | None = None
        for _ in range(MAX_LIST_PAGES):
            params: dict[str, Any] = {"limit": 25}
            if token:
                params["after_token"] = token
            resp = self.http.request("GET", "/api/v1/instances/", params=params, what="show instances")
            _raise_for_error(resp, what="show instances")
            body = resp.body
            if not resp.ok or not isinstance(body, Mapping) or not isinstance(body.get("instances"), list):
                # Never "no instances" from an answer that is not the documented list.
                raise ProviderError(f"vast.ai show instances: HTTP {resp.status} without the documented "
                                    f"instances list ({_error_text(resp)})")
            for item in body["instances"]:
                if isinstance(item, Mapping):
                    inst = parse_instance(item, ssh_user=self.ssh_user)
                    if inst.label and inst.label.startswith(LABEL_PREFIX):
                        out.append(inst)
            token = body.get("next_token") or None
            if not token:
                break
        return out

    def terminate(self, instance_id: str) -> None:
        resp = self.http.request("DELETE", f"/api/v0/instances/{_safe_id(instance_id)}/",
                                 what="destroy instance")
        # Gone only on vast's own words for it (``not_found`` "Instance not found", destroy_instance.yaml
        # L64-78, or ``no_such_instance``; gpucli/providers/vast/words.py): a bare 404 (a wrong URL, a proxy)
        # proves nothing. Done only on ``{"success": true}`` (vast-cli destroy_instance reads it): a 200
        # that is not JSON is a failure, retried and reported, never "terminated".
        if instance_answer(resp.status, resp.body) == GONE:
            log.info("vast.ai instance %s already gone", instance_id)
            return
        _raise_unless_success(resp, what="destroy instance")

    def stop(self, instance_id: str) -> None:
        resp = self.http.request("PUT", f"/api/v0/instances/{_safe_id(instance_id)}/",
                                 json_body={"state": "stopped"}, idempotent=True, what="stop instance")
        if instance_answer(resp.status, resp.body) == GONE:
            raise InstanceNotFound(f"vast.ai has no instance {instance_id}")
        _raise_unless_success(resp, what="stop instance")

    def start(self, instance_id: str) -> None:
        """``PUT /api/v0/instances/{id}/ {"state": "running"}`` (manage_instance.yaml; vast-cli
        start_instance): a stopped instance starts again on its machine, its onstart with it."""
        resp = self.http.request("PUT", f"/api/v0/instances/{_safe_id(instance_id)}/",
                                 json_body={"state": "running"}, idempotent=True, what="start instance")
        if _error_code(resp) == "no_such_instance":
            raise InstanceNotFound(f"vast.ai has no instance {instance_id}")
        _raise_unless_success(resp, what="start instance")

    def _best_effort_terminate(self, instance_id: str) -> None:
        try:
            self.terminate(instance_id)
        except ProviderError as exc:
            log.error("could not destroy vast.ai instance %s: %s; destroy it by hand", instance_id, exc)


# ---------------------------------------------------------------------------------------------------
# Parsing: the only place vast.ai's raw dicts are read.

def _safe_id(value: str) -> str:
    text = str(value)
    if not text.isdigit():
        raise UsageError(f"'{text}' is not a vast.ai id (digits only)")
    return text


def _error_code(resp: HttpResponse) -> str | None:
    body = resp.body
    return str(body.get("error")) if isinstance(body, Mapping) and body.get("error") else None


def _error_text(resp: HttpResponse) -> str:
    body = resp.body
    if isinstance(body, Mapping):
        for key in ("msg", "message", "error"):
            if body.get(key):
                return str(body[key])
    return " ".join((resp.text or "").split())[:200] or f"HTTP {resp.status}"


def _raise_for_error(resp: HttpResponse, *, what: str) -> None:
    body = resp.body
    if resp.ok and not (isinstance(body, Mapping) and body.get("success") is False):
        return
    raise ProviderError(f"vast.ai {what} failed: {_error_text(resp)} (HTTP {resp.status})")


def _raise_unless_success(resp: HttpResponse, *, what: str) -> None:
    """A 2xx whose JSON says ``"success": true``; anything else (HTML, empty, false) is a failure."""
    body = resp.body
    if resp.ok and isinstance(body, Mapping) and body.get("success") is True:
        return
    if resp.ok:
        raise ProviderError(f"vast.ai {what}: HTTP {resp.status} without the documented success answer "
                            f"({_error_text(resp)})", hint="the instance may still bill: gpucli retries it")
    raise ProviderError(f"vast.ai {what} failed: {_error_text(resp)} (HTTP {resp.status})")


def _create_error(resp: HttpResponse) -> ProviderError:
    code = _error_code(resp) or ""
    text = _error_text(resp)
    if code in _NO_CAPACITY_ERRORS or any(p in text.lower() for p in _NO_CAPACITY_PHRASES):
        return NoCapacityError(f"vast.ai offer is no longer available: {text}",
                               hint="search again; marketplace offers change by the minute")
    if code == "invalid_price":
        return ProviderError(f"vast.ai refused the bid: {text}", hint="raise the bid above min_bid")
    return ProviderError(f"vast.ai create failed: {text} (HTTP {resp.status})")


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def parse_account_keys(body: Any) -> list[str]:
    """The account's public keys from ``GET /api/v0/ssh/``. The SDK types the answer as a list of
    dicts (vastai/sdk.py ``show_ssh_keys``) without naming the key field, so any string value that
    looks like an OpenSSH key is taken; a wrapping object is unwrapped."""
    if isinstance(body, Mapping):
        body = next((v for v in body.values() if isinstance(v, list)), [])
    keys: list[str] = []
    for item in body if isinstance(body, list) else []:
        values = item.values() if isinstance(item, Mapping) else [item]
        keys += [v for v in values if isinstance(v, str) and v.strip().startswith(("ssh-", "ecdsa-", "sk-"))]
    return keys


def _same_key_in(public_key: str, lines: list[str]) -> bool:
    want = public_key.split()[:2]
    return any(line.split()[:2] == want for line in lines)


def parse_offer(item: Mapping[str, Any]) -> Offer | None:
    """One ``offers`` entry -> Offer (None when it lacks an id, a GPU count or a price)."""
    offer_id = item.get("id") if item.get("id") is not None else item.get("ask_contract_id")
    count = item.get("num_gpus")
    price = as_number(item.get("dph_total"))
    if offer_id is None or not isinstance(count, int) or count < 1 or price is None:
        return None
    gpu_ram_mb = as_number(item.get("gpu_ram")) or 0.0
    verification = item.get("verification")
    verified = item.get("verified")
    if not isinstance(verified, bool):
        verified = (verification == "verified") if isinstance(verification, str) else None
    return Offer(
        provider="vast", offer_id=str(offer_id), gpu_name=str(item.get("gpu_name") or "?"), gpu_count=count,
        vram_gb_per_gpu=round(gpu_ram_mb / 1024.0, 3), price_per_hour_usd=price,
        price_per_gpu_hour_usd=price / count, spot_price_per_hour_usd=as_number(item.get("min_bid")),
        reliability=as_number(item.get("reliability2")) if item.get("reliability") is None else as_number(item.get("reliability")),
        inet_down_mbps=as_number(item.get("inet_down")), inet_up_mbps=as_number(item.get("inet_up")),
        location=_opt_str(item.get("geolocation")), dlperf=as_number(item.get("dlperf")),
        cuda_max=as_number(item.get("cuda_max_good")), cuda_version=_cuda_text(item.get("cuda_max_good")),
        disk_gb=as_number(item.get("disk_space")),
        gpu_display_name=_opt_str(item.get("gpu_name")), machine_id=_opt_str(item.get("machine_id")),
        host_id=_opt_str(item.get("host_id")), verified=verified,
        # $/GB for data reaching the host (our uploads) and leaving it (checkpoints home): "Charges apply
        # per byte ... can significantly impact total costs" (vast-ai/docs guides/instances/pricing.mdx
        # L70; fields inet_up_cost/inet_down_cost in search_offers.yaml L144-148).
        inet_up_usd_per_gb=as_number(item.get("inet_up_cost")),
        inet_down_usd_per_gb=as_number(item.get("inet_down_cost")),
        # On a bid the hourly storage is billed on top of it (gpuhunt vastai.py: min_bid + disk x
        # storage_cost / 720): kept here so the spot quote adds it.
        storage_usd_per_hour=_storage_per_hour(item),
    )


def _storage_per_hour(item: Mapping[str, Any]) -> float:
    cost, disk = as_number(item.get("storage_cost")), as_number(item.get("allocated_storage"))
    return 0.0 if cost is None or disk is None else cost * disk / 720.0


def parse_instance(inst: Mapping[str, Any], *, ssh_user: str = "root") -> Instance:
    """One instance object -> Instance. Direct SSH (public IP + mapped 22/tcp) is tried before the proxy."""
    actual = inst.get("actual_status")
    status_msg = str(inst.get("status_msg") or "")
    if actual is None:
        state = InstanceState.PENDING  # being provisioned
    else:
        state = _STATES.get(str(actual).lower(), InstanceState.UNKNOWN)
    if "oci runtime create failed" in status_msg.lower():  # never recovers (dstack's reading)
        state = InstanceState.FAILED
    words = (inst.get("cur_state"), inst.get("intended_status"), inst.get("next_state"))
    if all(w == "stopped" for w in words):
        state = InstanceState.STOPPED  # outbid or interrupted (dstack's reading)
    routes = _ssh_routes(inst)
    count = inst.get("num_gpus")
    raw = f"actual_status={actual}"
    if inst.get("intended_status") is not None:
        raw += f" intended_status={inst.get('intended_status')}"
    if status_msg:
        raw += f" status_msg={status_msg[:120]!r}"
    return Instance(
        provider="vast", instance_id=str(inst.get("id")), label=_opt_str(inst.get("label")), state=state,
        ssh_host=routes[0].host if routes else None, ssh_port=routes[0].port if routes else None, ssh_user=ssh_user,
        price_per_hour_usd=as_number(inst.get("dph_total")),
        gpu_name=_opt_str(inst.get("gpu_name")), gpu_count=count if isinstance(count, int) else None,
        raw_status=raw, stopped_usd_per_month=_stopped_storage(inst), ssh_routes=routes,
    )


def _ssh_routes(inst: Mapping[str, Any]) -> tuple[SshRoute, ...]:
    """Both SSH routes, direct first: "If the machine supports open ports our system will try to setup
    both a direct ssh connection and a backup proxy connection" (vast-ai/docs
    guides/instances/connect/overview.mdx L45-46; ssh.mdx L140-145: proxy works on all machines, direct
    is faster). A direct port can accept TCP and never answer (a host's firewall), so the readiness
    wait (gpucli.providers.provision) tries each in turn and keeps the one that speaks SSH."""
    routes: list[SshRoute] = []
    ports = inst.get("ports")
    if isinstance(ports, Mapping) and inst.get("public_ipaddr"):
        mapping = ports.get("22/tcp")
        if isinstance(mapping, list) and mapping and isinstance(mapping[0], Mapping):
            host_port = mapping[0].get("HostPort")
            if host_port is not None and str(host_port).isdigit():
                routes.append(SshRoute(str(inst["public_ipaddr"]).strip(), int(str(host_port)), "direct"))
    if inst.get("ssh_host") and isinstance(inst.get("ssh_port"), int | str) and str(inst.get("ssh_port")).isdigit():
        routes.append(SshRoute(str(inst["ssh_host"]), int(str(inst["ssh_port"])), "proxy"))
    return tuple(routes)


def _stopped_storage(inst: Mapping[str, Any]) -> float | None:
    """What a stopped instance keeps billing per month: its disk at ``storage_cost`` $/GB/month (vast
    bills storage on stopped instances, "typically higher for stopped": guides/instances/pricing.mdx
    L62-65; the stopped premium is not in the API, so this is a floor)."""
    cost, disk = as_number(inst.get("storage_cost")), as_number(inst.get("disk_space"))
    return None if cost is None or disk is None else cost * disk


def _cuda_text(value: Any) -> str | None:
    """vast's ``cuda_max_good`` is a JSON number ("Maximum supported CUDA version", search_offers.yaml
    L134-136; 12.8 in its answers): "12.8" as text."""
    number = as_number(value)
    return f"{number:g}" if number is not None else None
