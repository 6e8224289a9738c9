"""`--profile NxGPU` for any catalogue GPU and count, its batch split derived as the named profiles are."""

from __future__ import annotations

import dataclasses

import pytest

from gpucli.errors import UnknownNameError, UsageError
from gpucli.plan.catalog import load_catalog
from tests.support.cli import cli


@pytest.mark.parametrize("left_out", ["4xA100", "4xH100", "8xA100", "8xH100"])
def test_the_rule_gives_back_each_named_profile(left_out):
    cat = load_catalog()
    named = cat.cluster_profiles[left_out]
    without = dataclasses.replace(cat, cluster_profiles={k: v for k, v in cat.cluster_profiles.items() if k != left_out})
    derived = without.cluster_for(cat.gpus[named.gpu], named.count)
    for phase, pb in named.phases.items():
        got = derived.phases[phase]
        assert (got.micro_batch, got.grad_accum) == (pb.micro_batch, pb.grad_accum), phase


def test_any_gpu_and_count():
    cat = load_catalog()
    p = cat.profile("8xH100-PCIe")
    assert (p.gpu, p.count, p.phases["fast"].micro_batch * p.phases["fast"].grad_accum * 8) == ("h100-pcie", 8, 512)
    p = cat.profile("4xRTX3090")
    assert (p.gpu, p.count) == ("rtx3090", 4)
    assert cat.profile("8xH100") is cat.cluster_profiles["8xH100"]
    with pytest.raises(UnknownNameError):
        cat.profile("4xH1000")
    with pytest.raises(UsageError):
        cat.profile("0xH100")


def test_launch_dry_run_on_a_derived_profile(capsys):
    code, out, err = cli(capsys, "launch", "--dry-run", "--provider", "runpod", "--profile", "4xRTX3090",
                         "--model", "124m")
    assert code == 0, err
    assert "4x RTX 3090 (4xRTX3090, phase fast)" in out
