"""Cloud glue for launches: gpucli's own SSH key, choosing offers, provisioning, terminating.

The provider clients (gpucli.providers) speak the APIs; this module turns a resolved launch into a
``LaunchSpec`` and offers, hands the loop in ``providers.provision`` the callbacks that record the pod
id before any wait, and terminates what a run owns when it ends or fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpucli.errors import NoCapacityError, UsageError
from gpucli.runs import RunRecord, SshInfo
from gpucli.settings import home

DEFAULT_IMAGES = {
    "runpod": "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04",
    "vast": "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-devel",
}


def ssh_keypair() -> tuple[Path, str]:
    """gpucli's own key pair (private key 0600 under GPUCLI_HOME): injected into every pod, so no
    account-level key is needed. Returns (private key path, public key line)."""
    key = home() / "id_ed25519"
    pub = key.with_suffix(".pub")
    if not key.exists() or not pub.exists():
        if shutil.which("ssh-keygen"):
            key.unlink(missing_ok=True)
            pub.unlink(missing_ok=True)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpucli", "-f", str(key)],
                           check=True, capture_output=True)
        else:  # paramiko cannot write ed25519 keys; RSA 3072 is accepted everywhere
            import paramiko

            rsa = paramiko.RSAKey.generate(3072)
            rsa.write_private_key_file(str(key))
            pub.write_text(f"{rsa.get_name()} {rsa.get_base64()} gpucli\n")
        os.chmod(key, 0o600)
    return key, pub.read_text().strip()


def choose_offers(provider: Any, catalog: Any, gpu_id: str, n_gpus: int, *, spot: bool, limit: int = 5) -> list[Any]:
    """Live offers for the profile's GPU and count, cheapest first."""
    from gpucli.query import parse_query

    gpu = catalog.gpus[gpu_id]
    offers = []
    if provider.name == "vast":
        for vname in gpu.vast_names or (gpu.name,):
            q = parse_query(f"gpu_name={vname.replace(' ', '_')} num_gpus={n_gpus}")
            offers += provider.search_offers(q, spot=spot, limit=limit * 4)
    else:
        ids = {i.lower() for i in gpu.runpod_ids}
        for o in provider.search_offers(None, spot=spot, limit=200):
            if (o.gpu_name or "").lower() in ids and (o.gpu_count or 1) >= 1:
                offers.append(o)
    offers = [o for o in offers if (o.gpu_count or n_gpus) == n_gpus or provider.name == "runpod"]
    if not offers:
        raise NoCapacityError(f"no {provider.name} offers for {n_gpus}x {gpu.name}"
                              + (" (spot)" if spot else ""), hint="see `gpucli offers` for what is available")

    def price(o: Any) -> float:
        if spot and o.spot_price_per_hour_usd is not None:
            return o.spot_price_per_hour_usd
        return o.price_per_hour_usd if o.price_per_hour_usd is not None else float("inf")

    return sorted(offers, key=price)[:limit]


def provision(record_name: str, provider_name: str, catalog: Any, gpu_id: str, n_gpus: int, *, spot: bool,
              bid_per_gpu_usd: float | None, image: str | None, disk_gb: int, ready_timeout_s: float,
              on_created: Callable[[str], None], on_event: Callable[[str], None]) -> tuple[SshInfo, float | None]:
    """Create a pod for the run and wait for SSH; returns its SSH endpoint and $/h."""
    from gpucli.providers import get_provider
    from gpucli.providers.base import LaunchSpec
    from gpucli.providers.provision import provision_with_retries

    provider = get_provider(provider_name)
    key, pub = ssh_keypair()
    offers = choose_offers(provider, catalog, gpu_id, n_gpus, spot=spot)
    if spot and bid_per_gpu_usd is None:
        floor = offers[0].spot_price_per_hour_usd
        if floor is None:
            raise UsageError("--spot needs --bid USD_PER_GPU_HOUR (the offer shows no spot floor)")
        bid_per_gpu_usd = round(floor / n_gpus * 1.05, 4)  # just above the floor, stated in the events
        on_event(f"spot bid: ${bid_per_gpu_usd}/GPU/h (5% over the floor)")
    first = offers[0]
    spec = LaunchSpec(name=record_name, gpu_name=first.gpu_name, gpu_count=n_gpus,
                      image=image or DEFAULT_IMAGES.get(provider_name, DEFAULT_IMAGES["runpod"]), disk_gb=disk_gb,
                      ssh_public_key=pub, spot=spot, bid_per_gpu_usd=bid_per_gpu_usd if spot else None,
                      offer_id=first.offer_id)
    on_event(f"creating a {provider_name} pod: {n_gpus}x {first.gpu_name} (offer {first.offer_id})")
    result = provision_with_retries(provider, spec, offers, on_created=lambda inst: on_created(inst.instance_id),
                                    on_event=on_event, ready_timeout_s=ready_timeout_s)
    inst = result.instance
    user = os.environ.get("GPUCLI_POD_SSH_USER") or inst.ssh_user or "root"
    return (SshInfo(host=inst.ssh_host or "", port=int(inst.ssh_port or 22), user=user, identity_file=str(key)),
            inst.price_per_hour_usd)


def terminate(record: RunRecord) -> bool:
    """End the run's pod (idempotent). Returns False for local and ssh runs, which own no pod."""
    if record.provider not in ("runpod", "vast") or not record.instance_id:
        return False
    from gpucli.providers import get_provider

    get_provider(record.provider).terminate(record.instance_id)
    return True
