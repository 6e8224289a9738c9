"""One launch across providers: every offer of the named clouds ranked on what the run will cost, tried
in order until one runs (``--provider any``, ``--provider runpod,vast``).

The ranking is the one ``gpucli plan --live`` and a one-provider launch use for offers of one GPU: each
provider's own search and filters (``CloudTarget.choose_offers``: the profile's GPU count, the driver's
CUDA, ``--query``, vast's reliability floor), each offer priced on the whole run
(``run_cost``: the planned hours at its $/h, disks included, plus the bandwidth it bills), merged
cheapest first. All offers are of the profile's GPU, so the planned hours are the same on each.

One attempt is the launch as a single provider does it, held to one offer: create, the pod's id recorded
before any wait, reachable by ``--ready-timeout``, set up, preflight (gpucli/run/life/lifecycle.py). An attempt
that fails on the machine (no capacity, never reachable, a preflight below the health bars, a host
that drops the connection) is ended by the launch's own clean-up, and the next one starts only when the
provider says its pod is gone; a machine that failed its health check is avoided for a week
(gpucli/run/host/avoid.py). A failure the next machine would repeat (a bad option, the run's own
configuration failing its steps, a refused key) ends the launch at once. ``--retry-until-up`` searches
again after a bounded wait once every offer has failed, until its deadline (monotonic).

With ``--nodes N`` an option is N machines rented as one (a RunPod Instant Cluster, N vast.ai instances
on one overlay: gpucli/run/life/failnodes.py), quoted on the whole run on every node, and tried by the same
loop; a failed attempt ends everything it rented, and the next starts once its provider says so.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucli.errors import ConnectionFailed, GpucliError, NoCapacityError, ProviderError, UsageError
from gpucli.providers.cloudtarget import run_cost
from gpucli.providers.credentials import MissingKeyError, resolve_key
from gpucli.providers.provision import ProvisionCancelled, ProvisionFailed
from gpucli.providers.registry import get_target, target_names
from gpucli.run.host import avoid
from gpucli.run.inputs.launch import resolve
from gpucli.run.life import failnodes, lifecycle
from gpucli.run.starting import preflight
from gpucli.run.starting.preflight import PreflightFailed
from gpucli.runs import records as runs
from gpucli.runs.notice import Notice, NoticeFn, StepFn

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog
    from gpucli.providers.api import Offer
    from gpucli.run.inputs.launch import LaunchRequest
    from gpucli.run.starting.jobs import Job
    from gpucli.runs.records import RunRecord

ANY = "any"
#: Preflight stages that measure the machine, not the run's configuration: below the bars there, another
#: machine may pass (gpucli/runs/health.py, trainer/preflight.py). "start": no verdict at all (a stuck host).
MACHINE_STAGES = preflight.MACHINE_STAGES | {"start"}
#: Your own ``--preflight`` command failing is tried on this many machines in all: once on a second
#: machine (a bad GPU or driver fails it too), never more (failing on two, it is the command, and every
#: further machine would be paid for the same answer). Its host is not avoided: it may be the command.
OWN_PREFLIGHT_MACHINES = 2
OFFERS_PER_PROVIDER = 10
BACKOFF_S = (30.0, 60.0, 120.0, 300.0)  # --retry-until-up: the waits between searches, the last repeated


def clouds() -> list[str]:
    return [n for n in target_names() if get_target(n).cloud]


def asked(provider: str | None) -> list[str] | None:
    """The providers of ``--provider any`` or a list (``runpod,vast``); None for one provider."""
    text = (provider or "").strip().lower()
    if text == ANY:
        return clouds()
    if "," not in text:
        return None
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    for name in names:
        if not get_target(name).cloud:  # an unknown name says which there are
            raise UsageError(f"--provider {provider}: {name} rents nothing", hint="list clouds: runpod,vast")
    return names


def keyed(names: list[str]) -> list[str]:
    """Those of ``names`` whose API key is set (gpucli keys, the environment, the providers' own files)."""
    found = []
    for name in names:
        try:
            resolve_key(name)
        except MissingKeyError:
            continue
        found.append(name)
    return found


NO_KEY_HINT = "run `gpucli keys set runpod` or `gpucli keys set vast`, or set RUNPOD_API_KEY or VAST_API_KEY"


@dataclass(frozen=True)
class Candidate:
    provider: str
    offer: Offer
    hourly_usd: float
    cost_usd: float  # the whole run on this offer: planned hours at its $/h plus the bandwidth it bills
    nodes: failnodes.NodesOption | None = None  # --nodes N: the N machines this option rents as one

    @property
    def offer_id(self) -> str:
        return self.nodes.option_id if self.nodes is not None else str(self.offer.offer_id)

    @property
    def label(self) -> str:
        return self.nodes.label if self.nodes is not None else f"offer {self.offer.offer_id}"

    @property
    def what(self) -> str:
        one = f"{self.offer.gpu_count}x {self.offer.gpu_name}"
        return f"{len(self.nodes.offers)} x {one}" if self.nodes is not None else one

    def request(self, req: LaunchRequest) -> LaunchRequest:
        return self.nodes.request(req) if self.nodes is not None else dataclasses.replace(req, provider=self.provider)


@dataclass(frozen=True)
class Ranking:
    candidates: tuple[Candidate, ...]
    hours: float | None  # the run's planned hours (at most --hours)
    notes: tuple[str, ...] = ()  # providers that offered nothing, and why
    priced: tuple[str, ...] = ()  # how an option was priced where its own plan says nothing (--nodes N)

    def quote(self) -> str:
        """The first choice in one line: offer, provider, $/h, planned hours and dollars."""
        if not self.candidates:
            return "no offer"
        c = self.candidates[0]
        hours = f"{self.hours:.1f} h" if self.hours else "hours unknown (priced on 1 h)"
        more = f"; {len(self.candidates) - 1} more offers if it fails" if len(self.candidates) > 1 else ""
        return (f"{c.what} on {c.provider} ({c.label}), "
                f"${c.hourly_usd:.3f}/h, {hours}, ${c.cost_usd:.2f} planned{more}")

    def to_json(self, providers: list[str]) -> dict[str, Any]:
        """What a dry run shows: every offer in the order it would be tried, and the providers' notes."""
        return {"providers": providers, "hours": self.hours, "notes": list(self.notes) + list(self.priced),
                "offers": [{"provider": c.provider, "offer": c.offer_id, "gpu": c.offer.gpu_name,
                            "gpus": c.offer.gpu_count, "nodes": len(c.nodes.offers) if c.nodes else 1,
                            "label": c.label, "usd_per_hour": round(c.hourly_usd, 4),
                            "run_usd": round(c.cost_usd, 4)} for c in self.candidates]}


def rank(catalog: Catalog, req: LaunchRequest, job: Job, names: list[str], *, run_name: str) -> Ranking:
    """Every named provider's offers for the run, cheapest run first (nothing is created)."""
    if req.nodes > 1:  # a rule: several machines are offered as clusters or overlays, not as pods
        return _rank_nodes(catalog, req, job, names, run_name=run_name)
    found: list[Candidate] = []
    notes: list[str] = []
    hours = None
    for name in names:
        target = get_target(name)
        try:
            one = dataclasses.replace(req, provider=name).checked()
            resolved = resolve(catalog, job.request(one), run_name=run_name)
            if resolved.gpu_id is None:
                raise UsageError(f"profile {req.profile} has no GPU; cloud pods need a GPU profile")
            ask = lifecycle.offer_ask(one, resolved)
            hours = ask.hours
            offers = target.choose_offers(catalog, resolved.gpu_id, resolved.n_gpus, spot=req.spot,
                                          limit=OFFERS_PER_PROVIDER, disk_gb=req.disk_gb or resolved.pod_disk_gb,
                                          hours=ask.hours, transfer_gb=ask.transfer_gb, query=req.query)
        except (ProviderError, NoCapacityError) as exc:  # a missing key, nothing offered, an API down
            notes.append(f"{name}: {exc}")
            continue
        for o in offers:
            hourly = (o.spot_price_per_hour_usd + o.storage_usd_per_hour) if req.spot and o.spot_price_per_hour_usd \
                else o.price_per_hour_usd
            found.append(Candidate(name, o, hourly, run_cost(o, spot=req.spot, hours=ask.hours,
                                                             transfer_gb=ask.transfer_gb)))
    found.sort(key=lambda c: c.cost_usd)
    return Ranking(tuple(found), hours, tuple(notes))


def _rank_nodes(catalog: Catalog, req: LaunchRequest, job: Job, names: list[str], *, run_name: str) -> Ranking:
    """``--nodes N``: each provider's options of N machines rented as one (gpucli/run/life/failnodes.py),
    cheapest run first. The planned hours depend on the link between the machines; a provider whose link
    is not known (so neither are its hours) is priced on the longest plan of the others."""
    asks, notes, priced = [], [], []
    for name in names:
        try:
            one = dataclasses.replace(req, provider=name).checked()
            resolved = resolve(catalog, job.request(one), run_name=run_name)
        except (ProviderError, NoCapacityError) as exc:
            notes.append(f"{name}: {exc}")
            continue
        asks.append((name, one, resolved, lifecycle.offer_ask(one, resolved)))
    known = [ask.hours for *_, ask in asks if ask.hours]
    longest = max(known) if known else None
    found: list[Candidate] = []
    for name, one, resolved, ask in asks:
        try:
            found.extend(Candidate(name, o.offers[0], o.hourly_usd, o.cost_usd, o) for o in failnodes.options(
                catalog, one, resolved, hours=ask.hours or longest, transfer_gb=ask.transfer_gb,
                limit=OFFERS_PER_PROVIDER))
        except (ProviderError, NoCapacityError) as exc:  # a missing key, no N machines as one, an API down
            notes.append(f"{name}: {str(exc).splitlines()[0]}")
            continue
        if not ask.hours and longest:
            priced.append(f"{name}: its hours for {req.nodes} nodes are not planned (the link between its machines "
                         f"is not known); priced on the longest plan of the others, {longest:.2f} h")
    found.sort(key=lambda c: c.cost_usd)
    return Ranking(tuple(found), longest, tuple(notes), tuple(priced))


@dataclass(frozen=True)
class Tried:
    """One attempt, as its line and the record keep it."""

    provider: str
    offer_id: str
    host: str | None
    ok: bool
    reason: str
    seconds: float
    cost_usd: float
    label: str = ""  # --nodes N: what the option rents ("overlay of 2 instances on cluster 501")

    @property
    def line(self) -> str:
        verdict = "running" if self.ok else self.reason
        return (f"attempt on {self.provider} {self.label or 'offer ' + self.offer_id}: {verdict} "
                f"({self.seconds:.0f} s, ${self.cost_usd:.4f})")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class AllOffersFailed(ProviderError):
    """Every offer failed (and ``--retry-until-up``, if given, ran out); nothing is left running."""


def _retriable(exc: BaseException) -> tuple[bool, bool]:
    """(try the next offer, avoid this host) for an attempt's failure."""
    if isinstance(exc, ProvisionCancelled):
        return False, False
    if isinstance(exc, ProvisionFailed):
        return not exc.left_running, False  # a pod that would not end: nothing more is created
    if isinstance(exc, PreflightFailed):
        stage = exc.preflight.stage if exc.preflight is not None else None
        return stage in MACHINE_STAGES, stage in MACHINE_STAGES
    if isinstance(exc, (NoCapacityError, *failnodes.RENT_FAILED)):  # RENT_FAILED: all of it ended (failnodes.py)
        return True, False
    if isinstance(exc, ConnectionFailed):  # the host dropped us during setup: a flaky machine
        return True, True
    return False, False


def _own_preflight(exc: BaseException) -> bool:
    """Your own ``--preflight`` command failed (not a health bar of gpucli's, not the trainer's check)."""
    return isinstance(exc, PreflightFailed) and exc.preflight is not None and exc.preflight.stage == "command"


def _confirm_gone(name: str) -> None:
    """The failed attempt's pod is gone by its provider's word, or the launch stops here."""
    try:
        record = runs.load(name)
    except GpucliError:
        return
    if record.nodes:  # a run over several machines: its cluster, or its instances and their overlay
        failnodes.confirm_gone(record)
        return
    if not record.instance_id:
        return
    target = get_target(record.provider)
    state = target.pod_state(record)
    if state is not None and state.state != "gone":
        target.terminate(record)  # raises TerminatePending when the provider does not confirm it
        state = target.pod_state(record)
        if state is not None and state.state != "gone":
            raise ProviderError(f"{record.provider} pod {record.instance_id} is still {state.state}",
                                hint="end it with `gpucli down " + name + "`; no other offer was tried")


def _cost(name: str, seconds: float) -> float:
    try:
        record = runs.load(name)
    except GpucliError:
        return 0.0
    if not record.instance_id or not record.price_per_hour_usd:
        return 0.0
    return round(record.price_per_hour_usd * seconds / 3600.0, 6)


def launch_across(catalog: Catalog, req: LaunchRequest, job: Job, names: list[str], *, name: str,
                  ranking: Ranking | None = None, retry_until_s: float | None = None,
                  on_step: StepFn, on_notice: NoticeFn, clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> RunRecord:
    """Launch run ``name`` (reserved by the caller) on the first offer of ``names`` that works."""
    deadline = clock() + retry_until_s if retry_until_s else None
    tried: list[Tried] = []
    first_job, searches, own_failed = True, 0, 0
    info: StepFn = lambda text: on_notice(Notice("info", text))  # noqa: E731
    while True:
        ranking = ranking or rank(catalog, req, job, names, run_name=name)
        searches += 1
        for note in ranking.notes:
            info(f"skipping {note}")
        for note in ranking.priced:
            info(note)
        table = avoid.load()
        for cand in ranking.candidates:
            bad = next((b for o in (cand.nodes.offers if cand.nodes else (cand.offer,))
                        if (b := avoid.avoided(o, table)) is not None), None)
            if bad is not None:
                info(f"skipping {cand.provider} {cand.label}: host {bad.key} failed its health "
                     f"check ({bad.why}); avoided until {time.strftime('%Y-%m-%d', time.localtime(bad.until))}")
                continue
            if deadline is not None and searches > 1 and clock() >= deadline:
                break
            one = cand.request(req)
            started = clock()
            on_step(f"trying {cand.provider} {cand.label}: {cand.what} at ${cand.hourly_usd:.3f}/h "
                    f"(run ${cand.cost_usd:.2f})")
            try:  # --nodes N: the option's request holds the attempt to it (failnodes.NodesOption.request)
                prepared = lifecycle.prepare(catalog, one, run_name=name, job=job if first_job else job.again(),
                                             offer_id=None if cand.nodes else cand.offer.offer_id)
                first_job = False
                record = lifecycle.launch(prepared, on_step=on_step, on_notice=on_notice)
            except BaseException as exc:
                go_on, bad_host = _retriable(exc) if isinstance(exc, GpucliError) else (False, False)
                if _own_preflight(exc):
                    own_failed += 1
                    go_on = own_failed < OWN_PREFLIGHT_MACHINES
                    if go_on:
                        info(f"your --preflight failed on {cand.provider} {cand.label}; trying it "
                             f"on one more machine (failing there too, it is the command, not the machine)")
                seconds = clock() - started
                reason = str(exc).splitlines()[0][:300] if isinstance(exc, GpucliError) else type(exc).__name__
                tried.append(Tried(cand.provider, cand.offer_id, avoid.host_key(cand.offer), False, reason,
                                   round(seconds, 1), _cost(name, seconds), cand.label if cand.nodes else ""))
                on_step(tried[-1].line)
                _keep(name, tried)
                _confirm_gone(name)  # raises when a pod would not end: nothing more is created
                if bad_host and cand.nodes is None and (key := avoid.host_key(cand.offer)):  # N nodes: which one?
                    avoid.add(key, reason[:200])
                    info(f"host {key} avoided for 7 days (GPUCLI_HOME/avoid.json)")
                if not go_on:
                    raise
                continue
            seconds = clock() - started
            tried.append(Tried(cand.provider, cand.offer_id, avoid.host_key(cand.offer), True, "running",
                               round(seconds, 1), _cost(name, seconds), cand.label if cand.nodes else ""))
            on_step(tried[-1].line)
            return _keep(name, tried) or record
        ranking = None
        if deadline is None or clock() >= deadline:
            break
        wait = min(BACKOFF_S[min(searches - 1, len(BACKOFF_S) - 1)], max(0.0, deadline - clock()))
        info(f"every offer failed; searching again in {wait:.0f} s (--retry-until-up: "
             f"{max(0.0, deadline - clock()) / 60:.1f} min left)")
        sleep(wait)
        if clock() >= deadline:
            break
    spent = sum(t.cost_usd for t in tried)
    said = "; ".join(f"{t.provider} {t.offer_id}: {t.reason}" for t in tried[-4:]) or "no offer to try"
    raise AllOffersFailed(f"no offer on {', '.join(names)} gave a working machine after {len(tried)} attempts "
                          f"(${spent:.4f} spent, nothing left running): {said}",
                          hint="--retry-until-up 2h keeps searching; `gpucli offers` shows what is listed")


def _keep(name: str, tried: list[Tried]) -> RunRecord | None:
    """The attempts into the run's record (the winner's record names its provider)."""
    try:
        record = runs.load(name)
    except GpucliError:
        return None
    record = record.with_(attempts=tuple(t.to_json() for t in tried))
    runs.save(record)
    return record


def parse_duration(text: str) -> float:
    """``30m``, ``2h``, ``90s``, ``1d`` or plain seconds -> seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value:
        raise UsageError(f"--retry-until-up takes a duration such as 30m or 2h, got '{text}'")
    return value
