"""Before the pod's end action: the checkpoint store's uploader (gpucli/store/storesync.py) sends what is
left. The watchdog loads this file by path when the launch put it beside it (a run with ``--store``);
standard library only, like the watchdog."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

#: How long the end action waits for the store's uploader to send the last checkpoints
#: (GPUCLI_STORE_FLUSH_S in the env file): a final checkpoint is worth some minutes of a stopped run.
STORE_FLUSH_S = 900.0
#: An uploader that has not said anything this long after the job ended is not coming (it writes its state
#: before it opens the store).
START_S = 60.0


def wait_for_store(run_dir: Path, *, log: Callable[[str], None], alive: Callable[[int], bool]) -> None:
    """When the run uploads to a store, ask its uploader to send everything left (``storesync.flush``)
    and wait until it says ``flushed``, it is gone, or the deadline: the pod's end action runs after."""
    state_file = run_dir / "storesync.json"
    if not state_file.exists() and not (run_dir / "storesync.sh").exists():
        return  # no store for this run
    try:
        cap_s = float(os.environ.get("GPUCLI_STORE_FLUSH_S") or STORE_FLUSH_S)
    except ValueError:
        cap_s = STORE_FLUSH_S
    (run_dir / "storesync.flush").write_text(f"{time.time():.0f}\n")
    log(f"waiting up to {cap_s:g} s for the store's uploader to send the last checkpoints")
    started = time.monotonic()
    deadline = started + cap_s
    while time.monotonic() < deadline:
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            state = {}
        if not state and time.monotonic() - started > START_S:
            log(f"the store's uploader never started ({START_S:g} s): see storesync.out")
            return
        pid = state.get("pgid") if isinstance(state, dict) else None  # its process group: what `alive` tests
        if isinstance(state, dict) and state.get("state") in ("flushed", "failed"):
            left = state.get("left") or []
            log("the store has every checkpoint" if not left and state.get("state") == "flushed"
                else f"the store is missing {len(left)} checkpoint(s): see storesync.log")
            return
        if isinstance(pid, int) and not alive(pid):
            log("the store's uploader is gone: see storesync.log")
            return
        time.sleep(1.0)
    log(f"the store's uploader did not finish in {cap_s:g} s: ending the pod anyway")
