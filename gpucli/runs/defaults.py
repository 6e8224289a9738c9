"""The launch defaults, in one place: the CLI leaves an option unset and the core fills it from here,
so `launch` and `resume` (which re-reads a record's launch inputs) can never disagree."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchDefaults:
    provider: str = "local"
    phase: str = "fast"
    cpu_model: str = "tiny"  # the model preset on a CPU profile
    gpu_model: str = "124m"  # the model preset on a GPU profile
    disk_gb: int = 50  # cloud pods
    ready_timeout_s: float = 600.0  # per offer tried, until the pod answers SSH
    stall_minutes: float = 30.0  # the watchdog ends a run with no new metrics row for this long
    idle_stop_minutes: float = 30.0  # ... or whose GPUs all sit at or under 5 % this long (--idle-stop)
    slow_below: float = 0.7  # a run under this share of its planned tokens/s is slow (--slow-below)
    on_end: str = "stop"  # what the watchdog does to a cloud pod when the run is over: stop | terminate
    watch_poll_s: float = 30.0  # `gpucli watch` and `launch --recover`
    max_resumes: int = 5  # `watch --recover` gives up after this many preemptions

    def model_for(self, has_gpu: bool) -> str:
        return self.gpu_model if has_gpu else self.cpu_model


DEFAULTS = LaunchDefaults()
ON_END_CHOICES = ("stop", "terminate")
