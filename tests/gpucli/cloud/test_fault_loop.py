"""Randomized faults: 200 launches (100 per cloud) end with zero pods left running in both ledgers.

The seed is printed (``-s`` shows it; it is also in the assertion message) and can be pinned with
``GPUCLI_FAULT_SEED`` to replay a failure.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from gpucli.cloud import get_provider
from gpucli.cloud.base import LaunchSpec
from gpucli.cloud.http import RetryPolicy
from gpucli.cloud.provision import provision_with_retries
from gpucli.cloud.query import parse_query
from gpucli.errors import ProviderError
from tests.support.emulators import PodBehaviour

LAUNCHES_PER_PROVIDER = 100
FAST = RetryPolicy(max_attempts=4, base_delay_s=0.0005, max_delay_s=0.002, deadline_s=5)

REQUEST_FAULTS = [
    ("rate_limit", "create", {}), ("rate_limit", "get", {"retry_after": "0.001"}),
    ("rate_limit", "search", {"plain_text": False}), ("server_error", "get", {}),
    ("server_error", "create", {}), ("drop", "get", {}), ("drop", "terminate", {}),
    ("drop", "create", {}), ("lose_answer", "create", {}), ("no_capacity", "create", {}),
    ("server_error", "list", {}),
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


def run_launches(emulator, provider_name: str, query: str, rng: random.Random, pub: str) -> tuple[int, list[str]]:
    provider = get_provider(provider_name, policy=FAST)
    ok = 0
    reasons: list[str] = []
    for i in range(LAUNCHES_PER_PROVIDER):
        emulator.faults.clear()
        emulator.behaviours.clear()
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            kind, endpoint, kw = rng.choice(REQUEST_FAULTS)
            emulator.faults.add(kind, endpoint, times=rng.randint(1, 2), **kw)
        for _ in range(3):
            emulator.behaviours.append(draw_behaviour(rng))
        try:
            offers = provider.search_offers(parse_query(query), limit=3)
            first = offers[0]
            spec = LaunchSpec(name=f"fault-{i}", gpu_name=first.gpu_name, gpu_count=first.gpu_count,
                              image="img", disk_gb=10, ssh_public_key=pub, offer_id=first.offer_id)
            result = provision_with_retries(provider, spec, offers, max_offers=3, ready_timeout_s=0.15,
                                            poll_interval_s=0.002)
            ok += 1
            emulator.faults.clear()
            provider.terminate(result.instance.instance_id)
        except ProviderError as exc:
            reason = str(exc)
            assert reason.strip(), "every failed launch must say why"
            reasons.append(reason)
    emulator.faults.clear()
    return ok, reasons


@pytest.mark.parametrize("which", ["runpod", "vast"])
def test_random_faults_leave_no_pod_running(which, runpod_emulator, vast_emulator, client_key):
    seed = int(os.environ.get("GPUCLI_FAULT_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"fault loop seed ({which}): {seed}")
    rng = random.Random(seed)
    emulator = runpod_emulator if which == "runpod" else vast_emulator
    query = "gpu_ram>=20 num_gpus<=2" if which == "runpod" else "gpu_name=RTX_3090"
    started = time.monotonic()
    ok, reasons = run_launches(emulator, which, query, rng, client_key[1])
    alive = emulator.ledger.alive()
    assert alive == set(), f"seed {seed}: pods left running: {sorted(alive)}"
    assert emulator.running_sshd_count() == 0, f"seed {seed}"
    assert ok > LAUNCHES_PER_PROVIDER // 5, f"seed {seed}: only {ok} launches succeeded: {reasons[:5]}"
    assert ok + len(reasons) == LAUNCHES_PER_PROVIDER
    print(f"{which}: {ok} ready, {len(reasons)} failed with a reason, "
          f"{len(emulator.ledger.created())} pods created, {time.monotonic() - started:.1f} s")
