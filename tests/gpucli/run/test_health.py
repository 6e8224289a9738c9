"""The preflight's record (gpucli/runs/health.py) and the bars per GPU family (gpucli/profiles/health.yaml)."""

from __future__ import annotations

import pytest

from gpucli.errors import CatalogError
from gpucli.plan.catalog import load_catalog
from gpucli.run.starting.preflight import calibration_entry
from gpucli.runs import records as runs
from gpucli.runs.health import Preflight, thresholds


def test_every_catalogue_family_has_a_bar_between_0_and_1():
    for gpu in load_catalog().gpus.values():
        bar = thresholds(gpu.architecture)
        assert bar.family == gpu.architecture and 0 < bar.min_matmul_share < 1
    assert thresholds("Volta").family == "default" and thresholds(None).family == "default"


def test_a_bad_bar_is_one_line(tmp_path):
    path = tmp_path / "health.yaml"
    path.write_text("default: {min_matmul_share: 0.4}\nfamilies: {Hopper: {min_matmul_share: 2}}\n")
    with pytest.raises(CatalogError, match="Hopper.min_matmul_share"):
        thresholds("Hopper", path)


def test_a_pods_result_is_read_field_by_field():
    pf = Preflight.from_json({"ok": True, "tokens_per_s": "fast", "peak_mem_gib": 3, "steps": 3.5, "fp8": "yes",
                              "gpu_name": "NVIDIA H100 80GB HBM3", "matmul_tflops": float("nan"),
                              "model_shape": {"d_model": 64, "x": "y"}, "unknown": 1})
    assert pf.ok and pf.tokens_per_s is None and pf.peak_mem_gib == 3.0 and pf.steps is None and pf.fp8 is None
    assert pf.matmul_tflops is None and pf.model_shape == {"d_model": 64} and pf.gpu_name == "NVIDIA H100 80GB HBM3"
    assert not Preflight.from_json(["not", "a", "result"]).ok


def test_the_record_keeps_it():
    pf = Preflight(ok=True, device="cuda", gpu_name="NVIDIA H100 80GB HBM3", tokens_per_s=1e5, peak_mem_gib=40.0,
                   matmul_tflops=700.0, peak_tflops=989.5, matmul_share=0.707, steps=3)
    record = runs.RunRecord(name="pf", provider="local", created_at=runs.now_iso(), profile="h100", phase="fast",
                            model="124m", n_gpus=1, gpu="h100", workdir="/tmp/x", preflight=pf)
    runs.save(record)
    assert runs.load("pf").preflight == pf
    assert "71% of 989.5" in pf.line
    runs.save(record.with_(preflight=None))
    assert "preflight" not in (runs.runs_dir() / "pf.json").read_text()


def test_a_gpu_calibration_entry_names_the_gpu_the_catalogue_knows():
    record = runs.RunRecord(name="pf", provider="runpod", created_at=runs.now_iso(), profile="h100", phase="fast",
                            model="124m", n_gpus=1, gpu="h100", workdir="/w")
    shape = {"d_model": 768, "n_layers": 12, "n_heads": 12, "d_ff": 3072, "vocab_size": 50304}
    pf = Preflight(ok=True, device="cuda", gpu_name="NVIDIA H100 80GB HBM3", tokens_per_s=4e5, peak_mem_gib=30.0,
                   steps=3, world=1, seq_len=1024, micro_batch=16, compile="blocks", model_shape=shape, mfu=0.4)
    entry = calibration_entry(record, pf)
    assert entry is not None and entry["gpu"] == "h100-sxm" and entry["compile"] is True
    assert entry["precision"] == "bf16" and entry["tokens_per_s"] == 4e5
    unknown = Preflight(**{**pf.to_json(), "gpu_name": "NVIDIA Something New"})
    assert calibration_entry(record, unknown) is None  # never a file the planner would refuse


def test_nvidia_smi_is_held_to_the_rent_and_the_bars():
    from gpucli.runs.health import smi_check

    bars = thresholds("Ampere")
    healthy = "NVIDIA A100-SXM4-80GB, 0, Not Active\n" * 8
    ok = smi_check(healthy, rented="A100 80GB", rented_count=8, same_model=True, bars=bars)
    assert ok.ok and ok.smi_gpus == 8 and ok.ecc_uncorrected == 0 and ok.hw_slowdown == 0
    assert "nvidia-smi 8x NVIDIA A100-SXM4-80GB, 0 ECC errors" in Preflight(ok=True, smi_gpus=8, smi_gpu=ok.smi_gpu,
                                                                          ecc_uncorrected=0).line
    short = smi_check("NVIDIA A100-SXM4-80GB, 0, Not Active\n" * 7, rented="A100 80GB", rented_count=8, same_model=True, bars=bars)
    assert not short.ok and short.stage == "smi" and "lists 7 GPUs, 8 were rented" in (short.error or "")
    ecc = smi_check(healthy.replace(", 0,", ", 2,", 1), rented="A100 80GB", rented_count=8, same_model=True, bars=bars)
    assert not ecc.ok and "2 uncorrected ECC errors" in (ecc.error or "")
    slow = smi_check(healthy.replace("Not Active", "Active", 1), rented="A100 80GB", rented_count=8, same_model=True,
                     bars=bars)
    assert not slow.ok and "hardware slowdown" in (slow.error or "")
    other = smi_check(healthy, rented="H100 SXM", rented_count=8, same_model=False, bars=bars)
    assert not other.ok and "H100 SXM was rented" in (other.error or "")
    no_ecc = smi_check("NVIDIA GeForce RTX 4090, [N/A], Not Active\n", rented="RTX 4090", rented_count=1,
                       same_model=True, bars=thresholds("Ada Lovelace"))
    assert no_ecc.ok and no_ecc.ecc_uncorrected == 0


# nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT as the driver prints it (the layout of nvidia-smi's -q
# display: one block per "GPU <PCI bus id>" line, sections indented under it)
SMI_Q = """
==============NVSMI LOG==============

Timestamp                                 : Thu Nov 27 10:00:00 2026
Driver Version                            : 570.86.15
CUDA Version                              : 12.8

Attached GPUs                             : 2
GPU 00000000:17:00.0
    Retired Pages
        Single Bit ECC                    : N/A
        Double Bit ECC                    : N/A
        Pending Page Blacklist            : N/A
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 0
        Pending                           : {pending}
        Remapping Failure Occurred        : {failed}

GPU 00000000:18:00.0
    Retired Pages
        Single Bit ECC                    : N/A
        Double Bit ECC                    : N/A
        Pending Page Blacklist            : N/A
    Remapped Rows
        Correctable Error                 : 3
        Uncorrectable Error               : 0
        Pending                           : No
        Remapping Failure Occurred        : No
"""


def test_memory_repairs_pending_or_failed_refuse_the_machine():
    from gpucli.runs.health import memory_check

    bars = thresholds("Hopper")
    ok = memory_check(SMI_Q.format(pending="No", failed="No"), bars)
    assert ok.ok and (ok.remap_pending, ok.remap_failed, ok.retired_pending) == (0, 0, 0) and ok.memory_check == "read"
    assert "memory repairs: 0 pending, 0 failed" in ok.line
    pending = memory_check(SMI_Q.format(pending="Yes", failed="No"), bars)
    assert not pending.ok and pending.stage == "smi" and pending.remap_pending == 1
    assert "memory repair pending until a GPU reset" in (pending.error or "")
    failed = memory_check(SMI_Q.format(pending="No", failed="Yes"), bars)
    assert not failed.ok and "failed row remapping" in (failed.error or "")
    older = memory_check("GPU 00000000:00:04.0\n    Retired Pages\n        Pending Page Retirement : Yes\n", bars)
    assert not older.ok and older.retired_pending == 1
    # a driver that answers something else (or nothing) is said, never counted as a pass of the check
    unknown = memory_check("NVIDIA GeForce RTX 4090, 0, Not Active\n", bars)
    assert unknown.ok and unknown.memory_check.startswith("not readable here") and unknown.remap_pending is None


def test_hardware_xids_in_the_kernel_log_refuse_and_an_unreadable_log_is_said():
    from gpucli.runs.health import xid_check

    bars = thresholds("Ampere")
    log = ("[  812.1] NVRM: Xid (PCI:0000:17:00): 13, pid=4411, name=python, Graphics Exception\n"
           "[  913.4] NVRM: Xid (PCI:0000:17:00): 31, pid=4411, name=python, Ch 0000000a, MMU Fault\n")
    apps = xid_check(log, bars)  # an application's faults (13, 31) are not the machine's
    assert apps.ok and apps.xid_errors == 0 and apps.xid_log == "read"
    bus = xid_check(log + "[ 1000.0] NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.\n", bars)
    assert not bus.ok and bus.xid_errors == 1 and "1 hardware XID errors" in (bus.error or "")
    hidden = xid_check("UNREADABLE\n", bars)
    assert hidden.ok and hidden.xid_errors is None and hidden.xid_log == "not readable here"
    assert "XID: the kernel log is not readable here" in hidden.line


def test_the_download_rate_is_held_to_the_bar_and_to_the_runs_hours():
    from gpucli.run.starting.dataprobe import judge

    bars = thresholds(None)
    assert bars.min_download_mb_s == 5 and bars.max_download_share == 0.25
    fast = judge(80.0, 10.0, bars, max_hours=4.0)  # 10 GB at 80 MB/s: 125 s
    assert fast.ok and fast.eta_s == 125.0
    slow = judge(1.5, 10.0, bars, max_hours=4.0)
    assert not slow.ok and "1.5 MB/s here (the bar: 5 MB/s)" in (slow.error or "")
    long = judge(20.0, 100.0, bars, max_hours=2.0)  # 100 GB at 20 MB/s: 83 min, over a quarter of 2 h
    assert not long.ok and "over 25% of --hours 2" in (long.error or "")
    unknown = judge(20.0, None, bars, max_hours=2.0)  # the size not known: only the MB/s bar holds
    assert unknown.ok and unknown.eta_s is None
    line = Preflight(ok=True, download_mb_s=80.0, download_gb=10.0, download_eta_s=125.0).line
    assert "download 80 MB/s (the data 10.00 GB in 2.1 min)" in line


def test_health_file_download_bars_are_checked(tmp_path):
    bad = tmp_path / "health.yaml"
    bad.write_text("default:\n  min_matmul_share: 0.4\n  max_download_share: 2\n")
    with pytest.raises(CatalogError, match="max_download_share"):
        thresholds(None, bad)
