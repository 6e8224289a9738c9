"""Starting one run on several machines (``gpucli launch --nodes N``): connect to every node and check
them, then start the trainer (or the user's command) and its watchdog on each, rank 0 first; a
launch that fails ends every node it started. The layout, commands and variables are
:mod:`gpucli.run.nodes`'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError
from gpucli.run import records as runs
from gpucli.run.nodes import (
    NCCL_IFNAME,
    as_run,
    check_nodes,
    end_nodes,
    layout,
    node_env,
    ports_for,
)
from gpucli.run.records import NodeRecord, RunRecord

if TYPE_CHECKING:
    from gpucli.run.targets import Host


def launch_nodes(prepared: Any, *, on_step: Callable[[str], None], on_warn: Callable[[str], None],
                 on_info: Callable[[str], None], save: Callable[[RunRecord], Any] = runs.save) -> RunRecord:
    """Start a ``PreparedLaunch`` on every node, rank 0 first; a launch that fails ends every node it
    started."""
    from gpucli.run.start import record_for, start_on_host
    from gpucli.run.targets import get_target

    resolved, req, own = prepared.resolved, prepared.request, prepared.own
    target = get_target(resolved.provider)
    specs = layout(req, resolved.workdir)
    record = record_for(resolved).with_(launch=prepared.inputs, ssh=specs[0].ssh, nodes=tuple(
        NodeRecord(rank=s.rank, workdir=s.workdir, ssh=s.ssh) for s in specs[1:]))
    if own is not None:
        record = record.with_(model="own-code", phase="own-code")
    save(record)  # written before anything waits
    hosts: list[Host] = []
    port, peer_port = ports_for(resolved.name, resolved.provider)
    try:
        for spec in specs:
            node = record if spec.rank == 0 else as_run(record, record.nodes[spec.rank - 1])
            on_step(f"node {spec.rank}: connecting to {spec.ssh or 'this machine'}")
            host = target.open(node)
            hosts.append(host)
            if spec.ssh is not None and host.host_key:
                pinned = dataclasses.replace(spec.ssh, host_key=host.host_key)
                record = record.with_(ssh=pinned) if spec.rank == 0 else set_node(record, spec.rank, ssh=pinned)
                save(record)
        ifname = req.nccl_ifname or NCCL_IFNAME.get(resolved.provider)
        check_nodes(hosts, specs, resolved.n_gpus if resolved.gpu_id else 0, ifname)
        gpus = resolved.n_gpus if resolved.gpu_id else 0
        for spec, host in zip(specs, hosts, strict=True):
            env = node_env(specs, spec.rank, gpus, port, resolved.provider, req.nccl_ifname)
            watch = ("--nodes", str(len(specs)), "--node-rank", str(spec.rank),
                     "--peer-addr", f"{specs[0].address}:{peer_port}",
                     # a node silent for the stall window is lost (a crash is told at once)
                     "--peer-timeout-s", f"{(resolved.limits.stall_minutes or 30) * 60:g}")
            on_step(f"node {spec.rank}: starting")
            if spec.rank == 0:
                record = start_on_host(host, resolved, record, on_event=on_step, save=save, own=own,
                                       node_env=env, watch_args=watch)
                continue
            mine = dataclasses.replace(resolved, workdir=spec.workdir,
                                       data=resolved.data if own is not None else None, data_plan=None)

            def save_node(rr: RunRecord, rank: int = spec.rank) -> None:
                nonlocal record
                record = set_node(record, rank, pid=rr.pid, pid_ident=rr.pid_ident, watchdog_pid=rr.watchdog_pid,
                                   watchdog_ident=rr.watchdog_ident)
                save(record)

            start_on_host(host, mine, as_run(record, record.nodes[spec.rank - 1]), on_event=on_step,
                          save=save_node, own=own, node_env=env, watch_args=watch)
        on_step(f"{len(specs)} nodes started; rendezvous on {specs[0].address}:{port}")
        return record
    except BaseException as exc:
        message = str(exc) if isinstance(exc, GpucliError) else f"{type(exc).__name__}: {exc}"
        ended = end_nodes(record, on_warn=on_warn)
        save(record.with_(status="failed", ended_at=runs.now_iso(), message=message[:500]))
        if ended:
            on_info(f"stopped the run on node {', '.join(map(str, ended))} of the failed launch")
        raise
    finally:
        for host in hosts:
            host.close()


def set_node(record: RunRecord, rank: int, **changes: Any) -> RunRecord:
    nodes = list(record.nodes)
    nodes[rank - 1] = nodes[rank - 1].with_(**changes)
    return record.with_(nodes=tuple(nodes))
