"""What the preflight measured on a run's machine, and what a healthy machine measures.

:class:`Preflight` is the run record's copy of the figures ``trainer/preflight.py`` (or the user's own
``--preflight`` command) reported before the run was detached; :class:`Thresholds` are the bars a
machine must pass, per GPU family (``gpucli/profiles/health.yaml``): nvidia-smi's GPUs, ECC errors, clocks
and memory repairs (:func:`smi_check`, :func:`memory_check`), the kernel log's XID errors where it is readable,
the download rate of the run's data (``gpucli/run/starting/dataprobe.py``), the trainer's matmul against the GPU's peak.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from gpucli.errors import CatalogError

HEALTH_FILE = Path(__file__).resolve().parents[1] / "profiles" / "health.yaml"


@dataclass(frozen=True)
class Preflight:
    """One preflight of a run: passed or not, the cause and fix when not, and every figure measured."""

    ok: bool
    seconds: float | None = None  # the whole preflight on the host, start to verdict
    stage: str | None = None  # where it failed: config, gpus, arch, matmul, allreduce, disk, steps, command
    error: str | None = None
    fix: str | None = None
    device: str | None = None  # cuda | cpu
    gpu_name: str | None = None  # as torch names it
    gpus_seen: int | None = None
    arch: str | None = None  # sm_90 ...
    torch: str | None = None
    cuda_build: str | None = None
    matmul_tflops: float | None = None  # bf16 on a GPU, fp32 on a CPU (matmul_dtype)
    matmul_dtype: str | None = None
    peak_tflops: float | None = None
    matmul_share: float | None = None
    min_share: float | None = None
    h2d_gbps: float | None = None  # a pinned host-to-GPU copy
    allreduce_backend: str | None = None
    allreduce_busbw_gbps: float | None = None
    disk_write_mb_s: float | None = None
    steps: int | None = None
    tokens_per_s: float | None = None
    peak_mem_gib: float | None = None
    mfu: float | None = None
    loss: float | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    seq_len: int | None = None
    world: int | None = None
    compile: str | None = None
    fp8: bool | None = None
    fsdp: bool | None = None
    model_shape: dict[str, int] | None = None
    smi_gpus: int | None = None  # GPUs nvidia-smi lists on the host
    smi_gpu: str | None = None  # their model, as nvidia-smi names it
    ecc_uncorrected: int | None = None  # uncorrected ECC errors since the driver loaded, all GPUs
    hw_slowdown: int | None = None  # GPUs whose clocks the hardware is holding down (power brake, heat)
    retired_pending: int | None = None  # GPUs with a page retirement waiting for a reset (pre-Ampere)
    remap_pending: int | None = None  # GPUs with a row remapping waiting for a reset (Ampere and later)
    remap_failed: int | None = None  # GPUs where a row remapping has failed (out of spare rows)
    memory_check: str | None = None  # "read", or why nvidia-smi -q could not say
    xid_errors: int | None = None  # the kernel log's hardware XID lines (None: the log is not readable here)
    xid_log: str | None = None  # "read", or "not readable here"
    download_mb_s: float | None = None  # the host's rate from the data's source (a bounded read)
    download_gb: float | None = None  # the data's size as sized before the launch
    download_eta_s: float | None = None  # the data's time at that rate
    command: str | None = None  # the user's own --preflight command
    exit_code: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: Any) -> Preflight:
        """From a result file or a record: fields of the wrong type are dropped (a pod's file is not trusted)."""
        if not isinstance(data, dict):
            return cls(ok=False, error="no preflight result")
        out: dict[str, Any] = {"ok": data.get("ok") is True}
        for f in dataclasses.fields(cls):
            value = data.get(f.name)
            if f.name == "ok" or value is None:
                continue
            kind = str(f.type)
            if f.name == "model_shape":
                if isinstance(value, dict):
                    out[f.name] = {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}
            elif "bool" in kind and isinstance(value, bool):
                out[f.name] = value
            elif "int" in kind and "dict" not in kind and isinstance(value, int) and not isinstance(value, bool):
                out[f.name] = value
            elif "float" in kind and isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                out[f.name] = float(value)
            elif "str" in kind and isinstance(value, str):
                out[f.name] = value[:500]
        return cls(**out)

    @property
    def line(self) -> str:
        """The figures in one line (status, the launch's progress)."""
        if not self.ok:
            return f"failed at {self.stage or '?'}: {self.error or 'no reason given'}"
        parts = []
        if self.command:
            parts.append(f"`{self.command}` exit 0")
        if self.device == "cpu":
            parts.append("no GPU (CPU)")
        elif self.gpu_name:
            parts.append(f"{self.gpus_seen or '?'}x {self.gpu_name} {self.arch or ''}".strip())
        if self.smi_gpus is not None:
            parts.append(f"nvidia-smi {self.smi_gpus}x {self.smi_gpu}, {self.ecc_uncorrected or 0} ECC errors"
                         + (f", {self.hw_slowdown} GPUs held down" if self.hw_slowdown else ""))
        if self.memory_check is not None:
            parts.append("memory repairs: " + (self.memory_check if self.memory_check != "read" else
                         f"{self.remap_pending or 0} pending, {self.remap_failed or 0} failed, "
                         f"{self.retired_pending or 0} page retirements pending"))
        if self.xid_log is not None:
            parts.append(f"XID: {self.xid_errors} hardware errors in the kernel log" if self.xid_errors is not None
                         else f"XID: the kernel log is {self.xid_log}")
        if self.download_mb_s is not None:
            eta = f" (the data {self.download_gb:.2f} GB in {self.download_eta_s / 60:.1f} min)" \
                if self.download_eta_s is not None and self.download_gb is not None else ""
            parts.append(f"download {self.download_mb_s:g} MB/s{eta}")
        if self.matmul_tflops is not None:
            share = f" = {self.matmul_share:.0%} of {self.peak_tflops:g}" if self.matmul_share is not None else ""
            parts.append(f"{self.matmul_dtype or ''} matmul {self.matmul_tflops:.3g} TFLOPS{share}".strip())
        if self.h2d_gbps is not None:
            parts.append(f"host-to-GPU {self.h2d_gbps:.3g} GB/s")
        if self.allreduce_busbw_gbps is not None:
            parts.append(f"all-reduce {self.allreduce_busbw_gbps:.3g} GB/s ({self.allreduce_backend})")
        if self.disk_write_mb_s is not None:
            parts.append(f"disk {self.disk_write_mb_s:.0f} MB/s")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tok/s over {self.steps} steps")
        if self.peak_mem_gib is not None:
            parts.append(f"peak {self.peak_mem_gib:.2f} GiB")
        if self.seconds is not None:
            parts.append(f"{self.seconds:.0f} s")
        return ", ".join(parts)


@dataclass(frozen=True)
class Thresholds:
    """The bars one GPU family's machine must pass (health.yaml)."""

    family: str
    min_matmul_share: float
    max_ecc_uncorrected: int = 0
    refuse_hw_slowdown: bool = True
    refuse_memory_pending: bool = True  # a row remapping or page retirement waiting for a reset
    refuse_remap_failure: bool = True
    max_xid_errors: int = 0  # hardware XIDs (HARDWARE_XIDS) in the kernel log, where it is readable
    min_download_mb_s: float = 5.0
    max_download_share: float = 0.25  # of --hours, for the data's download at the measured rate


@cache
def _health_file(path: Path = HEALTH_FILE) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("default"), dict):
        raise CatalogError(path.name, "default", "expected a mapping of bars")
    return data


def thresholds(family: str | None, path: Path = HEALTH_FILE) -> Thresholds:
    """The bars for a GPU family (gpus.yaml ``architecture``), or the default ones."""
    data = _health_file(path)
    families = data.get("families") or {}
    row = families.get(family) if isinstance(families, dict) and family else None
    name = family if isinstance(row, dict) and family else "default"
    merged = {**data["default"], **(row if isinstance(row, dict) else {})}
    share = merged.get("min_matmul_share")
    if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share < 1:
        raise CatalogError(path.name, f"{name}.min_matmul_share", "expected a share between 0 and 1")
    ecc = merged.get("max_ecc_uncorrected", 0)
    if not isinstance(ecc, int) or isinstance(ecc, bool) or ecc < 0:
        raise CatalogError(path.name, f"{name}.max_ecc_uncorrected", "expected a whole number, 0 or more")
    xid = merged.get("max_xid_errors", 0)
    if not isinstance(xid, int) or isinstance(xid, bool) or xid < 0:
        raise CatalogError(path.name, f"{name}.max_xid_errors", "expected a whole number, 0 or more")
    rate = merged.get("min_download_mb_s", 5.0)
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate < 0:
        raise CatalogError(path.name, f"{name}.min_download_mb_s", "expected MB/s, 0 or more")
    dl_share = merged.get("max_download_share", 0.25)
    if not isinstance(dl_share, (int, float)) or isinstance(dl_share, bool) or not 0 < dl_share <= 1:
        raise CatalogError(path.name, f"{name}.max_download_share", "expected a share above 0, at most 1")
    return Thresholds(family=name, min_matmul_share=float(share), max_ecc_uncorrected=ecc,
                      refuse_hw_slowdown=merged.get("refuse_hw_slowdown", True) is not False,
                      refuse_memory_pending=merged.get("refuse_memory_pending", True) is not False,
                      refuse_remap_failure=merged.get("refuse_remap_failure", True) is not False,
                      max_xid_errors=xid, min_download_mb_s=float(rate), max_download_share=float(dl_share))


#: The host's GPUs as its driver sees them, one CSV line each (nvidia-smi --help-query-gpu:
#: ``ecc.errors.uncorrected.volatile.total`` counts since the driver loaded; ``clocks_throttle_reasons.
#: hw_slowdown`` is "Active" while the hardware holds the clocks down, e.g. a power brake or overheating).
SMI_COMMAND = ("nvidia-smi --query-gpu=name,ecc.errors.uncorrected.volatile.total,"
               "clocks_throttle_reasons.hw_slowdown --format=csv,noheader,nounits")


def smi_check(text: str, *, rented: str, rented_count: int, same_model: bool | None, bars: Thresholds) -> Preflight:
    """nvidia-smi's answer held to the rent and the bars: ``ok`` with its figures, or the failure
    (stage ``smi``). ``same_model``: whether its model is the rented one (None: a name not in the catalogue)."""
    rows = [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]
    rows = [r for r in rows if len(r) >= 3]
    name = rows[0][0][:80] if rows else None

    def number(cell: str) -> int:  # "[N/A]" or "[Not Supported]" (ECC off, a consumer card): none counted
        return int(cell) if cell.isdigit() else 0

    ecc = sum(number(r[1]) for r in rows)
    slow = sum(1 for r in rows if r[2].lower() == "active")
    figures = Preflight(ok=True, smi_gpus=len(rows), smi_gpu=name, ecc_uncorrected=ecc, hw_slowdown=slow)
    error = None
    if len(rows) < rented_count:
        error = f"nvidia-smi lists {len(rows)} GPUs, {rented_count} were rented"
    elif same_model is False:
        error = f"nvidia-smi reads {name}, {rented} was rented"
    elif ecc > bars.max_ecc_uncorrected:
        error = f"{ecc} uncorrected ECC errors (the bar: {bars.max_ecc_uncorrected})"
    elif slow and bars.refuse_hw_slowdown:
        error = f"{slow} GPUs held down by a hardware slowdown (power brake or heat)"
    if error is None:
        return figures
    return dataclasses.replace(figures, ok=False, stage="smi", error=error, fix="another machine: this one is a bad host")


#: The GPUs' memory repairs (NVIDIA, "A100 GPU memory error management" and "Dynamic page retirement",
#: docs.nvidia.com/deploy): a row remapping (Ampere and later) or a page retirement (before) that is
#: pending takes effect only at the next GPU reset, and a remapping that failed means the bank is out of
#: spare rows (an RMA condition). ``-q -d`` is asked apart from SMI_COMMAND so that a driver that lacks a
#: section still answers the first query.
MEMORY_COMMAND = "nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT"
_GPU_HEADER = re.compile(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+\s*$", re.MULTILINE)

#: XIDs the driver logs for the GPU's hardware, not an application's fault (NVIDIA's XID catalogue and the
#: A100 memory error management guide): 48 double-bit ECC, 63/64 a row remapping or page retirement
#: recorded or failed, 74 NVLink, 79 the GPU fell off the bus, 92 high single-bit ECC rate, 94/95 a
#: contained/uncontained ECC error, 119/120 the GSP timed out or failed.
HARDWARE_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})

#: The kernel log's XID lines (``NVRM: Xid (PCI:...): 79, ...``); a container usually may not read it:
#: then the command prints UNREADABLE and the check says so rather than pass.
#: (/dev/kmsg never ends: read for 2 s, cut by timeout's 124, it was readable.)
XID_COMMAND = ("{ dmesg 2>/dev/null || { timeout 2 cat /dev/kmsg 2>/dev/null; [ $? -eq 124 ]; } "
               "|| echo UNREADABLE; } | grep -E 'NVRM: Xid|^UNREADABLE$' | tail -n 200")


def memory_check(text: str, bars: Thresholds) -> Preflight:
    """``nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT``'s answer held to the bars (stage ``smi``). A GPU
    that has neither section (a consumer card: "N/A") counts as none pending; an answer with no GPU in it
    is said as unreadable, never as a pass."""
    gpus = _GPU_HEADER.split(text)[1:]  # one block per "GPU 00000000:17:00.0" header line
    if not gpus:
        return Preflight(ok=True, memory_check="not readable here (nvidia-smi -q gave no GPU)")
    retired = remap_pending = remap_failed = 0
    for gpu in gpus:
        section = ""
        flags = {"retired": False, "remap": False, "failed": False}
        for raw in gpu.splitlines():
            line = raw.strip()
            if line in ("Retired Pages", "Remapped Rows"):
                section = line
                continue
            key, _, value = (c.strip() for c in line.partition(":"))
            yes = value.lower() == "yes"
            if section == "Retired Pages" and key.startswith("Pending") and yes:
                flags["retired"] = True  # "Pending Page Blacklist" (older drivers), "Pending Page Retirement"
            elif section == "Remapped Rows" and key == "Pending" and yes:
                flags["remap"] = True
            elif section == "Remapped Rows" and key.startswith("Remapping Failure") and yes:
                flags["failed"] = True
        retired += flags["retired"]
        remap_pending += flags["remap"]
        remap_failed += flags["failed"]
    figures = Preflight(ok=True, retired_pending=retired, remap_pending=remap_pending, remap_failed=remap_failed,
                        memory_check="read")
    error = None
    if remap_failed and bars.refuse_remap_failure:
        error = f"{remap_failed} GPUs with a failed row remapping (out of spare memory rows)"
    elif (remap_pending or retired) and bars.refuse_memory_pending:
        error = (f"{remap_pending + retired} GPUs with a memory repair pending until a GPU reset "
                 f"({remap_pending} row remappings, {retired} page retirements)")
    if error is None:
        return figures
    return dataclasses.replace(figures, ok=False, stage="smi", error=error, fix="another machine: this one is a bad host")


def xid_check(text: str, bars: Thresholds) -> Preflight:
    """The kernel log's XID lines (XID_COMMAND's output) held to ``max_xid_errors``; the log not readable
    here is said so, and passes only as not checked."""
    lines = text.splitlines()
    if any(line.strip() == "UNREADABLE" for line in lines):
        return Preflight(ok=True, xid_log="not readable here")
    hardware = 0
    for line in lines:
        _, _, rest = line.partition("NVRM: Xid")
        code = rest.partition("):")[2].strip().split(",")[0].strip()
        hardware += code.isdigit() and int(code) in HARDWARE_XIDS
    figures = Preflight(ok=True, xid_errors=hardware, xid_log="read")
    if hardware <= bars.max_xid_errors:
        return figures
    return dataclasses.replace(figures, ok=False, stage="smi", fix="another machine: this one is a bad host",
                               error=f"{hardware} hardware XID errors in the kernel log (the bar: {bars.max_xid_errors})")
