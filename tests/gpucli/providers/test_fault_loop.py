"""Randomized faults: launches on both clouds end with zero pods or volumes billing that no run owns.

Faults: rate limits, 5xx, dropped connections, lost create answers, no capacity, stuck and exiting
pods; terminate failures (5xx, and HTTP 200 whose body is not the documented answer: never counted as
terminated, retried as ``gpucli down`` retries a "terminate pending" pod); billed prices above the
quote (RunPod: a data centre that bills more than the catalog says: the pod is terminated before
setup and the next offer tried); network-volume creation failures (RunPod); outbid pauses and
automatic resumes of vast spot instances; vast offers whose rental ends before the run would (never
rented: the search asks ``duration``) and contracts that end under a run (the instance stopped, still
billing storage until the run's end destroys it); restarts of stopped pods (issue 41 rule 1): a pod
stopped after its run and started again to be read runs its create-time start command (the boot guard,
as on the services: at every container start), and the guard stops it again, never terminates it, and
its run folder (a checkpoint) survives.

``GPUCLI_FAULT_LAUNCHES`` sets the launches per cloud (default 25: the suite runs on two cores; the
issue's 200-launch figure is ``GPUCLI_FAULT_LAUNCHES=100``). The seed is printed (``-s`` shows it; it is
also in the assertion message) and can be pinned with ``GPUCLI_FAULT_SEED`` to replay a failure.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from gpucli.errors import ProviderError
from gpucli.providers.api import LaunchSpec
from gpucli.providers.bootguard import guard_command
from gpucli.providers.clients import get_provider
from gpucli.providers.http import USER_AGENT, RetryPolicy
from gpucli.providers.provision import provision_with_retries
from gpucli.providers.query import parse_query
from tests.support.emulators import PodBehaviour

LAUNCHES_PER_PROVIDER = int(os.environ.get("GPUCLI_FAULT_LAUNCHES") or 25)
TERMINATE_TRIES = 10  # what a user's repeated `gpucli down` of a "terminate pending" run amounts to
GUARD_S = 5  # the boot guard's window: a pod's first start to its run's first checkpoint here is far less
FAST = RetryPolicy(max_attempts=4, base_delay_s=0.0005, max_delay_s=0.002, deadline_s=5)
#: vast: the rental every fault-loop run asks for (a day: what the launch asks of a run with no planned
#: length, gpucli.providers.vast.target.rental_hours)
RUN_RENTAL_S = 24 * 3600.0

REQUEST_FAULTS = [
    ("rate_limit", "create", {}), ("rate_limit", "get", {"retry_after": "0.001"}),
    ("rate_limit", "search", {"plain_text": False}), ("server_error", "get", {}),
    ("server_error", "create", {}), ("drop", "get", {}), ("drop", "terminate", {}),
    ("drop", "create", {}), ("lose_answer", "create", {}), ("no_capacity", "create", {}),
    ("server_error", "list", {}), ("not_json", "terminate", {}), ("server_error", "terminate", {}),
]


def draw_behaviour(rng: random.Random) -> PodBehaviour:
    kind = rng.choice(["ok", "ok", "ok", "slow_start", "stuck", "exit", "exit_late"])
    if kind == "slow_start":
        return PodBehaviour(pending_polls=rng.randint(2, 6))
    if kind == "stuck":
        return PodBehaviour(stuck=True)
    if kind == "exit":
        return PodBehaviour(pending_polls=1, exit_after_polls=1, bad_state=rng.choice(["exited", "offline", "unknown"]))
    if kind == "exit_late":
        return PodBehaviour(pending_polls=3, exit_after_polls=2)
    return PodBehaviour(pending_polls=rng.randint(0, 2))


def end_for_sure(provider, instance_id: str) -> int:
    """Terminate until the provider confirms it (``gpucli down`` on a "terminate pending" run); the tries."""
    for n in range(1, TERMINATE_TRIES + 1):
        try:
            provider.terminate(instance_id)
            return n
        except ProviderError:
            continue
    raise AssertionError(f"pod {instance_id} could not be terminated in {TERMINATE_TRIES} tries")


def run_launches(emulator, provider_name: str, query: str, rng: random.Random, pub: str,
                 runs_root=None) -> dict[str, int]:
    provider = get_provider(provider_name, policy=FAST)
    counts = {"ok": 0, "failed": 0, "overbilled": 0, "terminate_retries": 0, "volume_failures": 0,
              "outbid": 0, "resumed": 0, "contract_ended": 0, "restarted": 0, "guard_stops": 0,
              "checkpoints_lost": 0}
    emulator.run_start_commands = runs_root is not None
    owned_volumes: set[str] = set()
    if provider_name == "vast":  # some listings end within hours: never rented for a longer run
        for offer in emulator.offers:
            offer["duration"] = rng.choice([3 * 3600.0, 30 * 86400.0])
        emulator.offers[0]["duration"] = 30 * 86400.0  # an RTX 3090 that outlasts the run: always one
    for i in range(LAUNCHES_PER_PROVIDER):
        emulator.faults.clear()
        emulator.behaviours.clear()
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            kind, endpoint, kw = rng.choice(REQUEST_FAULTS)
            emulator.faults.add(kind, endpoint, times=rng.randint(1, 2), **kw)
        for _ in range(3):
            emulator.behaviours.append(draw_behaviour(rng))
        volume_id = None
        if provider_name == "runpod":
            # a data centre that bills more than the catalog quotes (the pod must not be kept)
            emulator.billed_markup = {"EU-RO-1": 1.2} if rng.random() < 0.25 else {}
        try:
            offers = provider.search_offers(parse_query(query), limit=3)
            first = offers[0]
            wd = runs_root / f"fault-{i}" if runs_root is not None else None
            restart = wd is not None and rng.random() < 0.3
            guard = guard_command(provider_name, str(wd), GUARD_S, emulator.url, USER_AGENT) if wd else None
            spec = LaunchSpec(name=f"fault-{i}", gpu_name=first.gpu_name, gpu_count=first.gpu_count,
                              image="runpod/pytorch:2.4.0" if wd else "img", disk_gb=10, ssh_public_key=pub,
                              offer_id=first.offer_id, boot_guard=guard)
            if provider_name == "runpod" and rng.random() < 0.15:
                emulator.volume_create_fails = rng.choice([0, 1])
                dc = provider.data_center_for(first.gpu_name, first.gpu_count)
                volume = provider.create_volume(f"vol-{i}", 10, dc)
                volume_id = volume.volume_id
                spec = LaunchSpec(name=f"fault-{i}", gpu_name=first.gpu_name, gpu_count=first.gpu_count,
                                  image=spec.image, disk_gb=10, ssh_public_key=pub, network_volume_id=volume_id,
                                  data_center_id=dc, cloud_type="SECURE", boot_guard=guard)
                offers = [o for o in offers if o.cloud_type == "SECURE" and o.data_center_id == dc] or [None]
            result = provision_with_retries(provider, spec, offers, max_offers=3, ready_timeout_s=0.15,
                                            poll_interval_s=0.002)
            counts["ok"] += 1
            billed, quote = result.billed_usd_per_hour, result.quoted_usd_per_hour
            assert billed is None or quote is None or billed <= quote * 1.05 + 1e-9, "a pod billed over its quote was kept"
            if volume_id is not None:
                owned_volumes.add(volume_id)  # the run owns it (kept after the run, by design)
            if provider_name == "vast" and rng.random() < 0.3:
                outbid_and_resume(emulator, result.instance.instance_id, counts)
            if provider_name == "vast":
                rented = emulator.offer_durations[result.instance.instance_id]
                assert rented >= RUN_RENTAL_S, f"rented an offer with {rented / 3600:.1f} h left for a longer run"
                if rng.random() < 0.2:  # the contract ends under the run: stopped, still billing storage
                    emulator.expire(result.instance.instance_id)
                    counts["contract_ended"] += 1
                    assert result.instance.instance_id in emulator.ledger.alive()
            if restart:
                restart_stopped(emulator, provider, result.instance.instance_id, wd, counts)
            emulator.faults.clear()
            if rng.random() < 0.4:  # the end of the run meets a failing terminate: 5xx or a 200 that is not JSON
                emulator.faults.add(rng.choice(["server_error", "not_json"]), "terminate", times=rng.randint(1, 6))
            counts["terminate_retries"] += end_for_sure(provider, result.instance.instance_id) - 1
        except ProviderError as exc:
            reason = str(exc)
            assert reason.strip(), "every failed launch must say why"
            counts["failed"] += 1
            if "more than 5% above the quote" in reason:
                counts["overbilled"] += 1
            if "network volume" in reason:
                counts["volume_failures"] += 1
            if volume_id is not None:  # the failure line names it; the user deletes it with that command
                emulator.faults.clear()
                provider.delete_volume(volume_id)
        for pod_id in list(emulator.ledger.alive()):
            emulator.faults.clear()
            counts["terminate_retries"] += end_for_sure(provider, pod_id) - 1
    emulator.faults.clear()
    if provider_name == "runpod":
        assert set(emulator.volumes) == owned_volumes, "a volume bills that no run owns"
    return counts


def restart_stopped(emulator, provider, pod_id: str, wd, counts: dict[str, int]) -> None:
    """The run ended with --on-end stop (its folder holds a checkpoint); a user starts the pod to read
    it: the start command's guard must stop it again, never terminate it, and the checkpoint survives."""
    emulator.faults.clear()
    # the run wrote a checkpoint (its launch's guard, at its deadline, stops the pod rather than terminate)
    (wd / "checkpoints" / "step_000005").mkdir(parents=True, exist_ok=True)
    (wd / "checkpoints" / "step_000005" / "model.safetensors").write_bytes(b"w")
    provider.stop(pod_id)
    stops = len([e for e in emulator.ledger.ended(pod_id) if e.event == "stopped"])
    provider.start(pod_id)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not emulator.pods[pod_id].sshd:
        provider.get(pod_id)  # the provider starts the container (RunPod: on the way to RUNNING)
        time.sleep(0.05)
    counts["restarted"] += 1
    while time.monotonic() < deadline:
        ended = emulator.ledger.ended(pod_id)
        if len([e for e in ended if e.event == "stopped"]) > stops:
            counts["guard_stops"] += 1
            break
        time.sleep(0.1)
    assert not [e for e in emulator.ledger.ended(pod_id) if e.event == "terminated"], "a restarted pod was destroyed"
    if not (wd / "checkpoints" / "step_000005" / "model.safetensors").exists():
        counts["checkpoints_lost"] += 1


def outbid_and_resume(emulator, instance_id: str, counts: dict[str, int]) -> None:
    """vast: outbid (paused), then priority returns and the container starts again (onstart runs)."""
    emulator.outbid(instance_id)
    counts["outbid"] += 1
    emulator.resume(instance_id)
    counts["resumed"] += 1


@pytest.mark.parametrize("which", ["runpod", "vast"])
def test_random_faults_leave_no_pod_running(which, runpod_emulator, vast_emulator, client_key, tmp_path):
    seed = int(os.environ.get("GPUCLI_FAULT_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"fault loop seed ({which}): {seed}")
    rng = random.Random(seed)
    emulator = runpod_emulator if which == "runpod" else vast_emulator
    query = "gpu_ram>=20 num_gpus<=2" if which == "runpod" else f"gpu_name=RTX_3090 duration>={RUN_RENTAL_S / 86400:g}"
    started = time.monotonic()
    counts = run_launches(emulator, which, query, rng, client_key[1], runs_root=tmp_path)
    alive = emulator.ledger.alive()
    assert alive == set(), f"seed {seed}: pods left billing: {sorted(alive)}"
    assert emulator.running_sshd_count() == 0, f"seed {seed}"
    assert counts["ok"] > LAUNCHES_PER_PROVIDER // 5, f"seed {seed}: only {counts} launches succeeded"
    assert counts["ok"] + counts["failed"] == LAUNCHES_PER_PROVIDER
    assert counts["checkpoints_lost"] == 0 and counts["guard_stops"] == counts["restarted"], f"seed {seed}: {counts}"
    print(f"{which}: {counts}, {len(emulator.ledger.created())} pods created, {time.monotonic() - started:.1f} s")
