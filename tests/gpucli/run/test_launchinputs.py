"""A run's launch inputs are typed (gpucli.runs.launchinputs.LaunchInputs): records as older gpucli
versions wrote them still load, keys this version does not know are written back unchanged, a wrong
type is one line naming the file, and no secret value is ever in them."""

from __future__ import annotations

import copy
import json

import pytest

from gpucli.run.inputs.launch import LaunchRequest
from gpucli.run.starting.jobs import job_of
from gpucli.runs import records as runs
from gpucli.runs.launchinputs import BoxInputs, KeptVolume, LaunchInputs, OnMachine
from gpucli.runs.machines import is_box, machine_root

# As the first gpucli that kept launch inputs wrote them (commit e917461, gpucli/launcher.py
# launch_inputs): the request with its limits under their old names, and the pod settings beside it.
FIRST_VERSION = {
    "name": "first-run", "provider": "runpod", "created_at": "2026-11-22T13:00:00+00:00", "profile": "h100",
    "phase": "fast", "model": "124m", "n_gpus": 1, "gpu": "H100", "workdir": "/workspace/gpucli-runs/first-run",
    "status": "stopped", "instance_id": "pod-1",
    "launch": {"request": {"profile": "h100", "phase": "fast", "provider": "runpod", "model": "124m", "data": None,
                           "hours": 1.0, "budget_usd": 5.0, "steps": None, "name": "first-run", "host": None,
                           "identity": None, "price_per_hour_usd": None, "spot": True, "bid_per_gpu_usd": 1.2,
                           "val_interval": None, "checkpoint_interval": None, "extra": [], "workdir": None},
               "python": "python3", "image": "runpod/pytorch:2.4", "disk": 80, "ready_timeout": 900},
}

# A later run of your own code on a RunPod volume, after a down that counted the bandwidth, with a key a
# newer gpucli wrote.
OWN_ON_VOLUME = {
    "request": {"profile": "h100", "phase": "fast", "provider": "runpod", "limits": {"max_hours": 2.0},
                "extra": [], "volume": "ckpts", "env_names": ["WANDB_API_KEY"]},
    "own": {"run": "python train.py", "code": ".", "checkpoints": "out", "env": [], "env_from_local": []},
    "volume": {"id": "vol-7", "name": "ckpts", "size_gb": 100, "data_center_id": "EU-RO-1", "created": True,
               "type": "STANDARD"},
    "cluster_id": "clu-3", "bandwidth_usd": 0.42,
    "from_the_future": {"kept": [1, 2]},
}


def _write(name: str, data: dict) -> None:
    (runs.runs_dir() / f"{name}.json").write_text(json.dumps(data))


def test_a_record_of_the_first_version_loads_and_resolves_the_same_request():
    _write("first-run", FIRST_VERSION)
    record = runs.load("first-run")
    assert isinstance(record.launch, LaunchInputs)
    assert record.launch.request == FIRST_VERSION["launch"]["request"]
    # the pod settings of that version are kept as they were, and still read by the request
    assert dict(record.launch.other) == {"python": "python3", "image": "runpod/pytorch:2.4", "disk": 80,
                                         "ready_timeout": 900}
    req = LaunchRequest.from_json(record.launch)
    assert req == LaunchRequest.from_json(FIRST_VERSION["launch"])
    assert (req.image, req.disk_gb, req.ready_timeout_s, req.limits.max_hours, req.spot) == \
        ("runpod/pytorch:2.4", 80, 900, 1.0, True)
    assert job_of(record).kind == "trainer" and record.inputs.volume is None and not is_box(record)
    runs.save(record)  # written back: the launch exactly as read
    saved = json.loads((runs.runs_dir() / "first-run.json").read_text())
    assert saved["launch"] == FIRST_VERSION["launch"]
    assert runs.load("first-run") == record


def test_every_field_is_typed_and_unknown_keys_are_written_back():
    data = {**copy.deepcopy(FIRST_VERSION), "name": "own-run", "launch": copy.deepcopy(OWN_ON_VOLUME)}
    _write("own-run", data)
    record = runs.load("own-run")
    inputs = record.inputs
    assert inputs.volume == KeptVolume(id="vol-7", name="ckpts", size_gb=100, data_center_id="EU-RO-1",
                                       created=True, type="STANDARD")
    assert (inputs.cluster_id, inputs.bandwidth_usd, inputs.own["run"]) == ("clu-3", 0.42, "python train.py")
    assert inputs.other == {"from_the_future": {"kept": [1, 2]}}
    assert job_of(record).kind == "own"
    assert inputs.to_dict() == OWN_ON_VOLUME
    runs.save(record.with_(launch=inputs.with_(bandwidth_usd=0.5)))
    saved = json.loads((runs.runs_dir() / "own-run.json").read_text())["launch"]
    assert saved == {**OWN_ON_VOLUME, "bandwidth_usd": 0.5}


def test_a_machine_and_a_box_round_trip():
    inputs = LaunchInputs(request={"profile": "cpu"}, on=OnMachine(machine="base-run", after="prev-run"),
                          box=BoxInputs(idle_minutes=30.0, on_end="stop"))
    back = LaunchInputs.from_dict(json.loads(json.dumps(inputs.to_dict())))
    assert back == inputs
    record = runs.RunRecord(name="on-run", provider="local", created_at=runs.now_iso(), profile="cpu", phase="fast",
                            model="tiny", n_gpus=1, gpu=None, workdir="w", launch=inputs.to_dict())
    assert record.launch == inputs  # a dict given is typed once, on construction
    assert machine_root(record) == "base-run" and is_box(record)
    assert machine_root(record.with_(launch=None)) == "on-run"


def test_a_record_without_launch_inputs_reads_as_empty():
    data = copy.deepcopy(FIRST_VERSION)
    del data["launch"]
    _write("first-run", data)
    record = runs.load("first-run")
    assert record.launch is None and record.inputs == LaunchInputs() and record.inputs.requested == {}
    assert job_of(record).kind == "trainer"


@pytest.mark.parametrize("launch, words", [
    ({"request": ["not", "an", "object"]}, "launch.request is not an object"),
    ({"request": {}, "cluster_id": [1]}, "launch.cluster_id is not a string"),
    ({"request": {}, "bandwidth_usd": "lots"}, "launch.bandwidth_usd is not a finite number"),
    ({"request": {}, "volume": {"id": "v", "size_gb": "big"}}, "launch.volume.size_gb is not a number"),
])
def test_a_wrong_type_is_one_line_naming_the_file(launch, words):
    _write("first-run", {**FIRST_VERSION, "launch": launch})
    with pytest.raises(runs.BadRecord) as err:
        runs.load("first-run")
    assert "first-run.json" in str(err.value) and words in str(err.value) and "\n" not in str(err.value)
    skipped: list[str] = []
    assert runs.list_runs(on_bad=skipped.append) == [] and len(skipped) == 1


def test_no_secret_value_is_kept(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "sk-secret-value-123")
    req = LaunchRequest(profile="cpu", env_names=("WANDB_API_KEY",)).checked()
    inputs = LaunchInputs.from_dict(req.to_json())
    text = json.dumps(inputs.to_dict())
    assert "WANDB_API_KEY" in text and "sk-secret-value-123" not in text
