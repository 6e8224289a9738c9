from __future__ import annotations

import json

from gpucli.run.files.checkpoints import choose_checkpoint, group_checkpoints, model_files, step_in_name
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


def test_the_frameworks_own_record_of_the_best():
    from gpucli.run.files.checkpoints import hf_best, nanochat_best, nanochat_metas, newest_trainer_state

    hf = {f"checkpoint-{s}/{f}": (10, 1.0) for s in (10, 20, 30) for f in ("model.safetensors", "trainer_state.json")}
    hf["runs/Nov25_01-08-10_vm/events.out.tfevents.1.vm.1.0"] = (10, 1.0)  # TensorBoard's: never a checkpoint
    assert newest_trainer_state(hf) == "checkpoint-30/trainer_state.json"
    best = hf_best('{"best_model_checkpoint": "out/checkpoint-20", "best_metric": 3.2}', "checkpoint-30/trainer_state.json")
    rows = [{"kind": "val", "step": 30, "val_loss": 1.0}]  # the logged rows would say 30
    choice = choose_checkpoint(hf, rows, framework=best)
    assert choice.checkpoint.name == "checkpoint-20" and "best_model_checkpoint 3.2000" in choice.reason
    assert all("tfevents" not in f for c in choice.candidates for f in c.files)

    nano = {f"{k}_{s:06d}{ext}": (10, 1.0) for s in (5, 10, 15) for k, ext in (("model", ".pt"), ("meta", ".json"))}
    metas = nanochat_metas(nano)
    assert metas == ["meta_000005.json", "meta_000010.json", "meta_000015.json"]
    best = nanochat_best({m: json.dumps({"step": int(m[5:11]), "val_bpb": {5: 1.1, 10: 0.8, 15: 0.9}[int(m[5:11])]})
                          for m in metas})
    choice = choose_checkpoint(nano, [], framework=best)
    assert choice.checkpoint.step == 10 and "val_bpb 0.8000" in choice.reason


def test_lightning_logger_folders_are_not_checkpoints():
    listing = {"lightning_logs/version_0/events.out.tfevents.1.vm.1.0": (10, 1.0),
               "lightning_logs/version_0/hparams.yaml": (10, 1.0), "lightning_logs/version_0/metrics.csv": (10, 1.0),
               "epoch=0-step=8.ckpt": (10, 1.0), "epoch=2-step=24.ckpt": (10, 2.0)}
    rows = [{"kind": "val", "step": 7, "val_loss": 2.8}, {"kind": "val", "step": 23, "val_loss": 2.3}]
    choice = choose_checkpoint(listing, rows)
    assert [c.name for c in choice.candidates] == ["epoch=0-step=8.ckpt", "epoch=2-step=24.ckpt"]
    assert choice.checkpoint.name == "epoch=2-step=24.ckpt"


def test_checkpoints_inside_lightning_version_folders():
    # fetch-best --checkpoints lightning_logs: ModelCheckpoint's default place is version_N/checkpoints/
    listing = {"version_0/events.out.tfevents.1.vm.1.0": (10, 1.0), "version_0/hparams.yaml": (10, 1.0),
               "version_0/checkpoints/epoch=1-step=16.ckpt": (10, 1.0),
               "version_0/checkpoints/epoch=3-step=32.ckpt": (10, 2.0)}
    choice = choose_checkpoint(listing, [{"kind": "val", "step": 15, "val_loss": 2.0},
                                         {"kind": "val", "step": 31, "val_loss": 2.5}])
    assert [c.step for c in choice.candidates] == [16, 32]
    assert choice.checkpoint.files == ("version_0/checkpoints/epoch=1-step=16.ckpt",)


def test_each_litgpt_checkpoint_is_scored_by_its_own_validation():
    listing = {f"step-{s:08d}/{f}": (10, 1.0) for s in (40, 80) for f in ("lit_model.pth", "model_config.yaml")}
    rows = [{"kind": "val", "step": 40, "val_loss": 5.2318}, {"kind": "val", "step": 80, "val_loss": 5.8097}]
    choice = choose_checkpoint(listing, rows)
    assert choice is not None and choice.checkpoint.name == "step-00000040"
    assert choice.reason == "lowest val_loss 5.2318 (logged at its step 40)"
    assert [(c.step, c.val_loss) for c in choice.candidates] == [(40, 5.2318), (80, 5.8097)]


def test_model_files_leave_out_what_only_a_resume_needs():
    hf = ["checkpoint-20/model.safetensors", "checkpoint-20/config.json", "checkpoint-20/optimizer.pt",
          "checkpoint-20/scheduler.pt", "checkpoint-20/rng_state.pth", "checkpoint-20/scaler.pt",
          "checkpoint-20/trainer_state.json"]
    assert model_files(hf) == ("checkpoint-20/model.safetensors", "checkpoint-20/config.json",
                               "checkpoint-20/trainer_state.json")
    assert model_files(["model_000500.pt", "meta_000500.json", "optim_000500_rank0.pt"]) == \
        ("model_000500.pt", "meta_000500.json")
    assert model_files(["ckpt/optimizer.bin", "ckpt/model.safetensors", "ckpt/random_states_0.pkl",
                        "ckpt/zero_pp_rank_0_mp_rank_00_optim_states.pt"]) == ("ckpt/model.safetensors",)
    # one file holding both (Lightning's .ckpt, LitGPT's lit_model.pth): brought as it is
    assert model_files(["epoch=3-step=32.ckpt"]) == ("epoch=3-step=32.ckpt",)
    assert model_files(["optimizer.pt"]) == ("optimizer.pt",)
