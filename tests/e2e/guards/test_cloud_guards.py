"""The guards end the money on the cloud emulators, with nothing of gpucli running on the user's side.

``gpucli launch`` rents an emulator pod (a real sshd on this machine), starts the tiny CPU trainer and
the pod-side watchdog, and returns. From then on nothing on this side talks to the provider: the
watchdog alone stops (or terminates) the pod with the pod's own scoped key, read from the pod
environment the emulator gives the pod (see tests/support/emulators/common.py). The emulator's ledger
says who ended each pod, and ending a pod kills every process in it, as a real container's end does.

Watchdog knobs are shortened through GPUCLI_WATCHDOG_POLL_S / GPUCLI_WATCHDOG_GRACE_S; the dollar cap is
made short by a high --price.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpucli.errors import GpucliError
from gpucli.runs import records as runs
from tests.e2e.cloud.test_cloud_launch import TINY, emulator_for
from tests.support.cli import cli, wait_for
from tests.support.emulators.common import pod_process_ids


@pytest.fixture(autouse=True)
def fast_guards(monkeypatch):
    from gpucli.cli import render
    from gpucli.plan import catalog

    catalog.clear_cache()
    render.reset_consoles()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the trainer shares two cores with the suite
    monkeypatch.setenv("GPUCLI_PROVIDER_POLL_S", "0.05")  # the emulators' pods start in a few polls
    monkeypatch.setenv("GPUCLI_WATCHDOG_POLL_S", "0.25")
    monkeypatch.setenv("GPUCLI_WATCHDOG_GRACE_S", "1")
    for var in ("TRAINER_FAULT_KILL_AT_STEP", "TRAINER_FAULT_RAISE_AT_STEP", "TRAINER_FAULT_HANG_AT_STEP"):
        monkeypatch.delenv(var, raising=False)
    yield
    render.reset_consoles()


def launch(capsys, tmp_path: Path, provider: str, name: str, *extra: str) -> tuple[int, str, str]:
    return cli(capsys, "launch", "--provider", provider, "--profile", "rtx4090", "--phase", "fast", "--name", name,
               "--workdir", str(tmp_path / "pod" / name), "--python", sys.executable, "--ready-timeout", "20",
               *TINY, *extra)


def wait_until_ended(emu, pod_id: str, timeout_s: float = 60):
    return wait_for(lambda: emu.ledger.ended(pod_id), timeout_s, f"pod {pod_id} to end", interval=0.2)[0]


def metrics_rows(workdir: Path) -> list[dict]:
    path = workdir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def our_processes(emu) -> list[str]:
    """Processes on the user's side this test could have left: anything started with this test's
    GPUCLI_HOME in its environment. The emulator's pods are not the
    user's side: their sshd (and its session children) and everything started in them are left out."""
    home = f"GPUCLI_HOME={os.environ['GPUCLI_HOME']}".encode()
    me = os.getpid()
    with emu.lock:
        pod_sshds = {p.sshd.proc.pid for p in emu.pods.values() if p.sshd is not None}
    procs: dict[int, tuple[int, str, list[bytes]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if argv and argv[0]:  # not a zombie or a kernel thread
            procs[int(entry.name)] = (ppid, b" ".join(argv).decode(errors="replace"), environ)

    def in_a_pod(pid: int) -> bool:
        seen = 0
        while pid in procs and seen < 64:
            if pid in pod_sshds or any(e.startswith(b"GPUCLI_EMU_POD=") for e in procs[pid][2]):
                return True
            pid, seen = procs[pid][0], seen + 1
        return pid in pod_sshds

    # This test's GPUCLI_HOME marks what it started (every child inherits it); a child of this worker
    # from another test (tests share an xdist worker) carries that test's home, not this one's.
    return [command for pid, (ppid, command, environ) in procs.items()
            if home in environ and not in_a_pod(pid)]


def assert_pod_is_gone_with_its_processes(emu, pod_id: str) -> None:
    pod = emu.pods.get(pod_id)
    assert pod is None or (pod.stopped and pod.sshd is None)
    if pod is not None:
        assert pod_process_ids(pod.marker) == []


def assert_no_account_key_on_the_pod(emu, workdir: Path, pod_id: str) -> None:
    """The run's env file and the pod's environment hold no account key; the pod's own key is there."""
    env_file = (workdir / "env").read_text()
    assert emu.api_key not in env_file and "RUNPOD_API_KEY" not in env_file and "CONTAINER_API_KEY" not in env_file
    pod = emu.pods.get(pod_id)
    if pod is not None:
        environ = pod.environ_path.read_bytes()
        assert emu.api_key.encode() not in environ and pod.scoped_key.encode() in environ
    for name in ("watchdog.log", "watchdog.out", "console.log", "run.yaml"):
        if (workdir / name).exists():
            text = (workdir / name).read_text()
            assert emu.api_key not in text and (pod is None or pod.scoped_key not in text), name


def account_key_calls_since(emu, start: int) -> int:
    return sum(h == f"Bearer {emu.api_key}" for h in emu.auth_headers[start:])


# --- the emulators' pods: environment, scoped keys, processes die with the pod -------------------------
@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_pod_environment_and_what_a_pod_scoped_key_may_do(provider, request, client_key):
    from gpucli.providers.api import LaunchSpec
    from gpucli.providers.clients import get_provider
    from gpucli.ssh import Remote, SshTarget

    emu = emulator_for(request, provider)
    account = get_provider(provider)
    offer = account.search_offers(None, limit=1)[0]

    def spec(name):
        return LaunchSpec(name=name, gpu_name=offer.gpu_name, gpu_count=offer.gpu_count, image="img", disk_gb=10,
                          ssh_public_key=client_key[1], offer_id=offer.offer_id)

    mine, other = account.create(spec("mine")).instance_id, account.create(spec("other")).instance_id
    pod = emu.pods[mine]
    sshd = emu.boot(pod)
    key = pod.scoped_key
    assert key != emu.api_key and key != emu.pods[other].scoped_key

    # PID 1's environment, NUL-separated, readable by the pod only.
    environ = dict(item.split("=", 1) for item in pod.environ_path.read_text().split("\0") if item)
    assert pod.environ_path.stat().st_mode & 0o777 == 0o600
    if provider == "runpod":
        assert environ["RUNPOD_POD_ID"] == mine and environ["RUNPOD_API_KEY"] == key
    else:
        assert environ["CONTAINER_ID"] == mine and environ["CONTAINER_API_KEY"] == key
    # No API endpoint inside the pod, as on real pods: the watchdog takes it from its own env file.
    assert "RUNPOD_API_BASE_URL" not in environ and "VAST_URL" not in environ

    # An SSH session sees where that environment is, not the variables themselves; what it starts
    # detached carries the pod's marker.
    target = SshTarget(host=sshd.host, port=sshd.port, user=sshd.user, identity_file=str(client_key[0]))
    with Remote(target) as host:
        shown = host.run("echo $GPUCLI_POD_ENVIRON; echo ${RUNPOD_API_KEY:-none} ${CONTAINER_API_KEY:-none}",
                         timeout_s=20).stdout.split()
        assert shown == [str(pod.environ_path), "none", "none"]
        sleeper = host.start_detached("sleep 600", cwd=str(sshd.root), log_path=str(sshd.root / "sleep.log"))
    assert sleeper in pod_process_ids(pod.marker)

    # The pod's key cannot list, create, or touch another pod.
    scoped = type(account)(api_key=key)
    with pytest.raises(GpucliError):
        scoped.list_instances()
    with pytest.raises(GpucliError):
        scoped.create(spec("sneaky"))
    with pytest.raises(GpucliError):
        scoped.stop(other)
    with pytest.raises(GpucliError):
        scoped.terminate(other)
    assert len(emu.ledger.created()) == 2 and emu.ledger.ended(other) == []
    # ... and stops its own pod, which takes the detached process with it.
    scoped.stop(mine)
    (stopped,) = emu.ledger.ended(mine)
    assert (stopped.event, stopped.by) == ("stopped", "pod-key")
    assert not Path(f"/proc/{sleeper}").exists() or pod_process_ids(pod.marker) == []
    assert emu.pods[mine].sshd is None
    # Terminating its own pod ends the key with the pod.
    scoped.terminate(mine)
    assert [(e.event, e.by) for e in emu.ledger.ended(mine)] == [("stopped", "pod-key"), ("terminated", "pod-key")]
    with pytest.raises(GpucliError):
        scoped.terminate(mine)
    assert emu.auth_headers[-1] == f"Bearer {key}"
    account.terminate(other)
    assert emu.ledger.ended(other)[0].by == "account-key"
    assert emu.ledger.alive() == set()


# --- the watchdog's own calls, with the pod's environment, for each provider and --on-end -----------------
WATCHDOG = Path(__file__).resolve().parents[3] / "gpucli" / "pod" / "watchdog.py"


def pod_for_watchdog(request, provider: str, client_key):
    from gpucli.providers.api import LaunchSpec
    from gpucli.providers.clients import get_provider

    emu = emulator_for(request, provider)
    account = get_provider(provider)
    offer = account.search_offers(None, limit=1)[0]
    pod_id = account.create(LaunchSpec(name="wd", gpu_name=offer.gpu_name, gpu_count=offer.gpu_count, image="img",
                                       disk_gb=10, ssh_public_key=client_key[1], offer_id=offer.offer_id)).instance_id
    pod = emu.pods[pod_id]
    emu.boot(pod)
    return emu, pod


def run_pod_watchdog(emu, provider: str, pod, run_dir: Path, on_end: str = "stop", *,
                     env_file: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, str]:
    """The watchdog as the launch starts it on a pod: a trainer already gone (the run is over), the
    pointer to PID 1's environment, no provider variables, and what the launch's watchdog.env holds."""
    from gpucli.providers.podside import watchdog_env

    trainer = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    trainer.wait()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VAST_", "CONTAINER_"))}
    env["GPUCLI_POD_ENVIRON"] = str(pod.environ_path)
    env.update(watchdog_env(provider) if env_file is None else env_file)
    # The test process's endpoints are gone from here on: only watchdog.env's values can be used.
    proc = subprocess.run([sys.executable, str(WATCHDOG), "--run-dir", str(run_dir), "--pgid", str(trainer.pid),
                           "--provider", provider, "--poll-s", "0.1", "--on-end", on_end],
                          env=env, capture_output=True, text=True, timeout=120)
    return proc, (run_dir / "watchdog.log").read_text()


@pytest.mark.parametrize("provider", ["runpod", "vast"])
@pytest.mark.parametrize("on_end", ["stop", "terminate"])
def test_watchdog_ends_its_own_pod_with_the_pod_key(provider, on_end, request, client_key, tmp_path):
    emu, pod = pod_for_watchdog(request, provider, client_key)
    assert emu.strict_pod_calls and emu.strict_user_agent and not emu.pod_env_has_base_url
    proc, log = run_pod_watchdog(emu, provider, pod, tmp_path, on_end)
    assert proc.returncode == 0, log
    assert json.loads((tmp_path / "watchdog.json").read_text())["pod_ended"] is True
    (ended,) = emu.ledger.ended(pod.pod_id)
    assert (ended.event, ended.by) == ("stopped" if on_end == "stop" else "terminated", "pod-key")
    assert emu.auth_headers[-1] == f"Bearer {pod.scoped_key}"
    from gpucli import __version__

    assert emu.user_agents[-1] == f"gpucli/{__version__}"
    if provider == "runpod":  # REST v2 first: POST /v2/pods/{id}/action (runpod/docs migrate-from-v1.mdx)
        op, body = emu.calls[-1]
        assert (op, body) == ("podAction", {"id": pod.pod_id, "action": on_end})
    assert pod.scoped_key not in log + proc.stdout + proc.stderr and emu.api_key not in log


@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_watchdog_retries_a_403_until_the_pod_stops(provider, request, client_key, tmp_path):
    """A proxy in front of the API answering 403 is not the end of it: the watchdog logs each failure
    loudly and retries with backoff (it used to give up at the first 401/403)."""
    emu, pod = pod_for_watchdog(request, provider, client_key)
    # RunPod: REST v2 and the GraphQL fallback both refused on the first round, v2 on the second.
    emu.faults.add("server_error", "any", times=3 if provider == "runpod" else 2, status=403)
    proc, log = run_pod_watchdog(emu, provider, pod, tmp_path)
    assert proc.returncode == 0, log
    assert [(e.event, e.by) for e in emu.ledger.ended(pod.pod_id)] == [("stopped", "pod-key")]
    failures = [line for line in log.splitlines() if "FAILED to stop the pod" in line and "HTTP 403" in line]
    assert len(failures) >= 2 and "User-Agent" in failures[0], log
    assert "retrying in" in log


def test_watchdog_takes_a_vast_success_false_as_a_failure(request, client_key, tmp_path):
    emu, pod = pod_for_watchdog(request, "vast", client_key)
    emu.faults.add("refuse", "stop", times=1)  # HTTP 200 {"success": false, ...}: nothing was stopped
    proc, log = run_pod_watchdog(emu, "vast", pod, tmp_path)
    assert proc.returncode == 0, log
    assert "FAILED to stop the pod" in log and "request refused" in log
    assert [(e.event, e.by) for e in emu.ledger.ended(pod.pod_id)] == [("stopped", "pod-key")]
    stops = [r for r in emu.requests if r[0] == "PUT" and "/instances/" in r[1]]
    assert len(stops) == 2  # refused once, then done


@pytest.mark.parametrize("on_end", ["stop", "terminate"])
def test_runpod_watchdog_falls_back_to_graphql(on_end, request, client_key, tmp_path):
    """REST v2 refusing the action (a 400) leaves GraphQL podStop/podTerminate while GraphQL lives
    (retired early 2027, runpod/docs release-notes.mdx); REST v1 is never called (retired 2026-11-15)."""
    emu, pod = pod_for_watchdog(request, "runpod", client_key)
    emu.faults.add("server_error", "action", times=1, status=400)
    proc, log = run_pod_watchdog(emu, "runpod", pod, tmp_path, on_end)
    assert proc.returncode == 0, log
    (ended,) = emu.ledger.ended(pod.pod_id)
    assert (ended.event, ended.by) == ("stopped" if on_end == "stop" else "terminated", "pod-key")
    assert emu.requests[-1][:2] == ("POST", "/graphql")
    assert emu.calls[-1] == ("podStop" if on_end == "stop" else "podTerminate", {"podId": pod.pod_id})
    assert "REST v2, attempt 1): HTTP 400" in log and "(GraphQL): HTTP 200" in log
    assert not any(r[1].startswith("/v1/") for r in emu.requests)


def test_runpod_watchdog_with_graphql_retired(request, client_key, tmp_path):
    """GraphQL switched off (2027): the v2 action alone ends the pod."""
    emu, pod = pod_for_watchdog(request, "runpod", client_key)
    emu.graphql_enabled = False
    proc, log = run_pod_watchdog(emu, "runpod", pod, tmp_path, "terminate")
    assert proc.returncode == 0, log
    assert [(e.event, e.by) for e in emu.ledger.ended(pod.pod_id)] == [("terminated", "pod-key")]


def test_watchdog_endpoint_comes_from_its_env_file_only(request, client_key, tmp_path):
    """Without the launch's env file the watchdog calls the public endpoint (unreachable here), never a
    RUNPOD_API_BASE_URL it might find elsewhere; and it says that it could not end the pod."""
    emu, pod = pod_for_watchdog(request, "runpod", client_key)
    proc, log = run_pod_watchdog(emu, "runpod", pod, tmp_path, env_file={
        "GPUCLI_VERSION": "0", "GPUCLI_RUNPOD_API_BASE_URL": "http://127.0.0.1:9", "GPUCLI_WATCHDOG_END_CAP_S": "1",
        "RUNPOD_API_BASE_URL": emu.url})
    assert proc.returncode == 1
    assert emu.ledger.ended(pod.pod_id) == []
    assert "FAILED to stop the pod (runpod REST v2" in log and "FAILED to stop the pod (runpod GraphQL" in log
    assert "COULD NOT END THE POD" in log
    emu.end_pod(pod.pod_id, "terminated", "account-key")


# --- the dollar cap: the trainer stops itself, the watchdog stops the pod -----------------------------------
@pytest.mark.parametrize("provider", ["runpod", "vast"])
def test_budget_run_stops_at_the_cap_and_the_pod_stops_itself(provider, request, capsys, tmp_path):
    emu = emulator_for(request, provider)
    name = f"{provider}-budget"
    # $36/h is a cent a second: a $0.60 budget is 60 s of pod time, launch included. On a loaded 2-core
    # host the launch alone (pod, setup, sync) took 23 s of a 32 s budget, leaving the trainer too little
    # to reach its own stop before the watchdog's backstop: the test is about who stops, not how fast.
    budget = 0.60
    # steps enough that the money, not the step count, ends the run (the tiny model does ~40 steps/s)
    code, out, err = launch(capsys, tmp_path, provider, name, "--budget", f"{budget}", "--price", "36",
                            "--steps", "1000000")
    assert code == 0, err
    launched_at = len(emu.auth_headers)
    record = runs.load(name)
    pod_id, workdir = record.instance_id, Path(record.workdir)
    # The launch has returned: nothing of gpucli runs here any more.
    assert our_processes(emu) == [], our_processes(emu)

    ended = wait_until_ended(emu, pod_id, timeout_s=120)
    assert (ended.event, ended.by) == ("stopped", "pod-key")
    assert account_key_calls_since(emu, launched_at) == 0  # nobody on this side touched the provider
    assert our_processes(emu) == []
    assert_pod_is_gone_with_its_processes(emu, pod_id)
    assert [e.event for e in emu.ledger.events if e.pod_id == pod_id] == ["created", "stopped"]

    rows = metrics_rows(workdir)
    finished = [r for r in rows if r.get("event") == "finished"]
    assert finished and finished[-1]["reason"] == "max_cost", rows[-3:]
    # The state at the stop is on disk: a final checkpoint, or a regular one of that very step (the
    # trainer does not write the same step twice).
    stop_step = finished[-1]["step"]
    assert [r for r in rows if r.get("event") == "checkpoint" and r.get("step") == stop_step
            and r.get("checkpoint_kind") in ("final", "regular")], rows[-5:]
    # Stopped within about one check interval of the cap: the trainer's cost at its end is under it.
    assert finished[-1]["cost_usd"] <= budget
    log = (workdir / "watchdog.log").read_text()
    assert "run over: finished (max_cost)" in log, log
    assert ended.at - runs.parse_iso(record.created_at).timestamp() <= budget / 36 * 3600 + 5
    assert_no_account_key_on_the_pod(emu, workdir, pod_id)


# --- a hung trainer: TERM, then KILL, then the pod ends ------------------------------------------------------
def test_hung_trainer_is_killed_and_the_pod_stops(runpod_emulator, capsys, tmp_path, monkeypatch):
    emu = runpod_emulator
    # The fault is part of the run's config; a variable of this machine's environment never reaches the pod.
    monkeypatch.setenv("TRAINER_FAULT_HANG_AT_STEP", "1")
    code, out, err = launch(capsys, tmp_path, "runpod", "hung", "--stall-minutes", "0.05",  # 3 s without a row
                            "--set", "faults.hang_at_step=2")
    assert code == 0, err
    launched_at = len(emu.auth_headers)
    record = runs.load("hung")
    pod_id, workdir = record.instance_id, Path(record.workdir)
    assert "TRAINER_FAULT" not in (workdir / "env").read_text()
    assert yaml.safe_load((workdir / "run.yaml").read_text())["faults"] == {"hang_at_step": 2}

    ended = wait_until_ended(emu, pod_id)
    assert (ended.event, ended.by) == ("stopped", "pod-key")
    assert account_key_calls_since(emu, launched_at) == 0
    log = (workdir / "watchdog.log").read_text()
    assert "run over: stalled" in log and "SIGTERM" in log and "SIGKILL" in log, log
    steps = [r["step"] for r in metrics_rows(workdir) if r.get("kind") == "train"]
    assert steps and max(steps) == 2
    assert_pod_is_gone_with_its_processes(emu, pod_id)
    assert not Path(f"/proc/{record.pid}").exists() or pod_process_ids(emu.pods[pod_id].marker) == []
    assert our_processes(emu) == []
    assert_no_account_key_on_the_pod(emu, workdir, pod_id)


# --- a crashed trainer: the pod ends too (here: terminated, --on-end terminate) --------------------------------
def test_crashed_trainer_terminates_its_pod(request, capsys, tmp_path):
    emu = emulator_for(request, "vast")
    code, out, err = launch(capsys, tmp_path, "vast", "crash", "--on-end", "terminate", "--set", "faults.kill_at_step=2")
    assert code == 0, err
    launched_at = len(emu.auth_headers)
    record = runs.load("crash")
    pod_id, workdir = record.instance_id, Path(record.workdir)

    ended = wait_until_ended(emu, pod_id)
    assert (ended.event, ended.by) == ("terminated", "pod-key")
    assert account_key_calls_since(emu, launched_at) == 0
    assert emu.ledger.alive() == set() and emu.running_sshd_count() == 0
    log = (workdir / "watchdog.log").read_text()
    assert "run over: crashed" in log, log
    assert not [r for r in metrics_rows(workdir) if r.get("event") == "finished"]
    assert our_processes(emu) == []
    assert_no_account_key_on_the_pod(emu, workdir, pod_id)
