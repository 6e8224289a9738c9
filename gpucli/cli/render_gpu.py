"""GPU use (``gpucli status``, ``tail``): one line per GPU from the pod's nvidia-smi samples, and the
idle warning. Names come from the pod: shown as plain text, never markup."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gpucli.cli.render import out


def _n(v: float | None, fmt: str, unit: str = "") -> str:
    return "-" if v is None else f"{v:{fmt}}{unit}"


def gpu_line(g: Any) -> str:
    mem = "-" if g.mem_used_mib is None else (f"{g.mem_used_mib / 1024:.1f}" + (
        f"/{g.mem_total_mib / 1024:.0f}" if g.mem_total_mib else "") + " GiB")
    power = "-" if g.power_w is None else (f"{g.power_w:.0f}" + (
        f"/{g.power_limit_w:.0f}" if g.power_limit_w else "") + " W")
    return (f"GPU {g.index} {g.name}: util {_n(g.util, '.0f', '%')}, mem {mem}, power {power}, "
            f"{_n(g.temp_c, '.0f', ' C')}")


def summary(report: Any) -> str | None:
    """One line for a live footer: mean utilisation, memory and power over the GPUs."""
    if report is None or not report.gpus:
        return None
    utils = [g.util for g in report.gpus if g.util is not None]
    power = [g.power_w for g in report.gpus if g.power_w is not None]
    mem = [g.mem_used_mib for g in report.gpus if g.mem_used_mib is not None]
    parts = [f"{len(report.gpus)} GPU" + ("s" if len(report.gpus) > 1 else "")]
    if utils:
        parts.append(f"util {sum(utils) / len(utils):.0f}%")
    if mem:
        parts.append(f"mem {sum(mem) / 1024:.1f} GiB")
    if power:
        parts.append(f"{sum(power):.0f} W")
    return ", ".join(parts)


def print_gpus(report: Any) -> None:
    if report is None:
        return
    o = out()
    if report.error:
        o.print(f"GPUs: not sampled ({report.error})", markup=False, highlight=False)
        return
    when = dt.datetime.fromtimestamp(report.at, dt.timezone.utc).strftime("%H:%M:%S UTC") if report.at else "?"
    o.print(f"GPUs (nvidia-smi on the host at {when}, its clock):", markup=False, highlight=False)
    for g in report.gpus:
        o.print("  " + gpu_line(g), markup=False, highlight=False)
    warning = report.idle_warning
    if warning:
        from gpucli.cli.render import warn

        warn(warning)
