"""The disk a run's checkpoints need, planned before renting."""

import pytest

from gpucli.plan.disk import checkpoint_disk
from trainer.spec.presets import MODELS


def test_a_1_31b_checkpoint_matches_the_measured_file_sizes():
    # BENCHMARKS: a 1.31B checkpoint was 15.7 GB (model.pt 5.3 GB fp32 + 10.5 GB of AdamW moments);
    # model.safetensors beside model.pt adds the 5.3 GB of weights once more.
    d = checkpoint_disk(MODELS["1.31b"])
    assert d.weight_copies == 2 and d.weights_gb == pytest.approx(2 * 5.26, abs=0.01)
    assert d.optimizer_gb == pytest.approx(10.52, abs=0.01)
    assert d.checkpoint_gb == pytest.approx(21.04, abs=0.01)
    one = checkpoint_disk(MODELS["1.31b"], weight_copies=1)  # your own code: one weights file
    assert one.weights_gb == pytest.approx(5.26, abs=0.01) and one.checkpoint_gb == pytest.approx(15.78, abs=0.01)
    assert d.at_once == 5 and d.disk_gb == pytest.approx(5 * d.checkpoint_gb)


def test_muon_keeps_one_moment_for_the_block_matrices_and_fsdp_shards_it():
    spec = MODELS["1b"]
    p = spec.param_count()
    adam, muon = checkpoint_disk(spec), checkpoint_disk(spec, optimizer="muon")
    assert adam.optimizer_gb * 1e9 == 8 * p.total
    assert muon.optimizer_gb * 1e9 == 4 * (p.attention + p.mlp) + 8 * (p.total - p.attention - p.mlp)
    sharded = checkpoint_disk(spec, n_gpus=8, sharded=True)
    assert sharded.per_rank_optimizer_gb == pytest.approx(adam.optimizer_gb / 8)
    assert checkpoint_disk(spec, keep_last=1).at_once == 3


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        checkpoint_disk(MODELS["tiny"], keep_last=0)
    with pytest.raises(ValueError):
        checkpoint_disk(MODELS["tiny"], optimizer="sgd")


def test_plan_shows_the_disk(run):
    code, out, _ = run("plan", "--model", "1.31b", "--no-chart")
    assert code == 0 and "Checkpoints: 21.0 GB each" in out and "= 105 GB of disk" in out
