"""Runs the user's own training command on the pod the way the bundled trainer runs (standard library only).

    python3 jobrun.py --run-dir D --cwd C --cmd CMD [--setup CMD] [--preflight CMD] [--metrics-regex R] [--grace-s S]
                      [--name N] [--data DIR] [--checkpoints DIR] [--gpus N] [--env-file F]

``gpucli launch --code DIR --run CMD`` starts this file detached, in its own session, where it would start
the trainer: its pid is the process group the pod watchdog watches and signals. It

1. runs ``--setup`` once (a marker file in the run folder records that it succeeded for this exact
   command; a resume on a new pod has no marker, so the setup runs again there);
2. runs ``--cmd`` with bash from ``--cwd`` in a process group of its own, with ``GPUCLI_RUN``,
   ``GPUCLI_RUN_DIR``, ``GPUCLI_DATA``, ``GPUCLI_CHECKPOINTS``, ``GPUCLI_METRICS`` (a JSON-lines file the
   job may append rows to), ``GPUCLI_GPUS`` and ``PYTHONUNBUFFERED=1`` added to its environment (which
   already holds the env file's variables: ``start_detached`` sources it before starting this file;
   ``--env-file`` reads one more);
3. tees both commands' output to ``train.log`` and to its own stdout (the run's ``console.log``), reads
   it as a terminal shows it (``terminal.py``) and turns its lines into metrics rows (``logparse.py``),
   reads the framework files under the code folder and ``--logdir`` (TensorBoard events, Hugging Face
   ``trainer_state.json``, Lightning ``metrics.csv``: ``framefiles.py``) and the job's own
   ``$GPUCLI_METRICS`` rows: all into ``metrics.jsonl`` in the trainer's row format
   (``trainer/watch/metrics.py``), one row per kind and step, each with its ``source``, with
   ``loss_spike`` events (> 2x the rolling mean loss);
4. ends with ``status.json`` and a ``finished`` event with ``state``, ``reason`` and ``story`` (one line:
   ``finished (exit 0)``, ``failed (exit 1: KeyError: 'x')`` with the last traceback's exception line,
   ``failed (setup exit 4)``, ``stopped by cap: max_hours 0.01 h at 36 s`` or ``stopped by you`` from the
   ``stop_reason`` file the watchdog or ``gpucli down`` wrote before signalling; ``signal`` when anyone
   else stopped it), the last lines as a terminal shows them in ``log_tail``.

SIGTERM (the watchdog's budget/hours caps, ``gpucli down``) is forwarded to the job's process group at
once; the job gets ``--grace-s`` to write its own checkpoint, then SIGKILL. Keep ``--grace-s`` below the
watchdog's own grace so that this file is still alive to record the end. Any console output touches
``metrics.jsonl``: the watchdog's stall check ("nothing new for --stall-minutes") reads its mtime. The
file is created at the job's first output, so the watchdog's startup window covers a silent start.
"""

from __future__ import annotations

import argparse
import codecs
import hashlib
import importlib.util
import json
import math
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any


def _load(name: str) -> ModuleType:
    """A module uploaded next to this file (the pod has no gpucli package)."""
    here = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"gpucli_pod_{name}", here)
    if spec is None or spec.loader is None:
        raise ImportError(f"{name}.py not found next to {__file__}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # registered as a loaded module should be (dataclasses look it up)
    spec.loader.exec_module(module)
    return module


logparse = _load("logparse")
terminal = _load("terminal")
framefiles = _load("framefiles")
jobalerts = _load("jobalerts")
use_venv = _load("jobvenv").use_venv  # the job's own venv, seeing this Python's packages
Alerts, load_notifier, ALERT_EVENTS = jobalerts.Alerts, jobalerts.load_notifier, jobalerts.ALERT_EVENTS


TAIL_LINES = 20
HEARTBEAT_S = 5.0  # touch metrics.jsonl at most this often while output flows


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_status(run_dir: Path, **fields: Any) -> None:
    tmp = run_dir / "status.json.tmp"
    tmp.write_text(json.dumps({**fields, "updated": time.time()}))
    tmp.replace(run_dir / "status.json")


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY='value'`` lines as ``write_env_file`` writes them (shell-quoted values)."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, raw = line.partition("=")
        key = key.removeprefix("export ").strip()
        try:
            parts = shlex.split(raw)
        except ValueError:
            parts = [raw]
        env[key] = "".join(parts)
    return env


def count_gpus() -> int:
    """GPUs on the host: ``nvidia-smi -L`` lines, else ``CUDA_VISIBLE_DEVICES``, else 0."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
            n = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))
            if out.returncode == 0 and n:
                return n
        except (OSError, subprocess.TimeoutExpired):
            pass
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and visible not in ("-1", "none", "NoDevFiles"):
        return len([d for d in visible.split(",") if d.strip()])
    return 0


class Metrics:
    """``metrics.jsonl``: created at the first row or output line (with a ``started`` event), one flushed
    JSON object a line; the last train/val values are kept for the ``finished`` event."""

    def __init__(self, path: Path, started: dict[str, Any]) -> None:
        self.path, self.started = path, started
        self.fh: Any = None
        self.last_touch = 0.0
        self.step: int | None = None
        self.loss: float | None = None
        self.val_loss: float | None = None
        self.best_val: float | None = None
        self.spikes = logparse.LossSpikes()
        self.alerts: Any = None  # jobalerts.Alerts

    def _open(self) -> None:
        if self.fh is None:
            self.fh = open(self.path, "a")
            self._write({"kind": "event", "event": "started", **self.started})

    def _write(self, row: dict[str, Any]) -> None:
        row = {k: _clean(v) for k, v in row.items()}
        row.setdefault("time", time.time())
        self.fh.write(json.dumps(row) + "\n")
        self.fh.flush()
        self.last_touch = time.monotonic()

    def row(self, row: dict[str, Any]) -> None:
        self._open()
        self._write(row)
        step = row.get("step")
        if row.get("kind") == "train" and isinstance(row.get("loss"), (int, float)):
            loss = float(row["loss"])
            if self.step is None or not isinstance(step, int) or step >= self.step:
                self.step, self.loss = step, loss
            mean = self.spikes.update(loss)
            if mean is not None:
                self._write({"kind": "event", "event": "loss_spike", "step": step, "loss": loss,
                             "rolling_mean_loss": mean})
                if self.alerts is not None:
                    self.alerts.spike(step, loss, mean)
        elif row.get("kind") == "val":
            val = row.get("val_loss", row.get("val_bpb"))
            if isinstance(val, (int, float)) and math.isfinite(val):
                self.val_loss = float(val)
                self.best_val = self.val_loss if self.best_val is None else min(self.best_val, self.val_loss)
            if isinstance(step, int) and (self.step is None or step > self.step):
                self.step = step

    def event(self, event: str, **fields: Any) -> None:
        self._open()
        self._write({"kind": "event", "event": event, **fields})

    def heartbeat(self) -> None:
        """Output counts as progress for the watchdog's stall check."""
        self._open()
        now = time.monotonic()
        if now - self.last_touch >= HEARTBEAT_S:
            os.utime(self.path)
            self.last_touch = now

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


class Stop:
    """A stop request (SIGTERM/SIGINT/SIGHUP): forwarded to the running child's group at once, SIGKILL
    after the grace period (checked by the pump loop)."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.requested_at: float | None = None
        self.child_pgid: int | None = None
        self.killed = False

    def request(self, signum: int, _frame: Any = None) -> None:
        if self.requested_at is None:
            self.requested_at = time.monotonic()
        self.forward(signal.SIGTERM)

    def forward(self, sig: int) -> None:
        if self.child_pgid is not None:
            try:
                os.killpg(self.child_pgid, sig)
            except ProcessLookupError:
                pass

    def check(self) -> None:
        if self.requested_at is not None and not self.killed \
                and time.monotonic() - self.requested_at >= self.grace_s:
            self.killed = True
            self.forward(signal.SIGKILL)


class JobMetricsFile:
    """Rows the job appends to ``$GPUCLI_METRICS``, read from where the last read stopped."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.rest = path, 0, b""

    def poll(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        rows = []
        for line in lines:
            try:
                rows.extend(logparse.normalize_json_row(json.loads(line)))
            except ValueError:
                continue  # a torn or non-JSON line is skipped, never fatal
        return rows


class Feeds:
    """Where the run command's metrics come from besides its console: the rows it appends to
    ``$GPUCLI_METRICS`` and the framework files under the code folder (``framefiles.py``), merged with the
    console's rows one per (kind, step)."""

    POLL_S = 0.5

    def __init__(self, job_metrics: JobMetricsFile | None, frames: Any) -> None:
        self.job_metrics, self.frames = job_metrics, frames
        self.merge = framefiles.Merge()
        self.last = -math.inf

    def rows(self, console: list[dict[str, Any]], final: bool = False) -> list[dict[str, Any]]:
        now = time.monotonic()
        found = list(console)
        if final or now - self.last >= self.POLL_S:
            self.last = now
            if self.job_metrics is not None:
                found += [{**r, "source": r.get("source", "job")} for r in self.job_metrics.poll()]
            if self.frames is not None:
                found += self.frames.poll(now + (1e9 if final else 0))  # the end: look for new files once more
        return self.merge.add(found, now) + self.merge.due(now, final)


def pump(cmd: str, *, cwd: Path, env: dict[str, str], log: Any, metrics: Metrics, stop: Stop,
         tail: Any, parser: Any = None, feeds: Feeds | None = None) -> int:
    """Run ``cmd`` with bash in its own process group; tee its output to ``log`` and stdout, read it as
    a terminal shows it and parse it when a ``parser`` is given. Returns the exit status (negative:
    killed by that signal)."""
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    stop.child_pgid = proc.pid
    if stop.requested_at is not None:  # asked to stop while this was being started
        stop.forward(signal.SIGTERM)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    screen = terminal.Terminal()
    open_pipe, exited_at = True, None
    stdout = sys.stdout.buffer

    def lines(done: list[str], final: bool = False) -> None:
        found: list[dict[str, Any]] = []
        for line in done:
            tail.add(line)
            if parser is not None:
                found += parser.feed(line)
        if final and parser is not None:
            found += parser.flush()
        for row in (feeds.rows(found, final) if feeds is not None else found):
            metrics.row(row)

    while True:
        stop.check()
        if metrics.alerts is not None:
            metrics.alerts.tick()
        if open_pipe:
            for _key, _ in sel.select(timeout=0.25):
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    open_pipe = False
                    break
                log.write(data)
                log.flush()
                stdout.write(data)
                stdout.flush()
                metrics.heartbeat()
                lines(screen.feed(decoder.decode(data)))
        else:
            time.sleep(0.1)
        lines([])
        if proc.poll() is not None:
            exited_at = exited_at or time.monotonic()
            # A background process of the job may hold the pipe open: stop reading soon after the exit.
            if not open_pipe or time.monotonic() - exited_at > 2.0:
                break
    sel.close()
    proc.stdout.close()
    lines(screen.feed(decoder.decode(b"", final=True)) + screen.flush(), final=True)
    try:  # what the command left running in its group ends with it
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    stop.child_pgid = None
    return proc.returncode


def setup_marker(run_dir: Path, setup: str) -> tuple[Path, str]:
    return run_dir / ".setup-done", hashlib.sha256(setup.encode()).hexdigest()


def exit_reason(code: int, tail: Any) -> str:
    """``exit 1: KeyError: 'name'`` (the last traceback's exception line when there is one) or
    ``signal 9``."""
    what = f"signal {-code}" if code < 0 else f"exit {code}"
    error = tail.exceptions.found
    return f"{what}: {error}" if error else what


def stop_reason(run_dir: Path) -> str:
    """Who asked the job to stop: the watchdog (a cap, a stall) or ``gpucli down`` write ``stop_reason``
    in the run folder before they signal; a signal from anyone else is ``signal``."""
    try:
        text = (run_dir / "stop_reason").read_text().strip().splitlines()
    except OSError:
        return "signal"
    return f"stopped {text[0][:200]}" if text and text[0].startswith("by ") else "signal"


def story(state: str, reason: str) -> str:
    """The run's end in one line: ``finished (exit 0)``, ``failed (exit 1: KeyError: ...)``,
    ``stopped by cap: max_hours 0.01 h at 36 s``, ``stopped by you``."""
    if reason.startswith("stopped "):
        return reason
    return f"{state} ({reason})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--cwd", required=True, type=Path, help="the code folder: the command runs here")
    ap.add_argument("--cmd", required=True, help="the training command (bash)")
    ap.add_argument("--setup", help="run once before the first --cmd on this pod (bash)")
    ap.add_argument("--metrics-regex", help="named groups step and loss and/or val_loss")
    ap.add_argument("--grace-s", type=float, default=100.0, help="SIGTERM to SIGKILL for the job")
    ap.add_argument("--name", help="GPUCLI_RUN (default: the run folder's name)")
    ap.add_argument("--data", type=Path, help="GPUCLI_DATA (default: RUN_DIR/data/src)")
    ap.add_argument("--checkpoints", type=Path, help="GPUCLI_CHECKPOINTS, relative to --cwd (default checkpoints)")
    ap.add_argument("--gpus", type=int, help="GPUCLI_GPUS (default: nvidia-smi -L)")
    ap.add_argument("--env-file", type=Path, help="more KEY=value variables for the job")
    ap.add_argument("--price-per-hour-usd", type=float, help="for the Telegram cost updates")
    ap.add_argument("--cost-every-h", type=float, default=1.0, help="hours between Telegram cost updates")
    ap.add_argument("--venv", type=Path, help="run --setup and --cmd in this venv (created when missing)")
    ap.add_argument("--logdir", type=Path, action="append", default=[],
                    help="where the job writes TensorBoard/CSV logs, when not under --cwd (repeatable)")
    ap.add_argument("--ack-wait-s", type=float, default=0.0,
                    help="after a failed --setup or --preflight, wait this long for RUN_DIR/.verdict-read before exiting")
    ap.add_argument("--preflight", help="run after --setup, before --cmd, within --preflight-timeout-s (bash)")
    ap.add_argument("--preflight-timeout-s", type=float, default=900.0)
    args = ap.parse_args(argv)

    run_dir, cwd = args.run_dir.resolve(), args.cwd.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        parser = logparse.LogParser(args.metrics_regex)
    except ValueError as exc:  # a bad regex ends here, before anything runs
        print(f"jobrun: {exc}", file=sys.stderr)
        write_status(run_dir, state="failed", reason=str(exc), exit_code=None, log_tail=[str(exc)])
        return 2
    (run_dir / "stop_reason").unlink(missing_ok=True)  # an earlier run's on this folder
    stop = Stop(max(args.grace_s, 0.0))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop.request)

    checkpoints = (cwd / (args.checkpoints or Path("checkpoints"))).resolve()
    checkpoints.mkdir(parents=True, exist_ok=True)
    job_metrics_path = run_dir / "job_metrics.jsonl"
    job_metrics_path.touch()
    env = dict(os.environ)
    if args.env_file is not None:
        env.update(read_env_file(args.env_file))
    env.update({
        "GPUCLI_RUN": args.name or run_dir.name, "GPUCLI_RUN_DIR": str(run_dir),
        "GPUCLI_DATA": str((args.data or run_dir / "data" / "src").resolve()),
        "GPUCLI_CHECKPOINTS": str(checkpoints), "GPUCLI_METRICS": str(job_metrics_path),
        "GPUCLI_GPUS": str(args.gpus if args.gpus is not None else count_gpus()),
    })
    env.setdefault("PYTHONUNBUFFERED", "1")  # a pipe makes Python buffer its prints: tail would lag

    started = time.time()
    metrics = Metrics(run_dir / "metrics.jsonl", {"pid": os.getpid(), "command": args.cmd,
                                                   "gpus": int(env["GPUCLI_GPUS"])})
    tail = terminal.Tail(TAIL_LINES)
    alerts = Alerts(load_notifier(env), env["GPUCLI_RUN"], args.price_per_hour_usd, args.cost_every_h)
    metrics.alerts = alerts
    alerts.started(args.cmd)

    def finish(state: str, reason: str, code: int | None) -> int:
        if reason == "signal":
            reason = stop_reason(run_dir)
        fields: dict[str, Any] = {"reason": reason, "state": state, "story": story(state, reason),
                                  "exit_code": code, "step": metrics.step,
                                  "train_loss": metrics.loss, "val_loss": metrics.val_loss,
                                  "best_val_loss": metrics.best_val, "elapsed_s": time.time() - started}
        if state == "failed":
            fields["log_tail"] = list(tail)
        metrics.event("finished", **fields)
        metrics.close()
        write_status(run_dir, state=state, reason=reason, story=fields["story"], exit_code=code, step=metrics.step,
                     **({"log_tail": list(tail)} if state == "failed" else {}))
        alerts.finished(state, reason, metrics.step, metrics.loss, list(tail))
        if reason.startswith(("setup", "preflight")) and args.ack_wait_s > 0:
            # The launch is attached and polling status.json; on a cloud pod this file's exit makes the
            # watchdog end the pod at once, so stay until the launch has read the verdict (or a while).
            deadline = time.monotonic() + args.ack_wait_s
            while time.monotonic() < deadline and not (run_dir / ".verdict-read").exists():
                time.sleep(0.1)
        if reason == "signal" or reason.startswith("stopped ") or code == 0:
            return 0
        return code if code and code > 0 else 1

    with open(run_dir / "train.log", "ab") as log:
        if args.venv is not None:
            write_status(run_dir, state="running", phase="setup", pid=os.getpid())
            why = use_venv(args.venv.expanduser().resolve(), env, with_pip=bool(args.setup))
            if why is not None:
                tail.add(why)
                return finish("failed", f"setup {why}", None)
            log.write(f"[gpucli] environment: {args.venv}\n".encode())
        if args.setup:
            marker, digest = setup_marker(run_dir, args.setup)
            done = marker.exists() and marker.read_text().strip() == digest
            if not done:
                write_status(run_dir, state="running", phase="setup", pid=os.getpid())
                log.write(f"[gpucli] setup: {args.setup}\n".encode())
                code = pump(args.setup, cwd=cwd, env=env, log=log, metrics=metrics, stop=stop, tail=tail)
                if stop.requested_at is not None:
                    return finish("finished", "signal", code)
                if code != 0:
                    return finish("failed", "setup " + exit_reason(code, tail), code)
                marker.write_text(digest + "\n")
                metrics.event("setup_done", elapsed_s=time.time() - started)
        if args.preflight and stop.requested_at is None:  # the launch waits for its verdict (preflight.json)
            write_status(run_dir, state="running", phase="preflight", pid=os.getpid())
            log.write(f"[gpucli] preflight: {args.preflight}\n".encode())
            t0, limit = time.time(), f"timeout -k 10 {args.preflight_timeout_s:g} " if shutil.which("timeout") else ""
            code = pump(f"{limit}bash -c {shlex.quote(args.preflight)}", cwd=cwd, env=env, log=log, metrics=metrics,
                        stop=stop, tail=tail)
            (run_dir / "preflight.json").write_text(json.dumps({"ok": code == 0, "command": args.preflight,
                                                                "exit_code": code, "seconds": round(time.time() - t0, 1)}))
            if code != 0 and stop.requested_at is None:
                return finish("failed", "preflight " + exit_reason(code, tail), code)
        if stop.requested_at is not None:
            return finish("finished", "signal", None)
        write_status(run_dir, state="running", phase="run", pid=os.getpid())
        log.write(f"[gpucli] run: {args.cmd}\n".encode())
        log.flush()
        frames = framefiles.FrameworkFiles([cwd, *[(cwd / d).resolve() for d in args.logdir]], since=started - 2)
        code = pump(args.cmd, cwd=cwd, env=env, log=log, metrics=metrics, stop=stop, tail=tail, parser=parser,
                    feeds=Feeds(JobMetricsFile(job_metrics_path), frames))
    if stop.requested_at is not None:
        return finish("finished", "signal", code)
    if code == 0:
        return finish("finished", "exit 0", 0)
    return finish("failed", exit_reason(code, tail), code)


if __name__ == "__main__":
    sys.exit(main())
