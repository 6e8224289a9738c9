"""What the two cloud targets share: gpucli's own SSH key, choosing offers and the bid, provisioning
with the pod id recorded before any wait, terminating what a run owns, asking about its pod.

The provider clients (gpucli.providers.clients) speak the APIs; ``runpod.py`` and ``vast.py`` next to this file
say what differs (how offers are searched, the image, where the run's folder lives).

Money rules kept here: offers (and the spot bid) are chosen before anything is created, so the run
record and the trainer's dollar limit carry the most the pod can cost per hour; a spot launch always
sends a bid; every wait has a deadline (``--ready-timeout``, polled every ``GPUCLI_PROVIDER_POLL_S``);
ending a run's pod also ends any other pod that carries the run's label.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpucli.errors import GpucliError, NoCapacityError, ProviderError, UsageError
from gpucli.providers.api import (
    LABEL_PREFIX,
    InstanceNotFound,
    InstanceState,
    LaunchSpec,
    TerminatePending,
    cuda_at_least,
)
from gpucli.providers.bootguard import guard_command, window_s
from gpucli.providers.clients import get_provider
from gpucli.providers.hostkeys import forget_pod_keys, pod_known_hosts, pod_known_hosts_for_ssh
from gpucli.providers.http import USER_AGENT
from gpucli.providers.onstart import onstart_hook
from gpucli.providers.provision import provision_with_retries
from gpucli.providers.runpod.v2 import volume_usd_per_month
from gpucli.providers.ssh.target import open_remote, ssh_shell_argv
from gpucli.providers.target import Capabilities, OfferAsk, PodState, Stray
from gpucli.runs import userconfig
from gpucli.runs.records import parse_iso
from gpucli.runs.trainerenv import wheel_min_cuda
from gpucli.settings import home, pod_ssh_user, provider_poll_s
from gpucli.ssh import SshTarget

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog, Gpu
    from gpucli.providers.api import Billed, Offer, Provider
    from gpucli.providers.runpod.api import NetworkVolume
    from gpucli.providers.target import Provisioner
    from gpucli.runs.records import RunRecord
    from gpucli.ssh import Remote

log = logging.getLogger(__name__)

MAX_OFFERS = 3  # offers tried per launch; each gets the full --ready-timeout
SPOT_MARKUP = 1.05  # the default bid: 5 % over the cheapest offer's floor


def ssh_keypair() -> tuple[Path, str]:
    """gpucli's own key pair (private key 0600 under GPUCLI_HOME): injected into every pod, so no
    account-level key is needed. Returns (private key path, public key line)."""
    key = home() / "id_ed25519"
    pub = key.with_suffix(".pub")
    if not key.exists() or not pub.exists():
        # Two first launches at once: one makes the pair while the other waits on the lock, then finds
        # it. The pair is written under temporary names and renamed into place (the key last), so no
        # launch ever reads half a pair or has its key deleted by another.
        with _key_lock(home() / ".id_ed25519.lock"):
            if not key.exists() or not pub.exists():
                _make_keypair(key, pub)
    return key, pub.read_text().strip()


@contextlib.contextmanager
def _key_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl  # POSIX only: optional, so gpucli still imports where there is none
    except ImportError:  # Windows: no advisory locks; the atomic renames still keep each pair whole
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _make_keypair(key: Path, pub: Path) -> None:
    tmp = key.with_name(f".{key.name}.{os.getpid()}.tmp")
    tmp_pub = tmp.with_name(tmp.name + ".pub")
    for p in (tmp, tmp_pub):
        p.unlink(missing_ok=True)
    try:
        if shutil.which("ssh-keygen"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpucli", "-f", str(tmp)],
                           check=True, capture_output=True)
        else:  # paramiko cannot write ed25519 keys; RSA 3072 is accepted everywhere
            import paramiko  # lazy: paramiko (~0.3 s) only to write a key

            rsa = paramiko.RSAKey.generate(3072)
            rsa.write_private_key_file(str(tmp))
            tmp_pub.write_text(f"{rsa.get_name()} {rsa.get_base64()} gpucli\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp_pub, pub)
        os.replace(tmp, key)
    finally:
        for p in (tmp, tmp_pub):
            p.unlink(missing_ok=True)


def run_cost(offer: Offer, *, spot: bool, hours: float | None = None,
             transfer_gb: tuple[float, float] = (0.0, 0.0)) -> float:
    """What a run of ``hours`` moving ``transfer_gb`` (up, down) costs on ``offer``: the ranking key."""
    if spot and offer.spot_price_per_hour_usd is not None:
        hourly = offer.spot_price_per_hour_usd + offer.storage_usd_per_hour
    else:
        hourly = offer.price_per_hour_usd if offer.price_per_hour_usd is not None else float("inf")
    return hourly * (hours or 1.0) + offer.transfer_usd(*transfer_gb)


@dataclass(frozen=True)
class CloudPlan:
    """What a cloud launch will try, decided before anything is created."""

    provider: str
    gpu_id: str
    n_gpus: int
    offers: tuple[Offer, ...]  # best first; at most MAX_OFFERS
    spot: bool
    bid_per_gpu_usd: float | None  # always set for spot
    max_price_per_hour_usd: float  # the most any offer tried can cost per hour (spot: the bid)
    bid_note: str | None = None  # how the default bid was chosen, for the launch events
    min_cuda: str | None = None  # the host CUDA the pod must run (the image's and the trainer's torch build)


@dataclass(frozen=True)
class CloudProvisioner:
    """The ``Provisioner`` of a cloud target: the plan plus what the pod is created with."""

    target: CloudTarget
    run: str
    plan: CloudPlan
    image: str | None
    disk_gb: int
    ready_timeout_s: float
    volume: NetworkVolume | None = None  # RunPod network volume, mounted at /workspace
    force: bool = False  # --force: keep a pod billed more than 5 % above its quote
    billed: list[float] = field(default_factory=list)  # the billed $/h read back after create (filled by __call__)
    workdir: str | None = None  # the run folder: vast's onstart runs its resume.sh at every container start
    notes: tuple[str, ...] = ()  # said before the pod is created: the planned bandwidth (gpucli.run.files.transfer)

    def with_workdir(self, workdir: str) -> CloudProvisioner:
        return dataclasses.replace(self, workdir=workdir)

    @property
    def max_price_per_hour_usd(self) -> float:
        return self.plan.max_price_per_hour_usd

    @property
    def offers(self) -> tuple[Offer, ...]:
        return self.plan.offers

    @property
    def billed_usd_per_hour(self) -> float | None:
        """What the created pod bills per hour, as the provider said right after create (None before)."""
        return self.billed[-1] if self.billed else None

    def __call__(self, *, on_created: Callable[[str], None], on_event: Callable[[str], None],
                 cancelled: Callable[[], bool] = lambda: False) -> SshTarget:
        for line in self.notes:
            on_event(line)
        try:
            return self.target.provision(self.run, self.plan, image=self.image, disk_gb=self.disk_gb,
                                         ready_timeout_s=self.ready_timeout_s, on_created=on_created,
                                         on_event=on_event, volume=self.volume, force=self.force, billed=self.billed,
                                         workdir=self.workdir, cancelled=cancelled)
        except GpucliError as exc:
            if self.volume is not None and self.volume.created:
                exc.message = f"{exc.message}; {created_volume_note(self.volume)}"
            raise


def created_volume_note(volume: NetworkVolume) -> str:
    """One sentence for a failed launch that created a network volume: it is kept (it may hold data
    already), what it costs per month, and the command that deletes it (REST v2 ``DELETE
    /v2/network-volumes/{id}``, runpod/docs api-reference-v2/openapi.json)."""
    monthly = f"${volume.usd_per_month:.2f}/month" if volume.usd_per_month is not None else "billed monthly"
    return (f"network volume {volume.name} ({volume.volume_id}, {volume.data_center_id}) created by this launch "
            f"is kept and bills {monthly}; delete it with: curl -X DELETE "
            f"https://api.runpod.io/v2/network-volumes/{volume.volume_id} -H \"Authorization: Bearer $RUNPOD_API_KEY\"")


class CloudTarget:
    """The shared half of the RunPod and vast.ai targets."""

    name: str
    default_image: str
    caps: Capabilities  # each provider's own, with its sources
    cloud = True
    bootstrap = True
    needs_gpu = True
    exited_means = "exited"  # what a pod the provider reports EXITED has become

    # -- what each provider says differently ----------------------------------------------------------

    def default_workdir(self, run: str) -> str:
        return f"gpucli-runs/{run}"  # relative to the login directory

    def search(self, client: Provider, gpu: Gpu, n_gpus: int, *, spot: bool, limit: int,
               disk_gb: int | None = None, query: str | None = None, hours: float | None = None) -> list[Offer]:
        """``disk_gb``: the disk the pod will be created with, so that a provider pricing storage into
        the hourly rate (vast ``allocated_storage``) quotes what it will bill. ``query``: the launch's
        ``--query`` (vast query words). ``hours``: the run's planned hours, for providers whose rentals
        end at a date (vast ``duration``)."""
        raise NotImplementedError

    def required_cuda(self, gpu: Gpu) -> str | None:
        """The newest CUDA a host's driver must run for this GPU: the default image's (``min_cuda``) and
        the oldest torch build in the trainer's pin file with kernels for the GPU (a Blackwell GPU:
        cu128, so 12.8), whichever is newer."""
        return wheel_min_cuda(gpu.min_cuda, getattr(self, "min_cuda", None))

    def pod_api_env(self) -> dict[str, str]:
        """The API endpoint the pod-side watchdog and the boot guard call, as the watchdog's env file says it."""
        raise NotImplementedError

    # -- the contract ----------------------------------------------------------------------------------

    def default_python(self) -> str:
        return "python3"

    def endpoint(self, host: str | None, identity_file: str | None) -> SshTarget | None:
        return None  # known once the pod is up

    def interactive_shell(self, record: RunRecord) -> tuple[list[str], str | None]:
        return ssh_shell_argv(record, known_hosts=pod_known_hosts_for_ssh(record))

    def client(self) -> Provider:
        return get_provider(self.name)

    def balance_usd(self) -> float | None:
        return self.client().balance_usd()

    def with_volume(self, provision: Provisioner, name_or_id: str, *, size_gb: int | None = None,
                    volume_id: str | None = None) -> Provisioner:
        raise UsageError(f"--volume: {self.name} has no network volumes here")  # caps.network_volumes

    def cluster_volume(self, name_or_id: str, *, size_gb: int | None, gpu_type: str, gpus_per_pod: int,
                       volume_id: str | None = None) -> NetworkVolume:
        raise UsageError(f"{self.name} rents no cluster with a network volume")  # caps.clusters

    def open(self, record: RunRecord, *, connect_timeout_s: float = 20.0) -> Remote:
        """SSH to the run's pod with its host key pinned for this pod only (see hostkeys.py)."""
        return open_remote(record, connect_timeout_s=connect_timeout_s, known_hosts=pod_known_hosts(record))

    def choose_offers(self, catalog: Catalog, gpu_id: str, n_gpus: int, *, spot: bool, limit: int = 5,
                      client: Provider | None = None, disk_gb: int | None = None, hours: float | None = None,
                      transfer_gb: tuple[float, float] = (0.0, 0.0), query: str | None = None) -> list[Offer]:
        """Live offers of exactly ``n_gpus`` of the profile's GPU, ranked on what the run would cost on
        each: the hourly quote (disks included; spot: the floor plus the storage billed on top of a
        bid) for ``hours`` (1 when not known), plus the planned transfer ``(up GB, down GB)`` at the
        offer's $/GB (vast bills bandwidth)."""
        client = client or self.client()
        gpu = catalog.gpus[gpu_id]
        need = self.required_cuda(gpu)
        found = [o for o in self.search(client, gpu, n_gpus, spot=spot, limit=limit, disk_gb=disk_gb, query=query,
                                        hours=hours)
                 if o.gpu_count == n_gpus and (not spot or o.spot_price_per_hour_usd is not None)]
        # a host whose driver is older than the build the GPU needs: its pod would start and never train
        offers = [o for o in found if cuda_at_least(o.cuda_version, need)]
        if not offers:
            older = f" whose driver runs CUDA {need}+ ({len(found)} older)" if found else ""
            raise NoCapacityError(f"no {self.name} offers for {n_gpus}x {gpu.name}" + (" (spot)" if spot else "")
                                  + older, hint="see `gpucli offers` for what is available")
        least = userconfig.get(userconfig.load(), "reliability", self.name)  # gpucli config set vast.reliability
        if least is not None:
            offers = [o for o in offers if o.reliability is not None and o.reliability >= least]
            if not offers:
                raise NoCapacityError(f"no {self.name} offers for {n_gpus}x {gpu.name} at reliability >= {least:g}",
                                      hint=f"lower it (gpucli config set {self.name}.reliability ...) or unset it")
        return sorted(offers, key=lambda o: run_cost(o, spot=spot, hours=hours, transfer_gb=transfer_gb))[:limit]

    def plan_offers(self, catalog: Catalog, gpu_id: str, n_gpus: int, *, spot: bool,
                    bid_per_gpu_usd: float | None, client: Provider | None = None,
                    disk_gb: int | None = None, ask: OfferAsk | None = None) -> CloudPlan:
        """Search live offers and fix the bid. A spot launch without a usable bid fails here, before any
        pod exists; offers whose floor is above the bid are not tried (the provider would refuse them).
        ``ask``: the launch's filters and the run's planned hours and transfer, the ranking's terms."""
        ask = ask or OfferAsk()
        offers = self.choose_offers(catalog, gpu_id, n_gpus, spot=spot, client=client, disk_gb=disk_gb,
                                    hours=ask.hours, transfer_gb=ask.transfer_gb, query=ask.query)
        if ask.offer_id is not None:  # one offer of a ranking across providers (gpucli/run/life/failover.py)
            offers = [o for o in offers if o.offer_id == ask.offer_id]
            if not offers:
                raise NoCapacityError(f"{self.name} offer {ask.offer_id} is no longer listed")
        note = None
        if spot:
            def floor_per_gpu(o: Offer) -> float:
                return (o.spot_price_per_hour_usd or 0.0) / n_gpus

            if bid_per_gpu_usd is None:
                bid_per_gpu_usd = round(floor_per_gpu(offers[0]) * SPOT_MARKUP, 4)
                note = f"spot bid: ${bid_per_gpu_usd}/GPU/h (5% over the cheapest floor; --bid sets it)"
            usable = [o for o in offers if floor_per_gpu(o) <= bid_per_gpu_usd + 1e-9]
            if not usable:
                lowest = min(floor_per_gpu(o) for o in offers)
                raise UsageError(f"--bid {bid_per_gpu_usd:g} $/GPU/h is below every {self.name} spot floor for "
                                 f"{n_gpus}x {catalog.gpus[gpu_id].name} (lowest ${lowest:.4f}/GPU/h)",
                                 hint=f"bid at least {lowest:.4f}, or drop --spot")
            offers = usable
            # the bid plus the storage billed on top of it (vast pricing.mdx; gpuhunt vastai.py)
            max_price = bid_per_gpu_usd * n_gpus + max(o.storage_usd_per_hour for o in offers[:MAX_OFFERS])
        else:
            max_price = max(o.price_per_hour_usd or 0.0 for o in offers[:MAX_OFFERS])
        return CloudPlan(provider=self.name, gpu_id=gpu_id, n_gpus=n_gpus, offers=tuple(offers[:MAX_OFFERS]),
                         spot=spot, bid_per_gpu_usd=bid_per_gpu_usd if spot else None,
                         max_price_per_hour_usd=round(max_price, 6), bid_note=note,
                         min_cuda=self.required_cuda(catalog.gpus[gpu_id]))

    def provisioner(self, catalog: Catalog, run: str, gpu_id: str, n_gpus: int, *, spot: bool,
                    bid_per_gpu_usd: float | None, image: str | None, disk_gb: int,
                    ready_timeout_s: float, ask: OfferAsk | None = None) -> CloudProvisioner:
        ask = ask or OfferAsk()
        plan = self.plan_offers(catalog, gpu_id, n_gpus, spot=spot, bid_per_gpu_usd=bid_per_gpu_usd,
                                disk_gb=disk_gb, ask=ask)
        return CloudProvisioner(self, run, plan, image, disk_gb, ready_timeout_s, force=ask.force)

    def provision(self, run: str, plan: CloudPlan, *, image: str | None, disk_gb: int, ready_timeout_s: float,
                  on_created: Callable[[str], None], on_event: Callable[[str], None],
                  client: Provider | None = None, volume: NetworkVolume | None = None, force: bool = False,
                  billed: list[float] | None = None, workdir: str | None = None,
                  cancelled: Callable[[], bool] = lambda: False) -> SshTarget:
        """Create a pod for the run from ``plan`` and wait (``ready_timeout_s`` per offer) for SSH.

        ``on_created`` gets every new pod id before any wait. Whatever a failed attempt created is
        terminated by the provisioning loop. Returns the pod's SSH endpoint.
        """
        client = client or self.client()
        poll_s = provider_poll_s()
        key, pub = ssh_keypair()
        first = plan.offers[0]
        spec = LaunchSpec(name=run, gpu_name=first.gpu_name, gpu_count=plan.n_gpus,
                          image=image or self.default_image, disk_gb=disk_gb, ssh_public_key=pub, spot=plan.spot,
                          bid_per_gpu_usd=plan.bid_per_gpu_usd, offer_id=first.offer_id,
                          network_volume_id=volume.volume_id if volume else None,
                          data_center_id=volume.data_center_id if volume else None,
                          cloud_type="SECURE" if volume else None, volume_gb=disk_gb,
                          min_cuda=plan.min_cuda or (getattr(self, "min_cuda", None) if not image else None),
                          onstart=onstart_hook(workdir) if workdir and self.caps.in_place_resume
                          else None,
                          # the pod guards itself until the watchdog runs (gpucli/providers/bootguard.py)
                          boot_guard=guard_command(self.name, workdir, window_s(ready_timeout_s),
                                                   next(iter(self.pod_api_env().values()), ""), USER_AGENT)
                          if workdir else None)
        if volume is not None:
            on_event(f"with network volume {volume.name} ({volume.volume_id}, {volume.data_center_id}) at /workspace")
        if plan.bid_note:
            on_event(plan.bid_note)
        kind = f"spot (bid ${plan.bid_per_gpu_usd}/GPU/h)" if plan.spot else "on-demand"
        more = f" and {len(plan.offers) - 1} more" if len(plan.offers) > 1 else ""
        on_event(f"creating a {self.name} {kind} pod {spec.label}: {plan.n_gpus}x {first.gpu_name} "
                 f"(offer {first.offer_id}{more})")
        result = provision_with_retries(client, spec, plan.offers,
                                        on_created=lambda inst: on_created(inst.instance_id), on_event=on_event,
                                        ready_timeout_s=ready_timeout_s, poll_interval_s=poll_s,
                                        max_offers=MAX_OFFERS, keep_overpriced=force, cancelled=cancelled)
        inst = result.instance
        if billed is not None and result.billed_usd_per_hour:
            billed.append(result.billed_usd_per_hour)
        return SshTarget(host=inst.ssh_host or "", port=int(inst.ssh_port or 22),
                         user=pod_ssh_user() or inst.ssh_user or "root", identity_file=str(key))

    def _run_pod_ids(self, client: Provider, record: RunRecord) -> list[str]:
        """The run's pod id plus any other live pod carrying the run's label (a lost create answer)."""
        ids = [record.instance_id] if record.instance_id else []
        label = record.label or LABEL_PREFIX + record.name
        try:
            for inst in client.list_instances():
                if inst.label == label and inst.instance_id not in ids and inst.state is not InstanceState.TERMINATED:
                    ids.append(inst.instance_id)
        except ProviderError as exc:
            if not ids:
                raise
            log.warning("could not list %s pods to look for strays of %s: %s", self.name, label, exc)
        return ids

    def terminate(self, record: RunRecord) -> bool:
        """End every pod of the run. A pod counts as ended only when the provider's answer says so
        (gpucli.providers.clients: the documented success, or its own "no such pod" for that id); any other
        answer leaves it pending and raises :class:`TerminatePending` naming it, after every other
        pod of the run was tried."""
        if not (record.instance_id or record.label):
            return False
        client = self.client()
        ids = self._run_pod_ids(client, record)
        pending: list[tuple[str, str]] = []
        for pod_id in ids:
            try:
                client.terminate(pod_id)
            except ProviderError as exc:
                pending.append((pod_id, exc.message))
        if pending:
            names = ", ".join(p for p, _ in pending)
            raise TerminatePending(f"terminate pending for {self.name} pod {names}: {pending[0][1]}",
                                   instance_ids=tuple(p for p, _ in pending))
        forget_pod_keys(record)  # its host:port will be another pod's
        return bool(ids)

    def terminate_alive(self, record: RunRecord) -> list[str]:
        """Pods the provisioning loop already terminated are not counted again."""
        client = self.client()
        ended = []
        for pod_id in self._run_pod_ids(client, record):
            try:
                if client.get(pod_id).state is InstanceState.TERMINATED:
                    continue
            except InstanceNotFound:
                continue
            except ProviderError:
                pass  # cannot tell: terminate anyway (idempotent)
            client.terminate(pod_id)
            ended.append(pod_id)
        return ended

    def _word(self, state: InstanceState) -> str:
        return {
            InstanceState.STOPPED: "preempted",
            InstanceState.EXITED: self.exited_means,
            InstanceState.FAILED: "failed",
            InstanceState.TERMINATED: "gone",
            InstanceState.PENDING: "pending",
            InstanceState.RUNNING: "running",
        }.get(state, "unknown")

    def pod_state(self, record: RunRecord) -> PodState | None:
        if not record.instance_id:
            return None
        try:
            inst = self.client().get(record.instance_id)
        except InstanceNotFound:
            return PodState("gone", f"{self.name} has no pod {record.instance_id}")
        return PodState(self._word(inst.state), inst.raw_status)

    def billed(self, record: RunRecord) -> Billed | None:
        """What the provider says the run's pod has been billed so far, where it reports it per pod
        (vast.ai's charges, bandwidth included); None when it does not or cannot be asked now."""
        created = parse_iso(record.created_at)
        if not record.instance_id or created is None:
            return None
        try:
            return self.client().billed(record.instance_id, created.timestamp())
        except GpucliError as exc:  # a missing key, a provider fault: the status goes on without it
            log.info("could not read what %s billed pod %s: %s", self.name, record.instance_id, exc)
            return None

    def contract_note(self, record: RunRecord, *, now_epoch_s: float) -> str | None:
        """The live pod's rental end and any higher price its host asks (vast), in one line; None
        where the provider has no such terms or cannot be asked now. Read-only: nothing is accepted."""
        if not record.instance_id or not record.active:
            return None
        try:
            terms = self.client().contract(record.instance_id)
        except GpucliError as exc:
            log.info("could not read the rental terms of %s pod %s: %s", self.name, record.instance_id, exc)
            return None
        if terms is None:
            return None
        parts = []
        if terms.ends_at_epoch_s is not None:
            left_h = (terms.ends_at_epoch_s - now_epoch_s) / 3600.0
            when = dt.datetime.fromtimestamp(terms.ends_at_epoch_s, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            parts.append(f"ends {when} ({left_h:.1f} h left): the provider stops the instance then and may "
                         "delete it 48 h later")
        if terms.price_increase:
            parts.append(f"the host asks a higher price ({terms.price_increase}), NOT accepted: accept or "
                         "refuse it in the provider's console; unaccepted, the rental is not extended")
        return "; ".join(parts) or None

    def kept_storage(self, record: RunRecord) -> tuple[float, str] | None:
        """What the run's ended pod keeps billing per month, and what: a stopped pod's disk (RunPod:
        volume disk at $0.20/GB/month; vast: its disk at the host's storage rate) plus a kept network
        volume. None when nothing is kept (a terminated pod, no volume)."""
        total, parts = 0.0, []
        if record.instance_id:
            try:
                inst = self.client().get(record.instance_id)
            except InstanceNotFound:
                inst = None
            except ProviderError as exc:
                log.info("could not read pod %s: %s", record.instance_id, exc)
                inst = None
            if inst is not None and inst.state in (InstanceState.STOPPED, InstanceState.EXITED) \
                    and inst.stopped_usd_per_month:
                total += inst.stopped_usd_per_month
                parts.append(f"stopped pod {inst.instance_id} keeps its disk: ${inst.stopped_usd_per_month:.2f}/month "
                             f"until `gpucli down {record.name}`")
        volume = record.inputs.volume
        if volume is not None and volume.size_gb is not None:
            monthly = volume_usd_per_month(float(volume.size_gb))
            total += monthly
            parts.append(f"network volume {volume.name} ({volume.id}): ${monthly:.2f}/month until "
                         "deleted")
        return (round(total, 2), "; ".join(parts)) if parts else None

    def strays(self, owned: set[str]) -> list[Stray]:
        return [Stray(self.name, i.instance_id, i.label, i.state.value, i.price_per_hour_usd)
                for i in self.client().list_instances()
                if i.is_ours and i.instance_id not in owned and i.state is not InstanceState.TERMINATED]

    def end_stray(self, instance_id: str) -> None:
        self.client().terminate(instance_id)
