from __future__ import annotations

from gpucli.run.checkpoints import choose_checkpoint, group_checkpoints, step_in_name
from gpucli.ssh import RemoteFile


def listing(*names, size=10, mtime=100):
    return {n: RemoteFile(n, size, mtime) for n in names}


def val(step, v, metric="val_loss"):
    return {"kind": "val", "step": step, metric: v}


def test_step_in_names_of_common_scripts():
    assert step_in_name("checkpoint-500") == 500  # HF
    assert step_in_name("epoch=3-step=1200.ckpt") == 1200  # Lightning: the step, not the epoch
    assert step_in_name("model_000500.pt") == 500  # nanochat
    assert step_in_name("optim_000500_rank10.pt") == 500  # not the rank
    assert step_in_name("step_000500") == 500
    assert step_in_name("gpt2-124M-iter3000.pt") == 3000
    assert step_in_name("ckpt.pt") is None and step_in_name("best.pt") is None


def test_per_step_folders_are_chosen_by_the_val_loss_logged_nearest_before_them():
    files = listing("checkpoint-100/model.safetensors", "checkpoint-100/trainer_state.json",
                    "checkpoint-200/model.safetensors", "checkpoint-300/model.safetensors")
    rows = [val(90, 2.0), val(180, 1.5), {"kind": "train", "step": 250, "loss": 0.1}, val(300, 1.7), val(350, 0.1)]
    choice = choose_checkpoint(files, rows)
    assert choice is not None and choice.checkpoint.name == "checkpoint-200"
    assert choice.checkpoint.val_loss == 1.5 and choice.checkpoint.val_step == 180
    assert choice.checkpoint.files == ("checkpoint-200/model.safetensors",)
    assert "nearest before step 200" in choice.reason
    # The val at 350 comes after every checkpoint: it scores none of them.
    assert [c.val_loss for c in choice.candidates] == [2.0, 1.5, 1.7]


def test_files_of_one_step_are_one_checkpoint_and_bpb_is_used_without_a_loss():
    files = listing("model_000010.pt", "meta_000010.json", "optim_000010_rank0.pt", "optim_000010_rank1.pt",
                    "model_000020.pt", "meta_000020.json")
    choice = choose_checkpoint(files, [val(10, 0.8, "val_bpb"), val(20, 0.95, "val_bpb")])
    assert choice.checkpoint.step == 10 and choice.checkpoint.name == "step_10"
    assert len(choice.checkpoint.files) == 4 and choice.checkpoint.val_metric == "val_bpb"


def test_no_validation_means_the_newest():
    choice = choose_checkpoint(listing("step_5.pt", "step_15.pt", "step_10.pt"), [])
    assert choice.checkpoint.name == "step_15.pt" and "newest" in choice.reason


def test_a_tie_goes_to_the_later_step():
    choice = choose_checkpoint(listing("a/step_100/w.pt", "a/step_200/w.pt"), [val(50, 1.0)])
    assert choice.checkpoint.name == "step_200"


def test_the_overwritten_nanogpt_file_as_it_is():
    choice = choose_checkpoint(listing("ckpt.pt"), [val(250, 1.2)])
    assert choice.checkpoint.files == ("ckpt.pt",) and choice.checkpoint.step is None
    assert "single checkpoint file" in choice.reason


def test_a_final_folder_without_steps_comes_back_whole_and_temp_files_never():
    files = listing("config.json", "model.safetensors", ".model.safetensors.tmp", "x.partial")
    stepped, single = group_checkpoints(files)
    assert stepped == [] and single is not None and single.files == ("config.json", "model.safetensors")
    assert choose_checkpoint({}, []) is None


def test_a_checkpoint_still_being_written_is_left_out():
    files = {**listing("step_1.pt", mtime=100), **listing("step_2.pt", mtime=199)}
    choice = choose_checkpoint(files, [val(1, 1.0), val(2, 0.5)], now=200, min_age_s=5)
    assert choice.checkpoint.name == "step_1.pt"
