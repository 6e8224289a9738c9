"""Runs the user's own training command on the pod the way the bundled trainer runs (standard library only).

    python3 jobrun.py --run-dir D --cwd C --cmd CMD [--setup CMD] [--metrics-regex R] [--grace-s S]
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
3. tees both commands' output to ``train.log`` and to its own stdout (the run's ``console.log``), turns
   the console lines into metrics rows (``logparse.py``) and copies the job's own ``$GPUCLI_METRICS`` rows,
   all into ``metrics.jsonl`` in the trainer's row format (``trainer/watch/metrics.py``), with ``loss_spike``
   events (> 2x the rolling mean loss);
4. ends with ``status.json`` and a ``finished`` event: reason ``exit 0``; ``failed (exit N)`` or
   ``setup failed (exit N)`` (status state ``failed``, the last log lines in ``log_tail``); or ``signal``
   when it was told to stop (state ``finished``, as the trainer writes it).

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
from collections import deque
from pathlib import Path
from types import ModuleType
from typing import Any


def _load_logparse() -> ModuleType:
    """``logparse.py`` is uploaded next to this file (the pod has no gpucli package)."""
    here = Path(__file__).resolve().parent / "logparse.py"
    spec = importlib.util.spec_from_file_location("gpucli_pod_logparse", here)
    if spec is None or spec.loader is None:
        raise ImportError(f"logparse.py not found next to {__file__}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclass-free, but registered as a loaded module should be
    spec.loader.exec_module(module)
    return module


logparse = _load_logparse()


def load_notifier(env: dict[str, str]) -> Any:
    """The bundled trainer's Telegram sender (``notify.py``, standard library only, uploaded beside this
    file) when a token and chat are in the environment; None otherwise. It sends from a thread of its
    own with timeouts and bounded retries: a slow or dead API never holds the job up."""
    path = Path(__file__).resolve().parent / "notify.py"
    if not (env.get("TELEGRAM_BOT_TOKEN") and env.get("TELEGRAM_CHAT_ID")) or not path.is_file():
        return None
    try:
        spec = importlib.util.spec_from_file_location("gpucli_pod_notify", path)
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module.Notifier(env["TELEGRAM_BOT_TOKEN"], env["TELEGRAM_CHAT_ID"],
                               api_base=env.get("TELEGRAM_API_BASE") or None)
    except Exception as exc:  # noqa: BLE001 - alerts are optional; the job runs without them
        print(f"jobrun: Telegram alerts off ({type(exc).__name__})", file=sys.stderr)
        return None


# The alert vocabulary, copied from trainer/spec/alerts.py (this file is standard library only and cannot
# import the trainer); tests/gpucli/pod/test_alert_vocabulary.py holds the two equal.
ALERT_EVENTS = ("run_started", "checkpoint_saved", "validation_complete", "training_complete", "error_occurred",
                "ppl_spike", "stage_transition", "cost_update", "gate_collapse", "static_memory", "refinement_order")


class Alerts:
    """Telegram messages for a job gpucli does not know: started, finished, failed (last lines), loss
    spike (``ppl_spike``: the perplexity is the loss's exponential), and a cost update every
    ``cost_every_h`` hours when the price is known. Event names are :data:`ALERT_EVENTS`."""

    def __init__(self, notifier: Any, name: str, price_per_hour: float | None, cost_every_h: float) -> None:
        self.n, self.name, self.price, self.every_h = notifier, name, price_per_hour, cost_every_h
        self.t0 = time.monotonic()
        self.next_cost_h = cost_every_h

    def send(self, text: str, event: str, final: bool = False) -> None:
        if self.n is not None:
            self.n.send(text, event=event, final=final)

    def started(self, cmd: str) -> None:
        self.send(f"*{self.name}*: started\n`{cmd[:300].replace('`', chr(39))}`", "run_started")

    def spike(self, step: Any, loss: float, mean: float) -> None:
        self.send(f"*{self.name}*: loss spike at step {step}: {loss:.4f} (> 2x the rolling mean {mean:.4f})",
                  "ppl_spike")

    def tick(self) -> None:
        if self.n is None or not self.price or self.every_h <= 0:
            return
        hours = (time.monotonic() - self.t0) / 3600
        if hours >= self.next_cost_h:
            self.next_cost_h = hours + self.every_h
            self.n.cost_update(hours, self.price)

    def finished(self, state: str, reason: str, step: Any, loss: Any, tail: list[str]) -> None:
        if self.n is None:
            return
        where = f" at step {step}" + (f", loss {loss:.4f}" if isinstance(loss, float) else "") if step is not None else ""
        if state == "failed":
            self.n.error_occurred(f"{self.name}: {reason}", step if isinstance(step, int) else 0,
                                  log_tail="\n".join(tail[-15:]))
        else:
            self.send(f"*{self.name}*: finished ({reason}){where}", "training_complete", final=True)
        self.n.close(wait_s=10.0)

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
        self.alerts: Alerts | None = None

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
            self.step, self.loss = step, float(row["loss"])
            mean = self.spikes.update(self.loss)
            if mean is not None:
                self._write({"kind": "event", "event": "loss_spike", "step": step, "loss": self.loss,
                             "rolling_mean_loss": mean})
                if self.alerts is not None:
                    self.alerts.spike(step, self.loss, mean)
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


def pump(cmd: str, *, cwd: Path, env: dict[str, str], log: Any, metrics: Metrics, stop: Stop,
         tail: deque[str], parser: Any = None, job_metrics: JobMetricsFile | None = None) -> int:
    """Run ``cmd`` with bash in its own process group; tee its output to ``log`` and stdout, parse it
    when a ``parser`` is given. Returns the exit status (negative: killed by that signal)."""
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
    text_rest, open_pipe, exited_at = "", True, None
    stdout = sys.stdout.buffer

    def lines(text: str) -> None:
        nonlocal text_rest
        done, text_rest = logparse.split_lines(text_rest + text)
        for line in done:
            tail.append(line.rstrip())
            for row in (parser.feed(line) if parser is not None else ()):
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
                lines(decoder.decode(data))
        else:
            time.sleep(0.1)
        if job_metrics is not None:
            for row in job_metrics.poll():
                metrics.row(row)
        if proc.poll() is not None:
            exited_at = exited_at or time.monotonic()
            # A background process of the job may hold the pipe open: stop reading soon after the exit.
            if not open_pipe or time.monotonic() - exited_at > 2.0:
                break
    sel.close()
    proc.stdout.close()
    lines(decoder.decode(b"", final=True) + "\n")
    try:  # what the command left running in its group ends with it
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    stop.child_pgid = None
    return proc.returncode


def setup_marker(run_dir: Path, setup: str) -> tuple[Path, str]:
    return run_dir / ".setup-done", hashlib.sha256(setup.encode()).hexdigest()


def exit_reason(code: int) -> str:
    return f"failed (signal {-code})" if code < 0 else f"failed (exit {code})"


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
    ap.add_argument("--ack-wait-s", type=float, default=0.0,
                    help="after a failed --setup, wait this long for RUN_DIR/.verdict-read before exiting")
    args = ap.parse_args(argv)

    run_dir, cwd = args.run_dir.resolve(), args.cwd.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        parser = logparse.LogParser(args.metrics_regex)
    except ValueError as exc:  # a bad regex ends here, before anything runs
        print(f"jobrun: {exc}", file=sys.stderr)
        write_status(run_dir, state="failed", reason=str(exc), exit_code=None, log_tail=[str(exc)])
        return 2
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
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    alerts = Alerts(load_notifier(env), env["GPUCLI_RUN"], args.price_per_hour_usd, args.cost_every_h)
    metrics.alerts = alerts
    alerts.started(args.cmd)

    def finish(state: str, reason: str, code: int | None) -> int:
        fields: dict[str, Any] = {"reason": reason, "exit_code": code, "step": metrics.step,
                                  "train_loss": metrics.loss, "val_loss": metrics.val_loss,
                                  "best_val_loss": metrics.best_val, "elapsed_s": time.time() - started}
        if state == "failed":
            fields["log_tail"] = list(tail)
        metrics.event("finished", **fields)
        metrics.close()
        write_status(run_dir, state=state, reason=reason, exit_code=code, step=metrics.step,
                     **({"log_tail": list(tail)} if state == "failed" else {}))
        alerts.finished(state, reason, metrics.step, metrics.loss, list(tail))
        if reason.startswith("setup") and args.ack_wait_s > 0:
            # The launch is attached and polling status.json; on a cloud pod this file's exit makes the
            # watchdog end the pod at once, so stay until the launch has read the verdict (or a while).
            deadline = time.monotonic() + args.ack_wait_s
            while time.monotonic() < deadline and not (run_dir / ".verdict-read").exists():
                time.sleep(0.1)
        if reason == "signal" or code == 0:
            return 0
        return code if code and code > 0 else 1

    with open(run_dir / "train.log", "ab") as log:
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
                    return finish("failed", "setup " + exit_reason(code), code)
                marker.write_text(digest + "\n")
                metrics.event("setup_done", elapsed_s=time.time() - started)
        if stop.requested_at is not None:
            return finish("finished", "signal", None)
        write_status(run_dir, state="running", phase="run", pid=os.getpid())
        log.write(f"[gpucli] run: {args.cmd}\n".encode())
        log.flush()
        code = pump(args.cmd, cwd=cwd, env=env, log=log, metrics=metrics, stop=stop, tail=tail, parser=parser,
                    job_metrics=JobMetricsFile(job_metrics_path))
    if stop.requested_at is not None:
        return finish("finished", "signal", code)
    if code == 0:
        return finish("finished", "exit 0", 0)
    return finish("failed", exit_reason(code), code)


if __name__ == "__main__":
    sys.exit(main())
