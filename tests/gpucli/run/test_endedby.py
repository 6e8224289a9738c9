"""``ended_by``: the path that ended a run's pod, read from the watchdog.json its watchdog writes
(gpucli/pod/watchdog.py finish), kept in the run record (old records still load) and read back from a
mirrored watchdog.json when the pod itself is gone."""

from __future__ import annotations

import json

from gpucli.run.files.harvest import mirror_root
from gpucli.run.oversee.observe import observe
from gpucli.runs import records as runs
from gpucli.runs.endedby import ended_by_in, ended_by_of, ended_by_words
from tests.gpucli.run.test_records import OLD_RECORD


def test_the_path_comes_from_what_the_watchdog_wrote():
    assert ended_by_of({"state": "done", "pod_ended": True, "ended_by": "REST v2", "provider": "runpod"}) == "REST v2"
    assert ended_by_of({"state": "done", "pod_ended": True, "ended_by": "GraphQL", "provider": "runpod"}) == "GraphQL"
    # a cloud pod's watchdog done without ending it: "none"; on a box nothing was the watchdog's to end
    assert ended_by_of({"state": "done", "pod_ended": False, "ended_by": None, "provider": "runpod"}) == "none"
    assert ended_by_of({"state": "done", "pod_ended": False, "ended_by": None, "provider": "ssh"}) is None
    # a stop that worked killed the watchdog before it could write "done": the path it was trying
    assert ended_by_of({"state": "ending", "trying": "REST v2 cluster", "provider": "runpod"}) == "REST v2 cluster"
    assert ended_by_of({"state": "running"}) is None and ended_by_of(["done"]) is None
    assert ended_by_in(b"{not json") is None and ended_by_in(None) is None
    assert ended_by_words("REST v2") == "pod key via REST v2" and ended_by_words(None) is None
    assert ended_by_words("none").startswith("nothing on the pod")


def test_old_records_load_and_the_field_round_trips():
    (runs.runs_dir() / "old-run.json").write_text(json.dumps(OLD_RECORD))
    record = runs.load("old-run")
    assert record.ended_by is None
    runs.save(record.with_(ended_by="GraphQL"))
    assert runs.load("old-run").ended_by == "GraphQL"
    bad = {**OLD_RECORD, "ended_by": {"not": "a path"}}
    (runs.runs_dir() / "old-run.json").write_text(json.dumps(bad))
    assert runs.load("old-run").ended_by is None


def test_a_gone_pod_s_path_is_read_from_the_mirrored_watchdog_json(tmp_path):
    record = runs.RunRecord(name="gone", provider="runpod", created_at=runs.now_iso(), profile="p", phase="fast",
                            model="tiny", n_gpus=1, gpu=None, workdir="/nowhere", status="finished",
                            instance_id="pod-x", ssh=runs.SshTarget(host="127.0.0.1", port=1))
    runs.save(record)
    root = mirror_root("gone")
    root.mkdir(parents=True, exist_ok=True)
    (root / "watchdog.json").write_text(json.dumps({"state": "done", "pod_ended": True, "ended_by": "REST v2",
                                                    "provider": "runpod"}))
    seen = observe(record)
    assert seen.status.ended_by == "REST v2"
    assert seen.due is not None and seen.due.save is not None and seen.due.save.ended_by == "REST v2"
