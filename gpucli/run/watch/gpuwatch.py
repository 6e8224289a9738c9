"""GPU use of a run, as the pod-side sampler (``gpucli/pod/gpustats.py``) records it in ``gpu.jsonl``:
started next to the job on every GPU launch (the bundled trainer and your own code alike), read by
``status`` and ``tail``. :func:`report` is pure: the last sample per GPU, and whether the GPUs have sat
idle (under :data:`IDLE_UTIL` % for :data:`IDLE_WINDOW_S` by the pod's own clock) while the job runs:
a data or setup stall that is being paid for."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError
from gpucli.runs import podfiles

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.run.inputs.launch import ResolvedLaunch
    from gpucli.runs.records import RunRecord

SAMPLER = podfiles.GPU_SAMPLER.file("gpustats.py").path
FILE = "gpu.jsonl"
IDLE_UTIL = 20.0
IDLE_WINDOW_S = 300.0
INTERVAL_S = 10.0
TAIL_BYTES = 256 << 10  # the end of gpu.jsonl that is read: ~30 min of 8 GPUs at 10 s


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    util: float | None  # %
    mem_used_mib: float | None
    mem_total_mib: float | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: float | None


@dataclass(frozen=True)
class GpuReport:
    at: float | None  # the pod's clock (epoch s) of the last sample
    gpus: tuple[GpuSample, ...]
    idle_s: float | None  # how long every GPU has been under IDLE_UTIL % (None: not idle now)
    error: str | None = None  # nvidia-smi missing or failing on the host

    @property
    def idle_warning(self) -> str | None:
        if self.idle_s is None or self.idle_s < IDLE_WINDOW_S:
            return None
        return (f"GPUs idle: under {IDLE_UTIL:.0f}% for {self.idle_s / 60:.0f} min while the job runs "
                "(a data or setup stall you are paying for?)")


def start_sampler(host: Host, resolved: ResolvedLaunch, pid: int) -> int | None:
    """Upload and start the sampler beside the run folder (GPU runs only); its pid."""
    if resolved.gpu_id is None:
        return None
    wd = resolved.workdir
    podfiles.GPU_SAMPLER.write(host, wd)
    cmd = " ".join(shlex.quote(a) for a in (resolved.python, "gpustats.py", "--out", FILE, "--pid", str(pid),
                                              "--interval", f"{INTERVAL_S:g}"))
    return host.start_detached(cmd, cwd=wd, log_path=f"{wd}/gpustats.log")


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _gpu(d: Any) -> GpuSample | None:
    if not isinstance(d, dict) or not isinstance(d.get("index"), int) or isinstance(d.get("index"), bool):
        return None
    name = d.get("name")
    return GpuSample(d["index"], (name if isinstance(name, str) else "?")[:80], _num(d.get("util")),
                     _num(d.get("mem_used_mib")), _num(d.get("mem_total_mib")), _num(d.get("power_w")),
                     _num(d.get("power_limit_w")), _num(d.get("temp_c")))


def parse_rows(data: bytes) -> list[dict]:
    rows = []
    for line in data.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and _num(row.get("t")) is not None:
            rows.append(row)
    return rows


def report(rows: list[dict], *, running: bool = True) -> GpuReport | None:
    """The last sample, and how long the GPUs have been idle (pod clock), from the sampler's rows."""
    if not rows:
        return None
    last = rows[-1]
    if "error" in last and not last.get("gpus"):
        return GpuReport(at=_num(last["t"]), gpus=(), idle_s=None, error=str(last["error"])[:300])
    samples = [(float(r["t"]), [g for g in map(_gpu, r.get("gpus") or []) if g is not None])
               for r in rows if isinstance(r.get("gpus"), list)]
    samples = [(t, gs) for t, gs in samples if gs]
    if not samples:
        return None
    t_last, gpus = samples[-1]
    idle_since = None
    for t, gs in reversed(samples):
        utils = [g.util for g in gs if g.util is not None]
        if not utils or max(utils) >= IDLE_UTIL:
            break
        idle_since = t
    idle_s = (t_last - idle_since) if running and idle_since is not None else None
    return GpuReport(at=t_last, gpus=tuple(gpus), idle_s=idle_s)


def read_report(host: Host, record: RunRecord) -> GpuReport | None:
    """The run's report from the end of its gpu.jsonl (bounded); None when there is none."""
    path = shlex.quote(f"{record.workdir}/{FILE}")
    try:
        res = host.run(f"test -f {path} && tail -c {TAIL_BYTES} {path}", timeout_s=20, check=False)
    except GpucliError:
        return None
    if res.exit_code != 0:
        return None
    rows = parse_rows(res.stdout.encode())
    return report(rows, running=record.active)
