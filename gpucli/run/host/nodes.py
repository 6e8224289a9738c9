"""One run over several machines (``gpucli launch --nodes N``): the nodes' layout, their checks,
the variables each gets, starting torchrun on every node with rank 0 first, and ending all of them
as one.

On every node the run folder holds what a one-machine run's does (rank 0's is the run record's
``workdir``; node r's is ``workdir-node<r>``, so nodes that share a disk, as ``--provider local``'s
do, never share a folder). Each node runs, detached in its own session::

    torchrun --nnodes N --node-rank r --nproc-per-node G --rdzv-backend c10d \\
             --rdzv-endpoint $GPUCLI_MASTER_ADDR:$GPUCLI_MASTER_PORT --rdzv-id RUN --max-restarts 0 ...

and a watchdog that also watches the other nodes (gpucli/pod/peers.py): a node lost ends the run on
every node. The user's own command gets ``GPUCLI_NODES``, ``GPUCLI_NODE_RANK``, ``GPUCLI_MASTER_ADDR``,
``GPUCLI_MASTER_PORT``, ``GPUCLI_NODE_IPS`` and ``GPUCLI_GPUS`` (per node), and the names SkyPilot
(``SKYPILOT_NODE_RANK``, ``SKYPILOT_NODE_IPS``, ``SKYPILOT_NUM_NODES``, ``SKYPILOT_NUM_GPUS_PER_NODE``)
and dstack (``DSTACK_MASTER_NODE_IP``, ``DSTACK_NODE_RANK``, ``DSTACK_NODES_NUM``,
``DSTACK_GPUS_PER_NODE``, ``DSTACK_NODES_IPS``) give the same facts, so a script written for either runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
import socket
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.errors import GpucliError, UsageError
from gpucli.plan.estimate import count_params
from gpucli.plan.internode import Link, link_for, node_efficiency
from gpucli.providers.registry import get_target, open_host
from gpucli.run.host import procs
from gpucli.runs.nodespec import NodeSpec, NodesRequest, node_workdir
from gpucli.runs.records import NodeRecord, RunRecord
from gpucli.ssh import parse_target

if TYPE_CHECKING:
    from gpucli.providers.registry import Host

WarnFn = Callable[[str], None]

RDZV_TIMEOUT_S = 6 * 3600  # node 0 may fetch and prepare the data for hours before it joins
# The network interface NCCL (and gloo) must use between the nodes, where the provider fixes it, is
# its target's caps.nccl_ifname (with the provider's docs there).


def check_request(req: NodesRequest) -> None:
    """``--nodes`` and the hosts of a ``LaunchRequest`` against the provider: one line, before anything
    is rented or started."""
    n = req.nodes
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"--nodes must be a whole number of at least 1, got {n}")
    hosts = list(req.hosts) or ([req.host] if req.host else [])
    target = get_target(req.provider)
    if target.caps.endpoint_given:
        parsed = [parse_target(h) for h in hosts]
        seen: dict[tuple[str, int], str] = {}
        for text, t in zip(hosts, parsed, strict=True):
            key = (t.host.lower(), t.port)
            if key in seen:
                raise UsageError(f"--host {text} is the same machine as --host {seen[key]}",
                                 hint="each node of a run is a different machine")
            seen[key] = text
        if n > 1 and len(hosts) != n:
            raise UsageError(f"--nodes {n} needs {n} hosts, got {len(hosts)}",
                             hint="repeat --host (rank 0 first) or give a --hosts-file with one host a line")
    elif len(hosts) > 1:
        raise UsageError(f"several --host go with --provider ssh, not {req.provider}")
    if n == 1:
        if req.probe_link:
            raise UsageError("--probe-link goes with --nodes > 1 (it measures the link between the nodes)")
        return
    most = target.caps.max_nodes
    if most is not None and n > most:
        raise UsageError(f"--nodes {n}: --provider {req.provider} runs at most {most} {target.caps.nodes_are}")
    if target.cloud and req.spot:
        raise UsageError("--spot and --nodes > 1 do not go together: a cluster is rented on demand")
    if req.volume and not target.caps.clusters:  # a RunPod Instant Cluster mounts it on every node
        raise UsageError(f"--volume and --nodes > 1 go together on RunPod only (a cluster's network volume), "
                         f"not {req.provider}")
    if req.probe_link and (not target.caps.endpoint_given or req.link_gbps is not None):
        raise UsageError("--probe-link measures the link between your own machines (--provider ssh) "
                         "when no --link-gbps is given", hint="leave out --probe-link or --link-gbps")


def read_hosts_file(path: str) -> tuple[str, ...]:
    """One ``user@host[:port]`` a line; blank lines and ``#`` comments skipped."""
    try:
        lines = Path(path).expanduser().read_text().splitlines()
    except OSError as exc:
        raise UsageError(f"--hosts-file {path}: {exc.strerror or exc}") from None
    hosts = tuple(s for s in (line.split("#", 1)[0].strip() for line in lines) if s)
    if not hosts:
        raise UsageError(f"--hosts-file {path} names no host")
    return hosts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ports_for(run: str, provider: str) -> tuple[int, int]:
    """(torchrun's rendezvous port, the watchdogs' port) on rank 0: free ones here for ``local``, else
    a pair from the run's name in 29500-31499 (two runs on one machine rarely collide)."""
    if get_target(provider).caps.this_machine:
        return free_port(), free_port()
    base = 29500 + 2 * (int(hashlib.sha256(run.encode()).hexdigest(), 16) % 1000)
    return base, base + 1


def layout(req: NodesRequest, workdir: str) -> list[NodeSpec]:
    """Every node of a ``LaunchRequest``'s run, rank 0 first, with its folder and address."""
    if get_target(req.provider).caps.this_machine:
        return [NodeSpec(r, node_workdir(workdir, r), None, "127.0.0.1") for r in range(req.nodes)]
    hosts = list(req.hosts) or [req.host or ""]
    out = []
    for r, text in enumerate(hosts):
        t = parse_target(text, identity_file=req.identity)
        out.append(NodeSpec(r, node_workdir(workdir, r), t, t.host))
    return out


def trainer_command(py: str, n_nodes: int, n_gpus: int, run: str, *, fetch: str | None) -> str:
    """The bundled trainer's line on every node (the env file gives the rank and rank 0's address);
    ``fetch``: the data step, run on node 0 only (the trainer sends the prepared data to the others)."""
    cmd = (f"{shlex.quote(py)} -m torch.distributed.run --nnodes={n_nodes} --node-rank=$GPUCLI_NODE_RANK "
           f"--nproc-per-node={n_gpus} --rdzv-backend=c10d --rdzv-endpoint=$GPUCLI_MASTER_ADDR:$GPUCLI_MASTER_PORT "
           f"--rdzv-id={shlex.quote(run)} --rdzv-conf=join_timeout={RDZV_TIMEOUT_S},read_timeout={RDZV_TIMEOUT_S} "
           "--max-restarts=0 -m trainer.train --config ../run.yaml --resume auto")
    if fetch:
        return f'{{ [ "$GPUCLI_NODE_RANK" != 0 ] || {{ {fetch}; }}; }} && {cmd}'
    return cmd


def node_env(specs: Sequence[NodeSpec], rank: int, gpus: int, port: int, provider: str,
             nccl_ifname: str | None = None) -> dict[str, str]:
    n, master = len(specs), specs[0].address
    ips = "\n".join(s.address for s in specs)
    env = {"GPUCLI_NODES": str(n), "GPUCLI_NODE_RANK": str(rank), "GPUCLI_MASTER_ADDR": master,
           "GPUCLI_MASTER_PORT": str(port), "GPUCLI_NODE_IPS": ips, "GPUCLI_GPUS": str(gpus),
           "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NODE_IPS": ips, "SKYPILOT_NUM_NODES": str(n),
           "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus), "DSTACK_MASTER_NODE_IP": master, "DSTACK_NODE_RANK": str(rank),
           "DSTACK_NODES_NUM": str(n), "DSTACK_GPUS_PER_NODE": str(gpus), "DSTACK_NODES_IPS": ips}
    caps = get_target(provider).caps
    ifname = nccl_ifname or caps.nccl_ifname
    if ifname:  # what the provider's docs require of NCCL
        env["NCCL_SOCKET_IFNAME"] = ifname
    if nccl_ifname or caps.overlays:  # own machines, an overlay network: gloo takes the same interface
        env["GLOO_SOCKET_IFNAME"] = str(ifname)
    return env


def as_run(record: RunRecord, node: NodeRecord) -> RunRecord:
    """Node ``node`` of a run, seen as a one-machine run (what open_host, status and stop read)."""
    return record.with_(workdir=node.workdir, ssh=node.ssh, instance_id=node.instance_id, pid=node.pid,
                        pid_ident=node.pid_ident, watchdog_pid=node.watchdog_pid, watchdog_ident=node.watchdog_ident,
                        nodes=())


def check_nodes(hosts: Sequence[Host], specs: Sequence[NodeSpec], gpus: int, ifname: str | None) -> None:
    """Each node distinct (its SSH host key), with the profile's GPUs and the NCCL interface: a
    UsageError naming the first node that is not, before anything is started."""
    keys: dict[str, int] = {}
    for host, spec in zip(hosts, specs, strict=True):
        where = str(spec.ssh) if spec.ssh else f"node {spec.rank}"
        if host.host_key:
            if host.host_key in keys:
                raise UsageError(f"{where} is the same machine as node {keys[host.host_key]} (same SSH host key)",
                                 hint="each node of a run is a different machine")
            keys[host.host_key] = spec.rank
        if ifname:
            res = host.run(f"test -e /sys/class/net/{shlex.quote(ifname)}", timeout_s=30, check=False)
            if res.exit_code != 0:
                raise UsageError(f"{where} has no network interface {ifname} for NCCL",
                                 hint="pass --nccl-ifname with the interface the nodes reach each other on")
    if gpus > 0:
        counts = []
        for host in hosts:
            res = host.run("nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true", timeout_s=60, check=False)
            counts.append(int(res.stdout.strip() or 0) if res.stdout.strip().isdigit() else 0)
        if len(set(counts)) > 1 or counts[0] < gpus:
            detail = ", ".join(f"{s.ssh or s.rank}: {c}" for s, c in zip(specs, counts, strict=True))
            raise UsageError(f"the nodes need {gpus} GPUs each and have unequal or fewer GPUs ({detail})")


def members(record: RunRecord) -> list[tuple[int, RunRecord]]:
    """(rank, the node as a one-machine run) for every node, rank 0 first."""
    return [(0, record.with_(nodes=()))] + [(n.rank, as_run(record, n)) for n in record.nodes]


def stop_watchdogs(record: RunRecord, *, on_warn: WarnFn) -> None:
    """SIGTERM the watchdogs of nodes 1..N-1 (each only while its pid is still that watchdog)."""
    for rank, node in members(record)[1:]:
        if not node.watchdog_pid:
            continue
        try:
            with open_host(node, connect_timeout_s=15) as host:
                procs.signal(host, node, node.watchdog_pid, node.watchdog_ident, "TERM")
        except GpucliError as exc:
            on_warn(f"node {rank}: could not reach its watchdog: {exc}")


def planned_across(one: Any, model: Any, nodes: int, provider: str, link_gbps: float | None,
                   tokens_per_node_step: float, price_all_nodes: float | None, *, link: Link | None = None) -> Any:
    """The plan of a run over ``nodes`` machines from one machine's (``PlannedSpeed``): N x its tokens/s
    at the data-parallel efficiency of :mod:`gpucli.plan.internode` over the provider's link (``link``:
    one measured at launch); one machine's figure alone when the link is not known (the source says so)."""
    if not one.tokens_per_s or not one.hours:
        return one
    link = link or link_for(get_target(provider).caps.link(), link_gbps)
    eff = node_efficiency(count_params(model).total, tokens_per_node_step * nodes, one.tokens_per_s, nodes, link)
    tokens = one.tokens_per_s * one.hours * 3600  # the run's tokens: every node's share
    tokens *= nodes
    if eff is None:
        return dataclasses.replace(one, tokens_per_s=None, hours=None, cost_usd=None,
                                   source=f"{one.source}; across {nodes} nodes: link not known ({link.source})")
    tps = one.tokens_per_s * nodes * eff
    hours = tokens / tps / 3600
    return dataclasses.replace(one, tokens_per_s=tps, hours=hours,
                               cost_usd=hours * price_all_nodes if price_all_nodes else None,
                               source=f"{one.source}; x{nodes} nodes at {eff:.0%} over {link.gbps:g} Gbps "
                                      "(gpucli/plan/internode.py)")


def gather_shards(record: RunRecord, keep: int, *, on_step: Callable[[str], None]) -> int:
    """Before a resume on ``keep`` nodes: copy the checkpoint shards of the nodes that will not be in the
    run (rank >= keep) into node 0's checkpoint folders, through this machine (their meta.json stays
    node 0's). Returns the files copied."""
    copied = 0
    with tempfile.TemporaryDirectory(prefix="gpucli-shards-") as tmp:
        for rank, node in members(record)[keep:]:
            root = f"{node.workdir}/checkpoints"
            with open_host(node, connect_timeout_s=15) as host:
                names = [n for n in host.list_files(root)
                         if not n.startswith(".") and "/." not in n and not n.endswith("meta.json")]
                on_step(f"node {rank}: bringing {len(names)} checkpoint files to node 0")
                host.download_files([(f"{root}/{n}", f"{tmp}/{n}", None) for n in names])
                copied += len(names)
        if copied:
            with open_host(record.with_(nodes=()), connect_timeout_s=15) as host0:
                host0.sync_up(tmp, f"{record.workdir}/checkpoints", excludes=["meta.json"])
    return copied
