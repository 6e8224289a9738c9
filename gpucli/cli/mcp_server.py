"""``gpucli mcp``: the commands as tools of a Model Context Protocol server over stdio, for an agent.

Each tool runs the gpucli command it is named for, with ``--json``, in a child process, and returns
exactly what that command prints; a command that fails is a tool error whose text is the command's
own one-line message. A child process because stdout is this server's protocol channel: nothing a
command prints (progress, a library's warning) can reach it, and a command's state (its catalogue,
consoles, signal handlers) never outlives the call.

The money rules, which the agent cannot change (no tool sets them):

* ``launch`` and ``sweep`` need a cap (``budget_usd``, or ``hours`` for a launch); without
  ``confirm=true`` they are a dry run and start nothing.
* A launch or sweep whose most possible cost is above ``GPUCLI_MCP_MAX_USD`` (the client's
  environment, written by a person) or ``mcp_max_usd`` (``gpucli config set mcp_max_usd 20``),
  the lower of the two, is refused; so is one that would take the day's total of such caps (UTC day,
  kept in ``<GPUCLI_HOME>/mcp/spend.jsonl`` before anything starts) above it. With neither set, only
  launches that cost nothing (your own machine) are allowed. The cap goes to the run as ``--budget``,
  so the pod's trainer and watchdog hold it even when nothing watches.
* Secrets are never a tool's input (no tool takes a key or an environment value) nor its output:
  every value of a key gpucli knows or of a secret-looking variable is masked in all that comes back.

Reference: the MCP Python SDK (``mcp`` on PyPI, modelcontextprotocol/python-sdk), its stdio server.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer  # the SDK's 2.x names (1.x called it FastMCP)
from mcp.server.mcpserver.exceptions import ToolError

from gpucli.runs import userconfig
from gpucli.settings import home, load_keys

_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
_MASK = "[secret]"
_MAX_TAIL_ROWS = 500
_MAX_LOG_LINES = 1000
_MAX_LINE = 2000
_TIMEOUTS = {"quick": 180.0, "launch": 1800.0, "transfer": 3600.0}


class McpRefused(ToolError):
    """A call the money rules refuse (its message says which rule and who can change it)."""


# -- running a command ---------------------------------------------------------------------------------

def _secrets() -> list[str]:
    """Every secret value this process could leak: gpucli's keys and secret-looking variables."""
    values = {v for k, v in os.environ.items() if _SECRET_NAME.search(k)}
    with contextlib.suppress(Exception):  # an unreadable keys file hides nothing: it has nothing to mask
        values |= set(load_keys().values())
    return sorted((v for v in values if isinstance(v, str) and len(v) >= 6), key=len, reverse=True)


def masked(text: str) -> str:
    for value in _secrets():
        text = text.replace(value, _MASK)
    return text


def _run(args: list[str], *, timeout_s: float) -> tuple[int, str, str]:
    """``gpucli ARGS`` in a child process: (exit code, stdout, stderr). Its output goes to files, not
    pipes: a launch leaves detached processes behind that must not hold this call open."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        try:
            code = subprocess.run([sys.executable, "-m", "gpucli", *args], stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=err, timeout=timeout_s, check=False).returncode
        except subprocess.TimeoutExpired:
            code = 124
            err.write(f"\nError: gpucli {args[0]} took more than {timeout_s:.0f} s (see `gpucli ls`)\n")
        out.seek(0)
        err.seek(0)
        return code, out.read(), err.read()


def _error_line(code: int, err: str) -> str:
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    return (errors[-1] if errors else lines[-1] if lines else f"gpucli exited with status {code}").removeprefix(
        "Error: ")


def _call(args: list[str], *, timeout: str = "quick") -> str:
    code, out, err = _run(args, timeout_s=_TIMEOUTS[timeout])
    if code != 0:
        raise ToolError(masked(_error_line(code, err)))
    return masked(out.strip())


async def _gpucli(args: list[str], *, timeout: str = "quick") -> str:
    return await anyio.to_thread.run_sync(lambda: _call(args, timeout=timeout))


def _opt(flag: str, value: Any) -> list[str]:
    """``--flag=value`` (one token: a value starting with '-' is never read as an option), or nothing."""
    if value is None or value is False:
        return []
    return [flag] if value is True else [f"{flag}={value}"]


def _name(value: str | None, what: str = "run") -> list[str]:
    if value is None:
        return []
    if not isinstance(value, str) or not value or value.startswith("-") or len(value) > 128:
        raise ToolError(f"{what} name {value!r} is not valid")
    return [value]


# -- the money rules ------------------------------------------------------------------------------------

def max_usd() -> float | None:
    """The most one call may commit, and all calls of a UTC day together: the lower of
    GPUCLI_MCP_MAX_USD and the user config's mcp_max_usd; None when neither is set."""
    found = []
    env = os.environ.get("GPUCLI_MCP_MAX_USD")
    if env:
        try:
            value = float(env)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise McpRefused(f"GPUCLI_MCP_MAX_USD must be a number of dollars, got {env!r}")
        found.append(value)
    configured = userconfig.get(userconfig.load(), "mcp_max_usd")
    if configured is not None:
        found.append(float(configured))
    return min(found) if found else None


def _ledger() -> Path:
    return home() / "mcp" / "spend.jsonl"


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    path = _ledger()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # two servers (two agents) reserve one after the other
        yield
    finally:
        os.close(fd)


def committed_today() -> float:
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    total = 0.0
    with contextlib.suppress(FileNotFoundError):
        for line in _ledger().read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                row = json.loads(line)
                if str(row["at"]).startswith(today):
                    total += float(row["cap_usd"])
    return total


def reserve(what: str, name: str | None, cap_usd: float) -> None:
    """Refuse ``cap_usd`` over the per-call or the day's limit; else write it down (before anything starts)."""
    if cap_usd <= 0:
        return
    limit = max_usd()
    if limit is None:
        raise McpRefused(f"{what} of up to ${cap_usd:.2f} refused: no spending limit is set for agents "
                         "(a person sets one: `gpucli config set mcp_max_usd 20`, or GPUCLI_MCP_MAX_USD in the "
                         "MCP client's config)")
    if cap_usd > limit:
        raise McpRefused(f"{what} of up to ${cap_usd:.2f} refused: above the ${limit:.2f} an agent may commit "
                         "per call (GPUCLI_MCP_MAX_USD / mcp_max_usd, set by a person)")
    with _locked():
        day = committed_today()
        if day + cap_usd > limit + 1e-9:
            raise McpRefused(f"{what} of up to ${cap_usd:.2f} refused: ${day:.2f} committed today, and the day's "
                             f"limit is ${limit:.2f} (GPUCLI_MCP_MAX_USD / mcp_max_usd, set by a person)")
        path = _ledger()
        with path.open("a") as fh:
            fh.write(json.dumps({"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                 "what": what, "name": name, "cap_usd": round(cap_usd, 4)}) + "\n")
        os.chmod(path, 0o600)


def most_cost(budget_usd: float | None, hours: float | None, price_per_hour_usd: float | None) -> float:
    """The most a run can cost: its budget, else its hours at its price (0: a machine with no price)."""
    if budget_usd is not None:
        return budget_usd
    return (hours or 0.0) * (price_per_hour_usd or 0.0)


def _positive(label: str, value: float | None) -> None:
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ToolError(f"{label} must be a positive number, got {value}")


# -- the server -------------------------------------------------------------------------------------------

def _launch_args(profile: str, provider: str | None, model: str | None, phase: str | None, steps: int | None,
                 hours: float | None, name: str | None, data: str | None, spot: bool,
                 settings: list[str] | None) -> list[str]:
    args = [*_opt("--profile", profile), *_opt("--provider", provider), *_opt("--model", model),
            *_opt("--phase", phase), *_opt("--steps", steps), *_opt("--hours", hours), *_opt("--name", name),
            *_opt("--data", data), *_opt("--spot", spot)]
    for item in settings or []:
        if str(item).removeprefix("--").strip().startswith("limits."):  # the caps are budget_usd and hours only
            raise McpRefused(f"setting {item!r} refused: a run's limits are budget_usd and hours")
        args += _opt("--set", item)
    return args


def build() -> MCPServer:
    """The server and its tools (``gpucli mcp`` runs it over stdio)."""
    server = MCPServer("gpucli", instructions=(
        "Plan, rent, train and stop language-model runs on rented GPUs. Money rules: launch and sweep need "
        "a cap and are dry runs unless confirm=true; a cap above the human's GPUCLI_MCP_MAX_USD (per call "
        "and per day) is refused. Read docs/agents.md of gpucli for the workflow."))

    @server.tool(description="Plan a training run: every GPU setup that fits, its hours and dollars, the "
                             "Pareto front (gpucli plan --json).")
    async def plan(model: str, tokens: str | None = None, budget_usd: float | None = None,
                   deadline: str | None = None, gpu: str | None = None, spot: bool = False,
                   live: bool = False) -> str:
        return await _gpucli(["plan", *_opt("--model", model), *_opt("--tokens", tokens),
                              *_opt("--budget", budget_usd), *_opt("--deadline", deadline), *_opt("--gpu", gpu),
                              *_opt("--spot", spot), *_opt("--live", live), "--no-chart", "--json"])

    @server.tool(description="Live GPU offers (gpucli offers --json); query in vast.ai's words, e.g. "
                             "'gpu_name=RTX_4090 reliability>0.98'.")
    async def offers(query: str | None = None, provider: str | None = None, spot: bool = False,
                     limit: int = 20) -> str:
        return await _gpucli(["offers", *([query] if query and not query.startswith("-") else []),
                              *_opt("--provider", provider), *_opt("--spot", spot),
                              *_opt("--limit", max(1, min(int(limit), 100))), "--json"])

    @server.tool(description="Launch a run of the bundled trainer. A cap is required: budget_usd, or hours. "
                             "Without confirm=true it is a dry run (gpucli launch --dry-run --json) and starts "
                             "nothing; with it, the run starts if its most possible cost is within the human's "
                             "per-call and per-day limit, and returns gpucli launch --json.")
    async def launch(profile: str, provider: str | None = None, model: str | None = None, phase: str | None = None,
                     steps: int | None = None, budget_usd: float | None = None, hours: float | None = None,
                     name: str | None = None, data: str | None = None, spot: bool = False,
                     settings: list[str] | None = None, confirm: bool = False) -> str:
        if budget_usd is None and hours is None:
            raise McpRefused("a launch needs a cap: budget_usd (dollars) or hours; the run stops at it")
        _positive("budget_usd", budget_usd)
        _positive("hours", hours)
        args = _launch_args(profile, provider, model, phase, steps, hours, name, data, spot, settings)
        dry = await _gpucli(["launch", *args, *_opt("--budget", budget_usd), "--dry-run", "--json"])
        if not confirm:
            return dry
        planned = json.loads(dry)
        cap = most_cost(budget_usd, hours, planned.get("price_per_hour_usd"))
        reserve("launch", planned.get("run"), cap)
        budget = budget_usd if budget_usd is not None else (round(cap, 4) if cap > 0 else None)
        return await _gpucli(["launch", *args, *_opt("--budget", budget), "--json"], timeout="launch")

    @server.tool(description="One run's state, step, loss, cost so far and ETA (gpucli status --json).")
    async def status(run: str | None = None) -> str:
        return await _gpucli(["status", *_name(run), "--json"])

    @server.tool(description="Every run with its state and cost (gpucli ls --json).")
    async def ls() -> str:
        return await _gpucli(["ls", "--json"])

    @server.tool(description=f"The newest metrics rows of a run, at most {_MAX_TAIL_ROWS} "
                             "(gpucli tail --no-follow --json: one JSON object a line).")
    async def tail(run: str | None = None, rows: int = 50) -> str:
        text = await _gpucli(["tail", *_name(run), "--no-follow", "--json"])
        keep = max(1, min(int(rows), _MAX_TAIL_ROWS))
        return "\n".join(text.splitlines()[-keep:])

    @server.tool(description=f"The newest lines of a run's console output, at most {_MAX_LOG_LINES} "
                             "(gpucli logs), as JSON.")
    async def logs(run: str | None = None, lines: int = 100, since: str | None = None) -> str:
        text = await _gpucli(["logs", *_name(run), *_opt("--since", since)])
        keep = max(1, min(int(lines), _MAX_LOG_LINES))
        got = text.splitlines()
        return json.dumps({"run": run, "lines": [line[:_MAX_LINE] for line in got[-keep:]],
                           "truncated": len(got) > keep})

    @server.tool(description="Download a run's checkpoint with the lowest validation loss (gpucli fetch-best --json).")
    async def fetch_best(run: str | None = None, dest: str = "checkpoints") -> str:
        return await _gpucli(["fetch-best", *_name(run), *_opt("--dest", dest), "--json"], timeout="transfer")

    @server.tool(description="Export a run's best weights as a Hugging Face folder (gpucli export --json).")
    async def export(run: str | None = None, dest: str | None = None) -> str:
        return await _gpucli(["export", *_name(run), *_opt("--dest", dest), "--json"], timeout="transfer")

    @server.tool(description="Stop a run (or every run of a sweep, by its name) and release its machine "
                             "(gpucli down --json).")
    async def down(run: str) -> str:
        return await _gpucli(["down", *_name(run), "--json"], timeout="launch")

    @server.tool(description="A sweep: one run per combination of settings (e.g. "
                             "['training.learning_rate=0.0003,0.001']), at most `parallel` at once, under one "
                             "budget_usd for all. Without confirm=true a dry run (each run's plan); with it, the "
                             "sweep is started in the background and its status returned (gpucli sweep status "
                             "--json); call sweep_status later.")
    async def sweep(settings: list[str], profile: str, budget_usd: float | None = None, parallel: int = 1,
                    provider: str | None = None, model: str | None = None, steps: int | None = None,
                    hours: float | None = None, name: str | None = None, confirm: bool = False) -> str:
        _positive("budget_usd", budget_usd)
        args = [*_launch_args(profile, provider, model, None, steps, hours, name, None, False, settings),
                *_opt("--budget", budget_usd), *_opt("--parallel", max(1, int(parallel)))]
        dry = await _gpucli(["sweep", *args, "--dry-run", "--json"])
        if not confirm:
            return dry
        planned = json.loads(dry)
        runs = planned.get("runs") or []
        price = max((r.get("price_per_hour_usd") or 0.0 for r in runs), default=0.0)
        cap = budget_usd if budget_usd is not None else most_cost(None, hours, price) * len(runs)
        reserve("sweep", planned["sweep"], cap)
        return await anyio.to_thread.run_sync(lambda: _start_sweep(planned["sweep"], args))  # its name: the dry run's

    @server.tool(description="A sweep's runs: settings, state, step, loss, val loss, $ and ETA, the best "
                             "marked (gpucli sweep status --json).")
    async def sweep_status(name: str) -> str:
        return await _gpucli(["sweep", "status", *_name(name, "sweep"), "--json"])

    @server.resource("gpucli://runs", name="runs", description="Every run with its state and cost (gpucli ls --json).",
                     mime_type="application/json")
    async def runs_resource() -> str:
        return await _gpucli(["ls", "--json"])

    return server


def _start_sweep(name: str, args: list[str]) -> str:
    """The sweep's driver as a process of its own (it outlives this call, as `gpucli sweep` in a
    terminal would), its output in ``<GPUCLI_HOME>/sweeps/NAME.log``; then its status."""
    folder = home() / "sweeps"
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"{name}.log"
    with log_path.open("a") as log:
        named = args if any(a.startswith("--name=") for a in args) else [*args, f"--name={name}"]
        driver = subprocess.Popen([sys.executable, "-m", "gpucli", "sweep", *named, "--poll=5"],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + _TIMEOUTS["quick"]
    while not (folder / f"{name}.json").exists():
        code = driver.poll()
        if code is not None or time.monotonic() > deadline:
            raise ToolError(masked(_error_line(code or 1, log_path.read_text()[-4000:])))
        time.sleep(0.5)
    return _call(["sweep", "status", name, "--json"])


def serve() -> None:
    """Serve over stdio until the client closes it."""
    build().run("stdio")
