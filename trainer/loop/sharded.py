"""Sharded checkpoints for a run over several nodes, with ``torch.distributed.checkpoint`` (DCP).

Every node keeps its own copy of the run folder (no shared disk is assumed), so a checkpoint of a
multi-node run is spread over the nodes::

    node 0: checkpoints/step_000500/{meta.json, dcp/.metadata, dcp/__0_0.distcp, rank0.pt, model.pt?}
    node r: checkpoints/step_000500/{meta.json, dcp/__r_0.distcp, rank<r>.pt}

Each rank writes only the tensors it holds (FSDP2: its shards; DDP: DCP spreads the replicated
tensors over the ranks, each written once), so no node gathers the whole model to save. meta.json
on each node lists that node's files with their sha256 (``trainer.loop.checkpoint.verify`` checks a
node's copy as it checks a single-node checkpoint) and, under ``nodes``, every node's. ``model.pt``,
the consolidated weights ``fetch-best`` brings home (and ``model.safetensors``, the same weights
without pickle, where safetensors is installed), is written by rank 0 for the final and emergency
checkpoints, and for every checkpoint when the model is not sharded (rank 0 holds it whole anyway).

A resume asks DCP's load planner which files each rank reads and fetches the ones its node lacks
from the node that has them (:func:`trainer.loop.nodes.share_files`); DCP reshards to the new world,
so a run saved on 2 nodes resumes on 1 (its nodes' files in one folder) or on more. The per-rank file
(RNG state, memory states) is restored when the world size is the same.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer.loop import checkpoint as ckpt
from trainer.loop import nodes
from trainer.loop.dist import rng_state, set_rng_state
from trainer.model.memory import MemoryState
from trainer.spec.config import ConfigError

Checkpointer = Any  # trainer.loop.checkpointer.Checkpointer (which calls this module: not imported here)

FORMAT = "dcp"


def wanted() -> bool:
    """Whether this run writes sharded checkpoints (a run over several nodes)."""
    return nodes.multi_node()


def is_sharded(path: Path) -> bool:
    meta = ckpt.read_meta(path)
    return bool(meta and meta.get("format") == FORMAT)


def _states(c: Checkpointer) -> dict[str, Any]:
    # lazy: torch.distributed.checkpoint (2 s of every run's start-up) only for sharded runs over several nodes
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    return {"model": get_model_state_dict(c.raw), "optim": get_optimizer_state_dict(c.raw, c.optimizer)}


def _hashes(folder: Path) -> dict[str, str]:
    return {name: nodes.sha256_of(folder / name) for name in sorted(nodes.files_under(folder))}


def save(c: Checkpointer, step: int, meta: dict[str, Any], extra_files: dict[str, Path], kind: str) -> Path:
    """Collective: every rank writes its part into ``.tmp_step_N`` on its node; each node renames its
    folder into place once every rank's part is written."""
    import torch.distributed.checkpoint as dcp  # lazy: only for sharded runs (start-up time)

    d = c.d
    final = c.root / ckpt.step_dir_name(step)
    tmp = c.root / f".tmp_{ckpt.step_dir_name(step)}"
    if nodes.local_leader():
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "dcp").mkdir(parents=True)
    d.barrier()
    dcp.save(_states(c), storage_writer=dcp.FileSystemWriter(str(tmp / "dcp")))
    torch.save({"rng": rng_state(d.device),
                "memory": [{"M": s.M.detach().float().cpu().clone(), "S": s.S.detach().float().cpu().clone()}
                           for s in c.memory_states]}, tmp / f"rank{d.rank}.pt")
    consolidated = kind != "regular" or not c.fsdp
    whole = c.model_state() if consolidated else None  # FSDP: gathered to rank 0 only for these
    if d.master:
        if whole is not None:
            ckpt.save_files({"model.pt": whole}, tmp)
            ckpt.safetensors_copy(whole, tmp)  # beside the consolidated weights only (hashed with the rest)
        for name, src in extra_files.items():
            shutil.copyfile(src, tmp / name)
    d.barrier()
    mine = _hashes(tmp) if nodes.local_leader() else None
    every = d.gather((nodes.node_rank(), mine))
    by_node = {str(n): files for n, files in every if files is not None}
    if nodes.local_leader():
        assert mine is not None
        full = dict(meta, step=step, world_size=d.world, format=FORMAT, nodes=by_node, files=mine,
                    sha256=mine.get("model.pt"), consolidated="model.pt" in mine)
        (tmp / "meta.json").write_text(json.dumps(full, indent=1, default=str))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        removed = ckpt.prune(c.root, c.keep_last)
        if d.master and removed:
            c.log(f"pruned {', '.join(p.name for p in removed)}")
    d.barrier()
    return final


def _needed(c: Checkpointer, state: dict[str, Any], folder: Path, same_world: bool) -> set[str]:
    """The files under ``folder`` this rank reads: DCP's load plan for its state, and its rank file."""
    from torch.distributed.checkpoint import FileSystemReader  # lazy: only for sharded runs (start-up time)
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner  # lazy: as above
    md = FileSystemReader(str(folder / "dcp")).read_metadata()
    planner = DefaultLoadPlanner()
    planner.set_up_planner(state, md, is_coordinator=False)
    plan = planner.create_local_plan()
    storage = md.storage_data or {}
    names = {f"dcp/{storage[item.storage_index].relative_path}" for item in plan.items}
    if same_world:
        names.add(f"rank{c.d.rank}.pt")
    return names


def load(c: Checkpointer, path: Path) -> dict[str, Any]:
    """Weights, optimizer moments and (same world size) RNG state from a sharded checkpoint; the
    files this rank reads are fetched from the node that has them first. Returns rank 0's meta."""
    import torch.distributed.checkpoint as dcp  # lazy: only for sharded runs (start-up time)
    from torch.distributed.checkpoint.state_dict import (  # lazy: as above
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    d = c.d
    folder = c.root / Path(path).name
    group = d.ctrl if dist.is_initialized() else None
    meta = ckpt.read_meta(folder) if d.master else None
    if group is not None:
        meta = d.broadcast(meta)
        if nodes.local_leader():
            folder.mkdir(parents=True, exist_ok=True)
        nodes.share_files(folder, d.rank, group, wanted={"dcp/.metadata"})
    assert meta is not None
    same_world = meta.get("world_size") == d.world
    state = _states(c)
    need = _needed(c, state, folder, same_world)
    if group is not None:
        nodes.share_files(folder, d.rank, group, wanted=need)
    missing = sorted(n for n in need if not (folder / n).exists())
    if missing:
        raise ConfigError(f"cannot resume from {folder.name}: {', '.join(missing[:3])} missing "
                          "(the shards of a node that is not in this run: copy its checkpoint folder here)")
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(folder / "dcp")))
    set_model_state_dict(c.raw, state["model"])
    set_optimizer_state_dict(c.raw, c.optimizer, state["optim"])

    c.memory_states = []
    if same_world:
        own = torch.load(folder / f"rank{d.rank}.pt", map_location="cpu", weights_only=True)
        set_rng_state(own["rng"], d.device)
        c.memory_states = [MemoryState(s["M"].to(d.device), s["S"].to(d.device)) for s in own.get("memory") or []]
    else:
        c.log(f"resume: {folder.name} was written by {meta.get('world_size')} ranks, this run has {d.world}: "
              "weights and optimizer moments resharded, RNG state restarts")
    return meta
