"""How the nodes of a run over several machines are shown (``gpucli status`` of such a run)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpucli.cli.render import _table, json_out, out

if TYPE_CHECKING:
    from gpucli.run.starting.multinode import NodeStatus
    from gpucli.runs.records import LinkProbe


def node_table(nodes: Sequence[NodeStatus], *, json_: bool, link: LinkProbe | None = None) -> None:
    """Each node's row; ``link``: the nodes' link as measured at launch (each pair's Gbit/s)."""
    if json_:
        json_out({"nodes": [dataclasses.asdict(n) for n in nodes]})
        return
    measured = "" if link is None else f"; link {link.gbps:g} Gbps measured at launch (" + ", ".join(
        f"node {p.rank} -> rank 0 {p.gbps:g}" for p in link.pairs) + ")"
    t = _table(f"{len(nodes)} nodes{measured}")
    for col in ("rank", "where", "state", "GPUs", "step", "last heartbeat"):
        t.add_column(col)
    for n in nodes:
        beat = "-" if n.heartbeat_age_s is None else f"{n.heartbeat_age_s:.0f} s ago"
        t.add_row(str(n.rank), n.where, n.state + (f" ({n.detail})" if n.detail else ""), str(n.gpus),
                  "-" if n.step is None else str(n.step), beat)
    out().print(t)
