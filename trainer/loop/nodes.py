"""One run over several machines: which node this process is on, its global rank, and moving files
between nodes over the process group (no shared disk is assumed).

gpucli starts ``torchrun --nnodes N --node-rank r --rdzv-backend c10d`` on every node and puts
``GPUCLI_NODES`` and ``GPUCLI_NODE_RANK`` in the node's environment. The c10d rendezvous orders the
nodes by address and process id (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py sorts
its participants; ``--node-rank`` is read only by the static backend), so the node torchrun calls
group 0 need not be the node gpucli calls rank 0. Rank 0 writes the metrics, status and the
checkpoint's meta.json into the run folder gpucli reads, on node 0; so the global rank is taken from
gpucli's node rank: ``node_rank * local_world + local_rank``. That is sound because every process
joins the agents' store as a client (``TORCHELASTIC_USE_AGENT_STORE``): no rank hosts a store, and
any consistent numbering of the ranks is a valid process group.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

NODES_ENV = "GPUCLI_NODES"
NODE_RANK_ENV = "GPUCLI_NODE_RANK"
_CHUNK = 8 << 20  # bytes per message when a file crosses nodes


def nodes() -> int:
    try:
        return max(1, int(os.environ.get(NODES_ENV, "1")))
    except ValueError:
        return 1


def multi_node() -> bool:
    return nodes() > 1


def node_rank() -> int:
    try:
        return int(os.environ.get(NODE_RANK_ENV, "0"))
    except ValueError:
        return 0


def global_rank(torchrun_rank: int) -> int:
    """This process's rank in gpucli's numbering (see the module's docstring); torchrun's elsewhere."""
    if not multi_node() or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return torchrun_rank
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return node_rank() * local_world + int(os.environ.get("LOCAL_RANK", "0"))


def local_leader() -> bool:
    """The process that acts for its node's disk (one per node)."""
    return int(os.environ.get("LOCAL_RANK", "0")) == 0


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def files_under(root: Path) -> dict[str, int]:
    """{relative path: size} of the regular files under ``root`` (temp files left out)."""
    out: dict[str, int] = {}
    if not root.is_dir():
        return out
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            if n.endswith(".tmp") or n.startswith(".gpucli-recv"):
                continue
            p = Path(dirpath) / n
            out[p.relative_to(root).as_posix()] = p.stat().st_size
    return out


def transfers(views: list[dict[str, Any]], wanted: dict[int, set[str]]) -> list[tuple[str, int, int]]:
    """(file, from rank, to rank) so that every node in ``wanted`` (node -> files it needs) gets the
    files it lacks, each from the leader of a node that has it. ``views``: per rank, ``{"node",
    "leader", "have": {name: size}}``. Pure, so every rank computes the same list."""
    leaders = {v["node"]: r for r, v in enumerate(views) if v["leader"]}
    have = {v["node"]: v["have"] for v in views if v["leader"]}
    out = []
    for node in sorted(wanted):
        for name in sorted(wanted[node]):
            if name in have.get(node, {}):
                continue
            src = next((n for n in sorted(have) if name in have[n]), None)
            if src is None:
                raise FileNotFoundError(f"{name} is on no node of this run")
            out.append((name, leaders[src], leaders[node]))
    return out


def share_files(root: Path, rank: int, group: Any, wanted: set[str] | None = None) -> int:
    """Collective. Make the files of ``root`` that node 0 has (or, with ``wanted``, those files: what
    this rank needs) present under ``root`` on every node, sent over ``group`` (gloo) from a node that
    has each one. A node sharing node 0's disk, or holding the files already, receives nothing.
    Returns the bytes this rank received."""
    mine = files_under(root) if local_leader() else {}
    view = {"node": node_rank(), "leader": local_leader(), "have": mine, "want": sorted(wanted or ())}
    views: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(views, view, group=group)
    want: dict[int, set[str]] = {}
    if wanted is None:
        base = next(v["have"] for v in views if v["node"] == 0 and v["leader"])
        for v in views:
            if v["leader"] and v["node"] != 0:
                # a node whose copy differs in size gets it again (a half-written earlier attempt)
                want[v["node"]] = {n for n, s in base.items() if v["have"].get(n) != s}
                for n in want[v["node"]]:
                    v["have"].pop(n, None)
    else:
        for v in views:
            want.setdefault(v["node"], set()).update(v["want"])
    received = 0
    for name, src, dst in transfers(views, want):
        if rank == src:
            data = (root / name).read_bytes()
            dist.send(torch.tensor([len(data)], dtype=torch.int64), dst, group=group)
            for i in range(0, len(data), _CHUNK):
                dist.send(torch.frombuffer(bytearray(data[i:i + _CHUNK]), dtype=torch.uint8), dst, group=group)
        elif rank == dst:
            size = torch.zeros(1, dtype=torch.int64)
            dist.recv(size, src, group=group)
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".gpucli-recv-{target.name}")
            with open(tmp, "wb") as fh:
                left = int(size.item())
                while left > 0:
                    buf = torch.empty(min(_CHUNK, left), dtype=torch.uint8)
                    dist.recv(buf, src, group=group)
                    fh.write(buf.numpy().tobytes())
                    left -= buf.numel()
            os.replace(tmp, target)
            received += int(size.item())
    dist.barrier(group=group)
    return received
