"""Several machines in one run: the link between them, per provider with its source, and what it costs
data parallelism (pure: no I/O).

The model, and its assumptions:
- every optimizer step moves the gradients once through a ring all-reduce (DDP), or the same bytes as a
  reduce-scatter of gradients plus an all-gather of weights (FSDP): 2 x (N-1)/N x the gradient bytes
  through each node's link, bf16 gradients (2 bytes a parameter), and for FSDP twice that;
- inside a node the GPUs' own interconnect is already in the single-node efficiency
  (:func:`gpucli.plan.estimate.scaling_efficiency`); across nodes the slowest link sets the pace;
- none of that communication overlaps with compute (a pessimistic bound: DDP's bucketed all-reduce and
  FSDP's prefetch hide part of it on real runs), and the link delivers 70 % of its line rate.
So efficiency across nodes = step compute time / (step compute time + communication time).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpucli.plan.estimate import count_params
from gpucli.plan.pareto import pareto_front
from gpucli.plan.planner import Estimate, Setup, _picks

LINK_EFFICIENCY = 0.7  # the share of a link's line rate a collective gets (stated assumption)


@dataclass(frozen=True)
class Link:
    gbps: float | None  # Gbit/s between two nodes; None: not known
    source: str
    probed: bool = False  # not known yet: measured when the run starts (your own machines)


def link_for(declared: Link, link_gbps: float | None = None) -> Link:
    """The inter-node link of a multi-node setup: ``--link-gbps`` when given, else the one the provider
    declares (its run target's ``caps.link()``: a published figure, none, or measured at launch)."""
    if link_gbps is not None:
        return Link(float(link_gbps), "--link-gbps")
    return declared


def comm_seconds(params: float, nodes: int, link: Link, *, sharded: bool = False) -> float | None:
    """Seconds of inter-node traffic per optimizer step; None when the link is unknown."""
    if nodes <= 1:
        return 0.0
    if not link.gbps:
        return None
    grad_bytes = 2.0 * params * (2 if sharded else 1)
    moved = 2.0 * (nodes - 1) / nodes * grad_bytes
    return moved * 8 / (link.gbps * 1e9 * LINK_EFFICIENCY)


def node_efficiency(params: float, tokens_per_step: float, tokens_per_s_one_node: float, nodes: int, link: Link,
                    *, sharded: bool = False) -> float | None:
    """Data-parallel efficiency across ``nodes`` (1.0 for one); None when the link is unknown.
    ``tokens_per_s_one_node``: what one node does alone; each node computes its share of the step."""
    comm = comm_seconds(params, nodes, link, sharded=sharded)
    if comm is None:
        return None
    if comm == 0.0:
        return 1.0
    compute = tokens_per_step / nodes / tokens_per_s_one_node
    return compute / (compute + comm)


def describe(nodes: int, gpus_per_node: int, gpu: str, link: Link, price_per_hour_usd: float | None) -> str:
    """``2 nodes x 8 H100 = 16 GPUs; link 1600 Gbps (source); $X/h for all nodes``."""
    speed = f"{link.gbps:g} Gbps" if link.gbps else "to be measured" if link.probed else "unknown"
    unit = "processes" if gpu == "CPU" else "GPUs"
    price = f"; ${price_per_hour_usd:,.2f}/h for all nodes" if price_per_hour_usd else ""
    return (f"{nodes} nodes x {gpus_per_node} {gpu} = {nodes * gpus_per_node} {unit}; inter-node link {speed} "
            f"({link.source}){price}")


# -- multi-node setups on the plan's front ---------------------------------------------------------

CATALOG_LINK = Link(1600.0, "RunPod Instant Clusters' node-to-node link, 1600 Gbps at least (runpod docs, "
                            "instant-clusters): the catalogue's multi-node offer")


def with_nodes(catalog, request, plan, max_nodes: int, link: Link = CATALOG_LINK,  # noqa: ANN001, ANN201
               unplanned: tuple[Link, ...] = ()):
    """``plan`` with N-node setups (2, 4, ... up to ``max_nodes``) of every runnable largest-count setup,
    each priced as N machines and sped up by N x :func:`node_efficiency`, on the front with the rest.
    ``unplanned``: the links of clusters whose speed is not known (named in the notes, not planned)."""
    if max_nodes <= 1 or request.workload != "train":
        return plan
    params = count_params(request.model).total
    top = max((e.setup.n_gpus for e in plan.estimates if e.runs), default=0)
    added = []
    for e in plan.estimates:
        if not e.runs or e.setup.n_gpus != top or e.setup.price.offer_id is not None:
            continue
        n = 2
        while n <= max_nodes:
            # one optimizer step of the single machine's batch: micro-batch x sequence x its GPUs
            step_tokens = float((e.micro_batch or 1) * plan.seq_len * e.setup.n_gpus * n)
            eff = node_efficiency(params, step_tokens, e.tokens_per_s, n, link) or 0.0
            tps = e.tokens_per_s * n * eff
            setup = NodeSetup(gpu=e.setup.gpu, n_gpus=e.setup.n_gpus * n, price=e.setup.price, nodes=n, link=link)
            hours = plan.tokens / tps / 3600.0
            added.append(Estimate(setup=setup, fit=e.fit, memory_gb=e.memory_gb, micro_batch=e.micro_batch,
                                  tokens_per_s=tps, mfu=e.mfu, hours=hours, cost_usd=hours * setup.usd_per_hour,
                                  speed_source=f"{e.speed_source}; x{n} nodes at {eff:.0%} data-parallel efficiency "
                                               f"over {link.gbps:g} Gbps (gpucli/plan/internode.py)"))
            n *= 2
    if not added:
        return plan
    runnable = [e for e in plan.estimates if e.runs] + added
    front = pareto_front(runnable, lambda e: (e.hours, e.cost_usd))
    return dataclasses.replace(plan, estimates=plan.estimates + tuple(added), front=front.members,
                               dominated=front.dominated, picks=_picks(runnable, front.members, request),
                               notes=plan.notes + (f"multi-node setups: {link.source}; {__doc__.split('So ')[0].strip()}",
                                                   *(f"{u.source}: its setups are not planned" for u in unplanned)))


@dataclass(frozen=True)
class NodeSetup(Setup):
    """``nodes`` machines of ``n_gpus / nodes`` GPUs each (``n_gpus``: all of them)."""

    nodes: int = 2
    link: Link | None = None

    @property
    def label(self) -> str:
        return f"{self.nodes} nodes x {self.n_gpus // self.nodes}x {self.gpu.name}"
