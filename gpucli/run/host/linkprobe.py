"""The link between your own machines (``--provider ssh --nodes N`` without ``--link-gbps``), measured
when the run starts: for each node r in turn, rank 0 listens on a free port (or
``GPUCLI_LINK_PROBE_PORT``) and node r sends it :data:`PROBE_BYTES` over rank 0's rendezvous address,
the path NCCL and gloo take (never through this machine); rank 0 times the bytes as they arrive. The
script on both ends is gpucli/pod/linkprobe.py (python3's standard library; no iperf), uploaded over
the nodes' SSH connections; every wait is bounded. The slowest pair is the run's link: the plan's
data-parallel efficiency (gpucli/plan/internode.py) and the run record's ``link``."""

from __future__ import annotations

import json
import secrets
import shlex
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gpucli.errors import GpucliError
from gpucli.plan.internode import Link
from gpucli.run.host.nodes import planned_across
from gpucli.runs import podfiles
from gpucli.runs.records import LinkPair, LinkProbe, RunRecord
from gpucli.settings import link_probe_port

if TYPE_CHECKING:
    from gpucli.providers.registry import Host
    from gpucli.runs.nodespec import NodeSpec, NodesPrepared

PROBE_BYTES = 64 * 1024 * 1024  # per pair: ~0.5 s at 1 Gbps; a slower link is timed on what arrives by the deadline
PROBE_DEADLINE_S = 20.0  # per pair, on both ends
MIN_BYTES = 1024 * 1024  # fewer than this by the deadline measures nothing
SCRIPT = podfiles.LINK_PROBE.file("linkprobe.py").path


class LinkProbeError(GpucliError):
    """The link between the nodes could not be measured (one line: which pair, and why)."""


def probe_link(hosts: Sequence[Host], specs: Sequence[NodeSpec], *, python: str,
               on_step: Callable[[str], None], nbytes: int = PROBE_BYTES,
               deadline_s: float = PROBE_DEADLINE_S) -> LinkProbe:
    """Measure each node's link to rank 0, one pair at a time (so no two share rank 0's link)."""
    for host, spec in zip(hosts, specs, strict=True):
        host.run(f"mkdir -p -- {shlex.quote(spec.workdir)}", timeout_s=60)
        podfiles.LINK_PROBE.write(host, spec.workdir)
    pairs = []
    for host, spec in list(zip(hosts, specs, strict=True))[1:]:
        on_step(f"node {spec.rank}: measuring its link to rank 0 ({nbytes // (1024 * 1024)} MB)")
        pairs.append(_one_pair(hosts[0], specs[0], host, spec, python=python, nbytes=nbytes, deadline_s=deadline_s))
    slowest = min(pairs, key=lambda p: p.gbps)
    return LinkProbe(gbps=slowest.gbps, pairs=tuple(pairs),
                     source=f"measured at launch: {nbytes // (1024 * 1024)} MB from each node to rank 0 over "
                            f"{specs[0].address}, slowest pair node {slowest.rank}")


def _one_pair(host0: Host, spec0: NodeSpec, host: Host, spec: NodeSpec, *, python: str, nbytes: int,
              deadline_s: float) -> LinkPair:
    where = f"node {spec.rank} -> rank 0 ({spec0.address})"
    tag = secrets.token_hex(8)  # which connection is the probe's (not a secret: a stray one is not heard)
    state = f"{spec0.workdir}/linkprobe-{spec.rank}.json"
    q = shlex.quote
    sink = (f"{q(python)} linkprobe.py sink --port {link_probe_port()} --deadline-s {deadline_s + 10:g} "
            f"--tag {tag} --state {q(state)}")
    host0.run(f"cd {q(spec0.workdir)} && rm -f {q(state)} && "
              f"(setsid nohup {sink} >/dev/null 2>&1 </dev/null &)", timeout_s=30)
    try:
        port = _wait_state(host0, state, "port", 20.0, where)
        res = host.run(f"cd {q(spec.workdir)} && {q(python)} linkprobe.py send --to {q(_join(spec0.address, port))} "
                       f"--bytes {nbytes} --deadline-s {deadline_s:g} --tag {tag}",
                       timeout_s=deadline_s + 30, check=False)
        if res.exit_code != 0:
            # what rank 0 saw says more when it failed first (it could not listen, nothing arrived)
            seen = _read_state(host0, state)
            why = seen.get("error") or (res.stderr or res.stdout).strip().splitlines()[-1:] or [f"exit {res.exit_code}"]
            raise LinkProbeError(f"{where}: {why if isinstance(why, str) else why[0]}")
        _wait_state(host0, state, "bytes", 15.0, where)
        got = _read_state(host0, state)
    finally:
        host0.run(f"rm -f {q(state)} {q(state)}.tmp", timeout_s=30, check=False)
    nbytes_in, seconds = int(got.get("bytes", 0)), float(got.get("seconds", 0.0))
    if nbytes_in < MIN_BYTES or seconds <= 0:
        raise LinkProbeError(f"{where}: only {nbytes_in} bytes arrived in {deadline_s:g} s")
    return LinkPair(rank=spec.rank, gbps=round(nbytes_in * 8 / seconds / 1e9, 3), bytes=nbytes_in,
                    seconds=round(seconds, 4))


def _join(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _read_state(host: Host, path: str) -> dict:
    try:
        data = json.loads(host.read_file(path).decode())
    except (GpucliError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _wait_state(host: Host, path: str, key: str, timeout_s: float, where: str) -> int:
    """Poll rank 0's state file until it has ``key`` (the sink's port, then its bytes); an ``error`` there
    or ``timeout_s`` without it is a :class:`LinkProbeError`."""
    end = time.monotonic() + timeout_s
    while True:
        data = _read_state(host, path)
        if data.get("error"):
            raise LinkProbeError(f"{where}: rank 0 {data['error']}")
        if key in data:
            return int(data[key])
        if time.monotonic() > end:
            raise LinkProbeError(f"{where}: rank 0's listener said nothing within {timeout_s:g} s")
        time.sleep(0.3)


def measure_for_launch(record: RunRecord, hosts: Sequence[Host], specs: Sequence[NodeSpec], prepared: NodesPrepared, *,
                       on_step: Callable[[str], None], on_warn: Callable[[str], None],
                       on_info: Callable[[str], None]) -> RunRecord:
    """A launch on your own machines without ``--link-gbps``: the link measured, shown, and its slowest
    pair planned with (the record's ``link`` and ``planned``). A probe that fails is one warning and the
    launch goes on with the link unknown; with ``--probe-link`` it is the launch's error instead."""
    resolved, req = prepared.resolved, prepared.request
    try:
        probe = probe_link(hosts, specs, python=resolved.python, on_step=on_step)
    except LinkProbeError as exc:
        if req.probe_link:
            raise
        on_warn(f"the link between the nodes could not be measured ({exc}); going on with it unknown: "
                "no data-parallel efficiency in the plan (--link-gbps gives it)")
        return record
    planned = record.planned
    if resolved.planned_one is not None:
        planned = planned_across(resolved.planned_one, resolved.model, len(specs), resolved.provider, None,
                                 float(resolved.micro_batch * resolved.grad_accum * max(1, resolved.n_gpus)
                                       * resolved.seq_len), resolved.price_per_hour_usd,
                                 link=Link(probe.gbps, probe.source))
    pairs = ", ".join(f"node {p.rank} -> rank 0 {p.gbps:g} Gbps" for p in probe.pairs)
    eff = f"; plan: {(planned.source or '').rpartition('; ')[2]}" if planned.tokens_per_s and planned is not record.planned else ""
    on_info(f"link measured ({PROBE_BYTES >> 20} MB a pair): {pairs}; the slowest, "
            f"{probe.gbps:g} Gbps, sets the data-parallel pace{eff}")
    return record.with_(link=probe, planned=planned)
