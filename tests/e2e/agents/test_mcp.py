"""`gpucli mcp` driven by the MCP SDK's own client over stdio, as an agent's client starts it: the tools,
a plan, the money rules (a launch without a cap, over the per-call limit, over the day's limit), a real
launch on this machine with its status and down, the runs resource, and no secret in any message."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import anyio
import pytest

mcp = pytest.importorskip("mcp")
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SECRETS = {"RUNPOD_API_KEY": "rp_fake_secret_7f3a9c1e55", "VAST_API_KEY": "vast_fake_secret_2b8d4e6f01",
           "HF_TOKEN": "hf_fake_secret_Zx81qLmN20", "TELEGRAM_BOT_TOKEN": "123456:tg_fake_secret_Qw9"}
TINY = ["model.max_seq_len=64", "training.seq_len=64", "training.batch_size=4", "training.log_interval=1",
        "training.checkpoint_interval=5", "training.val_batches=2", "training.eval_max_new_tokens=4",
        "training.eval_prompts=[]", "training.tcf=false", "data.max_bytes=200000"]


def _text(result) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


def test_mcp_server_over_stdio(isolated_home, tmp_path):
    # The human's limit, in the user config an agent has no tool to change.
    (Path(isolated_home) / "config.yaml").write_text("mcp_max_usd: 1.0\n")
    env = {"GPUCLI_HOME": str(isolated_home), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **SECRETS}
    errlog = (tmp_path / "server.err").open("w")
    seen: list[str] = []

    async def call(session, tool, **args):
        result = await session.call_tool(tool, args)
        text = _text(result)
        seen.append(text)
        return result.is_error, text

    async def main() -> None:
        params = StdioServerParameters(command=sys.executable, args=["-m", "gpucli", "mcp"], env=env, cwd=str(tmp_path))
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            names = {t.name for t in tools.tools}
            assert {"plan", "offers", "launch", "status", "tail", "logs", "fetch_best", "export", "down", "ls",
                    "sweep", "sweep_status"} <= names
            for t in tools.tools:  # no tool takes a secret
                seen.append(json.dumps(t.input_schema if hasattr(t, "input_schema") else t.inputSchema))
                assert not {"key", "api_key", "token", "env"} & set((getattr(t, "input_schema", None) or {}).get(
                    "properties", {}))

            failed, text = await call(session, "plan", model="124m", tokens="1B")
            assert not failed, text
            plan = json.loads(text)
            assert plan and "error" not in text.lower()[:20]

            failed, text = await call(session, "launch", profile="cpu", provider="local")
            assert failed and "needs a cap" in text and "\n" not in text.strip()

            # The trainer's own copy of the caps is not a setting an agent may pass.
            failed, text = await call(session, "launch", profile="cpu", provider="local", hours=0.1,
                                      settings=["limits.budget_usd=1000"])
            assert failed and "limits are budget_usd and hours" in text

            # Over the human's $1 per call: refused after the dry run, before anything is searched or rented.
            failed, text = await call(session, "launch", profile="h100", provider="runpod", budget_usd=5.0,
                                      confirm=True, name="agent-big")
            assert failed and "per call" in text
            # $0.70 already committed today (an earlier call's reservation): another $0.50 is over the day's $1.
            ledger = Path(isolated_home) / "mcp" / "spend.jsonl"
            ledger.parent.mkdir(parents=True, exist_ok=True)
            today = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            ledger.write_text(json.dumps({"at": today, "what": "launch", "name": "earlier", "cap_usd": 0.7}) + "\n")
            failed, text = await call(session, "launch", profile="h100", provider="runpod", budget_usd=0.5,
                                      confirm=True, name="agent-day")
            assert failed and "today" in text
            assert not list((Path(isolated_home) / "runs").glob("agent-*.json"))

            # On this machine (no price: it costs nothing) an hour cap is the cap.
            args = dict(profile="cpu", provider="local", hours=0.5, steps=400, name="agent-run", settings=TINY)
            failed, text = await call(session, "launch", **args)  # a dry run by default
            assert not failed, text
            assert json.loads(text)["run"] == "agent-run"
            assert not (Path(isolated_home) / "runs" / "agent-run.json").exists()

            failed, text = await call(session, "launch", **args, confirm=True)
            assert not failed, text
            started = json.loads(text)
            assert started["name"] == "agent-run" and started["status"] == "running"
            try:
                async def training():
                    failed, text = await call(session, "status", run="agent-run")
                    assert not failed, text
                    return json.loads(text)["step"]

                deadline = anyio.current_time() + 180
                while not await training():
                    assert anyio.current_time() < deadline, "no training step in 180 s"
                    await anyio.sleep(1)
                failed, text = await call(session, "tail", run="agent-run", rows=3)
                assert not failed and len(text.splitlines()) == 3 and json.loads(text.splitlines()[-1])

                failed, text = await call(session, "status", run="nope")
                assert failed and "unknown run 'nope'" in text and "\n" not in text.strip()

                # A sweep: a dry run first, then started in the background, watched, and ended by its name.
                sweep_args = dict(settings=["training.learning_rate=0.0003,0.001", *TINY], profile="cpu",
                                  provider="local", steps=400, name="agent-sweep")
                failed, text = await call(session, "sweep", **sweep_args)
                assert not failed, text
                assert json.loads(text)["dry_run"] is True and len(json.loads(text)["runs"]) == 2
                assert not (Path(isolated_home) / "sweeps" / "agent-sweep.json").exists()
                failed, text = await call(session, "sweep", **sweep_args, confirm=True)
                assert not failed, text
                assert json.loads(text)["sweep"] == "agent-sweep"

                async def sweep_running():
                    failed, text = await call(session, "sweep_status", name="agent-sweep")
                    assert not failed, text
                    return json.loads(text)["runs"][0]["state"] == "running"

                deadline = anyio.current_time() + 180
                while not await sweep_running():
                    assert anyio.current_time() < deadline, "the sweep's first run never ran"
                    await anyio.sleep(1)
                failed, text = await call(session, "down", run="agent-sweep")
                assert not failed and json.loads(text)["runs_ended"] == ["agent-sweep-1"], text

                resource = await session.read_resource("gpucli://runs")
                listing = "\n".join(getattr(c, "text", "") for c in resource.contents)
                seen.append(listing)
                assert "agent-run" in listing
            finally:
                failed, text = await call(session, "down", run="agent-run")
            assert not failed, text
            assert json.loads(text)["run"] == "agent-run"
            failed, text = await call(session, "status", run="agent-run")
            assert not failed and json.loads(text)["state"] in ("stopped", "finished")

    anyio.run(main)
    errlog.close()
    everything = "\n".join(seen) + (tmp_path / "server.err").read_text()
    for name, value in SECRETS.items():
        assert value not in everything, f"{name}'s value in a message"
    ledger = (Path(isolated_home) / "mcp" / "spend.jsonl").read_text().splitlines()
    assert [json.loads(line)["name"] for line in ledger] == ["earlier"]  # refused calls reserve nothing
