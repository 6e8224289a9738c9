"""``gpucli mcp``: gpucli's commands as the tools of a Model Context Protocol server (cli/mcp_server.py)."""

from __future__ import annotations

import typer


def mcp() -> None:
    """Serve gpucli's commands as MCP tools over stdio, for an agent (needs gpucli[mcp]; see docs/agents.md).
    Launches need a cap, are dry runs unless confirmed, and stay within GPUCLI_MCP_MAX_USD per call and per day."""
    from gpucli.errors import UsageError

    try:
        from gpucli.cli import mcp_server
    except ImportError as exc:
        raise UsageError(f"gpucli mcp needs the MCP SDK ({exc.name or exc})", hint="pip install 'gpucli[mcp]'") from None
    mcp_server.serve()


def register(app: typer.Typer) -> None:
    app.command("mcp")(mcp)
