"""The preflight: the rented machine checked before the long run is detached, with a deadline.

For the bundled trainer it is ``trainer/preflight.py`` run on the host from the run's own folder, on the
run's own run.yaml, with the run's GPUs (torchrun on several): the torch build knows the GPU, a bf16
matmul reaches the share of the GPU's catalogue peak its family's healthy machines reach
(``gpucli/profiles/health.yaml``), one all-reduce across the GPUs, the disk's write speed, then a few
optimizer steps of the real configuration in a folder of its own (no checkpoint the run's
``--resume auto`` would take). For your own code it is your ``--preflight CMD``, run by the job runner
after ``--setup`` and before ``--run`` (``gpucli/pod/jobrun.py``).

A failure is one line (what failed, why, what to change, what the machine cost); the launch then ends the
machine as every failed launch does (:func:`gpucli.run.life.lifecycle.cleanup_failed`). A pass puts the
figures in the run record (``status`` shows them) and the measured tokens/s and peak memory in
``GPUCLI_HOME/calibration.yaml``, so every run teaches the planner its GPU. ``--no-preflight`` skips it.

Before the trainer's checks, nvidia-smi's view of the host (:func:`check_smi`: the GPUs, uncorrected ECC,
clocks, memory repairs pending or failed, the kernel log's hardware XIDs where it is readable) and, for data
downloaded on the host, its download rate from the data's source (:mod:`gpucli.run.starting.dataprobe`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError, UsageError
from gpucli.plan.catalog import load_catalog
from gpucli.plan.parse import match_gpu_name
from gpucli.run.host.calibrate import append_entry
from gpucli.run.host.untrusted import parse_json
from gpucli.run.starting import dataprobe
from gpucli.runs.health import (
    MEMORY_COMMAND,
    SMI_COMMAND,
    XID_COMMAND,
    Preflight,
    memory_check,
    smi_check,
    thresholds,
    xid_check,
)
from gpucli.runs.records import RunRecord
from gpucli.settings import home

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.run.inputs.launch import ResolvedLaunch

EventFn = Callable[[str], None]
FOLDER = "preflight"  # beside the run's checkpoints, never inside them
STEPS, WARMUP = 3, 2  # measured steps after the warm-up ones (compile, the allocator's first growth)
DEFAULT_TIMEOUT_S = 900.0  # data preparation and a big model's compile included
RESULT_RE = re.compile(r"^result_rank(\d+)\.json$")


class PreflightFailed(GpucliError):
    """The machine or the run's configuration failed its preflight: the launch ends the machine, and
    keeps ``preflight`` (what was measured) in the failed run's record."""

    def __init__(self, message: str, *, hint: str | None = None, preflight: Preflight | None = None) -> None:
        super().__init__(message, hint=hint)
        self.preflight = preflight


def timeout_s() -> float:
    """``GPUCLI_PREFLIGHT_TIMEOUT_S``: how long the preflight may take on the host (default 900 s)."""
    text = os.environ.get("GPUCLI_PREFLIGHT_TIMEOUT_S", "")
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"GPUCLI_PREFLIGHT_TIMEOUT_S must be a positive number of seconds, got '{text}'")
    return value


def trainer_command(resolved: ResolvedLaunch, deadline_s: float) -> str:
    """The line run from ``wd/code``: ``trainer.preflight`` on the run's run.yaml, its GPUs under torchrun,
    held to the GPU's catalogue peak and its family's bar."""
    py = shlex.quote(resolved.python)
    args = ["--config", "../run.yaml", "--out", f"../{FOLDER}", "--steps", str(STEPS), "--warmup", str(WARMUP),
            "--deadline-s", f"{deadline_s:g}"]
    if resolved.gpu_id is not None:
        gpu = load_catalog().gpus[resolved.gpu_id]
        bar = thresholds(gpu.architecture)
        args += ["--peak-tflops", f"{gpu.bf16_dense_tflops:g}", "--min-share", f"{bar.min_matmul_share:g}",
                 "--gpus", str(resolved.n_gpus)]
    run = f"{py} -m torch.distributed.run --standalone --nproc_per_node={resolved.n_gpus} -m trainer.preflight" \
        if resolved.n_gpus > 1 else f"{py} -m trainer.preflight"
    return f"{run} {' '.join(shlex.quote(a) for a in args)}"


def check_trainer(host: Host, resolved: ResolvedLaunch, record: RunRecord, *, on_event: EventFn,
                  save: Callable[[RunRecord], Any]) -> RunRecord:
    """The bundled trainer's preflight on ``host`` (its run.yaml and env file written): the record with
    its figures, or :class:`PreflightFailed`."""
    if resolved.preflight is None:
        on_event("preflight skipped (--no-preflight): the machine is not checked before the run")
        return record
    if resolved.nodes > 1:
        # Each node's machine as nvidia-smi sees it (its GPUs, ECC, memory repairs, XIDs, clocks): a bad node
        # ends the launch before the run, and a failover tries the next option. The steps are not run: this
        # run's configuration needs every node's GPUs at once, which the run's own start checks.
        smi = check_smi(host, resolved)
        if smi is None:
            on_event("preflight: this node's GPUs not checked (no GPU in the profile, or no nvidia-smi answer); "
                     "each node's trainer checks its own start")
            return record
        where = f"node {record.ssh.host}:{record.ssh.port}" if record.ssh is not None else "a node"
        return _verdict(smi, record, save=save, on_event=on_event, what=f"{where}'s", keep=resolved.keep_unhealthy)
    smi = check_smi(host, resolved)
    if smi is not None and not smi.ok:  # a bad host: said before the longer checks (kept only by --force here)
        record = _verdict(smi, record, save=save, on_event=on_event, what="the machine's", keep=resolved.keep_unhealthy)
    download = check_download(host, resolved)
    if download is not None and not download.ok:
        record = _verdict(dataclasses.replace(download, **_smi_figures(smi)), record, save=save, on_event=on_event,
                          what="the machine's", keep=resolved.keep_unhealthy)
    deadline = timeout_s()
    wd = shlex.quote(resolved.workdir)
    sample = ""
    if resolved.data_plan is not None:
        # The run's data is fetched by the detached job (gpucli/pod/fetch.py), after this: the steps read a
        # sample of the demo corpus, prepared with the run's own tokenizer settings, in the preflight's folder.
        sample = f" --data.dir=../{FOLDER}/data --data.inputs=[] --data.max_bytes=2000000"
    on_event(f"preflight: the machine (GPU, matmul, all-reduce, disk) and {STEPS} steps of this run's "
             f"configuration{' (on a sample: the data is fetched after it)' if sample else ''} "
             f"(at most {deadline:g} s)")
    host.run(f"rm -rf -- {wd}/{FOLDER} && mkdir -p -- {wd}/{FOLDER}", timeout_s=60)
    cmd = (f"cd {wd}/code && set -a && . ../env && set +a && "
           f"{trainer_command(resolved, deadline)}{sample} > ../{FOLDER}.log 2>&1")
    try:
        code: int | None = host.run(cmd, timeout_s=deadline + 60, check=False).exit_code
    except GpucliError:  # no answer past the deadline: the host (or the link to it) is stuck
        code = None
    result = _read_results(host, resolved.workdir, code, deadline)
    # nvidia-smi's figures and the download rate join the trainer's in the record
    result = dataclasses.replace(result, **_smi_figures(smi), **_download_figures(download))
    if result.ok and result.device == "cuda" and resolved.gpu_id is not None:
        # The model as rented: said, not refused, until lent GPUs confirm the catalogue's names for each one.
        seen = match_gpu_name(load_catalog().gpus, result.gpu_name or "")
        if seen is not None and seen.id != resolved.gpu_id:
            on_event(f"preflight: rented {resolved.gpu_name}, the host's GPU reads as {result.gpu_name} ({seen.name})")
    return _verdict(result, record, save=save, on_event=on_event, what="the trainer's",
                    keep=resolved.keep_unhealthy)


_SMI_FIELDS = ("smi_gpus", "smi_gpu", "ecc_uncorrected", "hw_slowdown", "retired_pending", "remap_pending",
               "remap_failed", "memory_check", "xid_errors", "xid_log")
_DOWNLOAD_FIELDS = ("download_mb_s", "download_gb", "download_eta_s")


def _smi_figures(smi: Preflight | None) -> dict[str, Any]:
    return {} if smi is None else {k: getattr(smi, k) for k in _SMI_FIELDS}


def _download_figures(download: Preflight | None) -> dict[str, Any]:
    return {} if download is None else {k: getattr(download, k) for k in _DOWNLOAD_FIELDS}


def check_download(host: Host, resolved: ResolvedLaunch) -> Preflight | None:
    """The host's download rate from the run's data source, held to health.yaml's bars (stage
    ``download``); None where the data is not downloaded on the host."""
    if resolved.data is None:
        return None
    family = load_catalog().gpus[resolved.gpu_id].architecture if resolved.gpu_id is not None else None
    probe = dataprobe.measure(host, resolved.data, python=resolved.python, env_file=f"{resolved.workdir}/env",
                              bars=thresholds(family), max_hours=resolved.limits.max_hours)
    if probe is None:
        return None
    return Preflight(ok=probe.ok, stage=None if probe.ok else "download", error=probe.error,
                     fix=None if probe.ok else "another machine, nearer the data; or put the data on a volume "
                     "(--volume) or on the machine (--data pod:/path)",
                     download_mb_s=probe.mb_s, download_gb=probe.data_gb, download_eta_s=probe.eta_s)


def check_smi(host: Host, resolved: ResolvedLaunch) -> Preflight | None:
    """The host's GPUs as nvidia-smi lists them, held to the rent and health.yaml's bars, then its memory
    repairs (``nvidia-smi -q``) and the kernel log's XIDs; None where the profile has no GPU or the host
    has no working nvidia-smi (the trainer's check then says whether torch sees a GPU)."""
    if resolved.gpu_id is None:
        return None
    try:
        res = host.run(f"command -v nvidia-smi >/dev/null 2>&1 && {SMI_COMMAND}", timeout_s=60, check=False)
    except GpucliError:
        return None
    if res.exit_code != 0 or not res.stdout.strip():
        return None
    gpus = load_catalog().gpus
    gpu = gpus[resolved.gpu_id]
    seen = match_gpu_name(gpus, res.stdout.splitlines()[0].split(",")[0])
    bars = thresholds(gpu.architecture)
    found = smi_check(res.stdout, rented=gpu.name, rented_count=resolved.n_gpus,
                      same_model=None if seen is None else seen.id == gpu.id, bars=bars)
    for command, check in ((MEMORY_COMMAND, memory_check), (XID_COMMAND, xid_check)):
        try:
            more = check(host.run(command, timeout_s=60, check=False).stdout, bars)
        except GpucliError:  # no answer: said, never a pass
            more = (Preflight(ok=True, memory_check="no answer") if check is memory_check else
                    Preflight(ok=True, xid_log="not readable here (no answer)"))
        figures = {k: v for k, v in more.to_json().items() if k in _SMI_FIELDS}
        found = dataclasses.replace(found, **figures)
        if found.ok and not more.ok:
            found = dataclasses.replace(found, ok=False, stage=more.stage, error=more.error, fix=more.fix)
    return found


def _read_results(host: Host, workdir: str, code: int | None, deadline: float) -> Preflight:
    """Every rank's verdict: the first failure (lowest rank), else rank 0's figures."""
    results: dict[int, Preflight] = {}
    try:
        names = host.list_files(f"{workdir}/{FOLDER}")
    except GpucliError:
        names = {}
    for name in sorted(names):
        m = RESULT_RE.match(name)
        if m:
            try:
                data = parse_json(host.read_file(f"{workdir}/{FOLDER}/{name}"), name)
            except GpucliError:
                continue
            results[int(m.group(1))] = Preflight.from_json(data)
    # A rank's own cause (an OOM on rank 3) before the ranks that only waited for it until the deadline.
    failed = sorted((results[r] for r in sorted(results) if not results[r].ok),
                    key=lambda p: (p.error or "").startswith("did not finish"))
    if failed:
        return failed[0]
    if 0 in results and code == 0:
        return results[0]
    why = f"no answer within {deadline + 60:g} s" if code is None else f"exit {code} without a verdict"
    return Preflight(ok=False, stage="start", error=f"the preflight ended with {why}: {_log_tail(host, workdir)}",
                     fix=f"see {FOLDER}.log in the run's folder")


def _log_tail(host: Host, workdir: str) -> str:
    try:
        lines = [s for s in host.read_file(f"{workdir}/{FOLDER}.log").decode(errors="replace").splitlines() if s.strip()]
    except GpucliError:
        return "no log"
    return lines[-1][-300:] if lines else "an empty log"


def check_own(host: Host, resolved: ResolvedLaunch, record: RunRecord, *, on_event: EventFn,
              save: Callable[[RunRecord], Any]) -> RunRecord:
    """Your own ``--preflight CMD``'s verdict (``wd/preflight.json``, written by the job runner once the
    command is over): the record with it, or :class:`PreflightFailed`. A runner that failed before the
    command ran (its ``--setup``) leaves no verdict: the record is returned as it was."""
    path = f"{resolved.workdir}/preflight.json"
    if not host.exists(path):
        return record
    try:
        result = Preflight.from_json(parse_json(host.read_file(path), "preflight.json"))
    except GpucliError as exc:
        result = Preflight(ok=False, stage="command", error=str(exc))
    if not result.ok:
        code = result.exit_code
        error = f"did not finish in {timeout_s():g} s" if code == 124 else f"exit {code}"
        result = Preflight(**{**result.to_json(), "stage": "command", "error": f"`{result.command}` {error}",
                              "fix": "see `gpucli tail` or train.log in the run's folder; --no-preflight skips it"})
    return _verdict(result, record, save=save, on_event=on_event, what="your")


#: Stages that measure the machine rather than the run's configuration (health.yaml's bars)
MACHINE_STAGES = frozenset({"smi", "gpus", "matmul", "h2d", "allreduce", "disk", "download"})


def _verdict(result: Preflight, record: RunRecord, *, save: Callable[[RunRecord], Any], on_event: EventFn,
             what: str, keep: bool = False) -> RunRecord:
    record = record.with_(preflight=result)
    save(record)
    if not result.ok and keep and result.stage in MACHINE_STAGES:  # your own machine, --force: said, kept
        on_event(f"preflight: this machine is below the health bars ({result.stage}: {result.error}); "
                 "running anyway (--force)")
        return record
    if not result.ok:
        raise PreflightFailed(f"{what} preflight failed ({result.stage}): {result.error}{_cost(record)}",
                              hint=result.fix, preflight=result)
    on_event(f"preflight passed: {result.line}")
    entry = calibration_entry(record, result)
    if entry is not None:
        append_entry(home() / "calibration.yaml", entry)
        on_event("preflight: its tokens/s and peak memory are in calibration.yaml "
                 + ("(the planner uses them for this GPU)" if entry["gpu"] != "cpu" else "(a CPU: not planned with)"))
    return record


def _cost(record: RunRecord) -> str:
    """What the machine has cost so far (it ends with the failed launch)."""
    cost, price = record.cost_until_now(), record.price_per_hour_usd
    if cost is None or not price:
        return ""
    return f"; the machine cost ${cost:.2f} ({cost / price * 60:.0f} min at ${price:.2f}/h)"


def calibration_entry(record: RunRecord, p: Preflight) -> dict[str, Any] | None:
    """The preflight's steps as a calibration entry (the fields ``gpucli calibrate`` writes), or None when
    it ran no steps. Measured on a CPU it says ``gpu: cpu`` (kept, never planned with), whatever the profile;
    on a GPU the catalogue does not know by the name torch gives it, nothing is written (the planner would
    refuse the file)."""
    if not p.ok or p.tokens_per_s is None or not p.model_shape:
        return None
    gpu = "cpu"
    if p.device == "cuda":
        known = match_gpu_name(load_catalog().gpus, p.gpu_name or "")
        if known is None:
            return None
        gpu = known.id
    return {
        "workload": "train", "gpu": gpu,
        "gpu_count": p.world or record.n_gpus, "model": {"name": record.model, **p.model_shape},
        "seq_len": p.seq_len, "micro_batch": p.micro_batch, "precision": "bf16" if p.device == "cuda" else "fp32",
        "compile": p.compile not in (None, "off"), "tokens_per_s": p.tokens_per_s,
        "mfu": round(p.mfu, 4) if p.mfu is not None else None, "peak_mem_gib": p.peak_mem_gib,
        "date": dt.date.today().isoformat(),
        "source": f"preflight of run {record.name} ({p.steps} steps after {WARMUP} warm-up; fp8 {bool(p.fp8)}, "
                  f"fsdp {bool(p.fsdp)})",
    }
