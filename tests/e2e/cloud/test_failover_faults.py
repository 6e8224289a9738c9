"""The fault loop across providers: whole launches with ``--provider any`` on both emulators, each offer's
machine drawn at random (refused for capacity, never reachable, unhealthy: uncorrected ECC errors or a
memory row remapping pending (nvidia-smi -q), slow: its clocks held down by the hardware (the slowdown
nvidia-smi reports; a slow bf16 matmul needs a GPU, and the emulators' pods run on this machine's CPU), or
healthy). Each launch ends on a working machine or fails in one
line; either way no pod is left billing but the winner's, and none once it is ended.

``GPUCLI_FAILOVER_LAUNCHES`` sets the launches (default 3: each is a real launch with its preflight, tens
of seconds on two cores). ``GPUCLI_FAULT_SEED`` pins the draw. The counts are printed (``-s``).
"""

from __future__ import annotations

import os
import random

from gpucli.run.host import avoid
from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import assert_nothing_running, emulator_for, launch
from tests.gpucli.run.test_health import SMI_Q
from tests.support.cli import cli
from tests.support.emulators import PodBehaviour

LAUNCHES = int(os.environ.get("GPUCLI_FAILOVER_LAUNCHES") or 3)
KINDS = ["ok", "ok", "ok", "no_capacity", "stuck", "unhealthy", "memory", "slow"]  # 5 in 8 machines bad


def draw(emu, rng: random.Random, gpu: str) -> list[str]:
    """Three machines to order, in the order the provider will hand them out."""
    drawn = []
    for _ in range(3):
        kind = rng.choice(KINDS)
        drawn.append(kind)
        if kind == "no_capacity":
            emu.faults.add("no_capacity", "create")
            continue
        smi = {"unhealthy": f"{gpu}, 2, Not Active\n", "slow": f"{gpu}, 0, Active\n"}.get(kind, f"{gpu}, 0, Not Active\n")
        smi_q = SMI_Q.format(pending="Yes" if kind == "memory" else "No", failed="No")
        emu.behaviours.append(PodBehaviour(stuck=kind == "stuck", nvidia_smi=smi, nvidia_smi_q=smi_q))
    return drawn


def test_failover_fault_loop_leaves_nothing_billing(request, capsys, tmp_path):
    seed = int(os.environ.get("GPUCLI_FAULT_SEED") or random.SystemRandom().randrange(1 << 30))
    rng = random.Random(seed)
    rp, vast = emulator_for(request, "runpod"), emulator_for(request, "vast")
    counts = {"launches": 0, "working": 0, "failed": 0, "attempts": 0, "cost_usd": 0.0, "won_by_vast": 0,
              "attempts_of_working": [], "health_refused": 0, "never_reachable": 0, "no_capacity": 0,
              "drawn": {}, "preflight_s": []}
    for i in range(LAUNCHES):
        for emu in (rp, vast):
            emu.faults.clear()
            emu.behaviours.clear()
        avoid._path().unlink(missing_ok=True)  # each launch meets every host afresh
        drawn = draw(rp, rng, "NVIDIA GeForce RTX 4090") + draw(vast, rng, "NVIDIA GeForce RTX 4090")
        for kind in drawn:
            counts["drawn"][kind] = counts["drawn"].get(kind, 0) + 1
        name = f"fl-{i}"
        code, out, err = launch(capsys, tmp_path, "any", name, "--ready-timeout", "2")
        record = runs.load(name)
        counts["launches"] += 1
        counts["attempts"] += len(record.attempts)
        counts["cost_usd"] = round(counts["cost_usd"] + sum(a["cost_usd"] for a in record.attempts), 6)
        for a in record.attempts:
            reason = a["reason"]
            counts["health_refused"] += "preflight failed (smi)" in reason
            counts["never_reachable"] += "SSH" in reason or "terminating" in reason or "did not" in reason
            counts["no_capacity"] += "no capacity" in reason
        if code == 0:
            counts["working"] += 1
            if record.preflight is not None and record.preflight.seconds is not None:
                counts["preflight_s"].append(round(record.preflight.seconds, 1))
            counts["attempts_of_working"].append(len(record.attempts))
            counts["won_by_vast"] += record.provider == "vast"
            assert record.status == "running" and record.attempts[-1]["ok"], f"seed {seed}: {drawn}"
            winner = rp if record.provider == "runpod" else vast
            loser = vast if winner is rp else rp
            assert winner.ledger.alive() == {record.instance_id} and loser.ledger.alive() == set(), f"seed {seed}"
            assert cli(capsys, "down", name)[0] == 0
        else:
            counts["failed"] += 1
            assert not any(a["ok"] for a in record.attempts), f"seed {seed}: {drawn}"
        assert rp.ledger.alive() == set() and vast.ledger.alive() == set(), f"seed {seed}: pods left billing"
    for emu in (rp, vast):
        emu.faults.clear()
        assert_nothing_running(emu)
    print(f"failover fault loop (seed {seed}): {counts}, pods created: runpod {len(rp.ledger.created())}, "
          f"vast {len(vast.ledger.created())}, left billing: 0")
    assert counts["working"] + counts["failed"] == LAUNCHES
