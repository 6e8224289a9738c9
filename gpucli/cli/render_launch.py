"""The presentation layer for a launch's plan (``launch --dry-run`` and the plan a launch shows):
part of render, split from render_runs.py to keep each file readable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpucli.cli.render import hanging, hours, json_out, money, out, si, to_jsonable
from gpucli.plan.internode import describe, link_for
from gpucli.providers.registry import get_target

if TYPE_CHECKING:
    from gpucli.run.inputs.launch import ResolvedLaunch


def launch_plan(r: ResolvedLaunch, *, json_: bool, task: list[str] | None = None,
                across: dict[str, Any] | None = None) -> None:
    """``launch --dry-run``: the machine, price and limits; then the trainer's plan and run.yaml, or, for
    your own code (``task``: its resolved lines), the command and the task. ``across``: a launch over
    several providers, the offers it would try in order (gpucli/run/life/failover.py ``Ranking.to_json``)."""
    if task is not None:
        _own_plan(r, task, json_=json_, across=across)
        return
    data = {
        "run": r.name, "provider": r.provider, "profile": r.profile, "phase": r.phase, "model": r.model.name,
        "params": r.model.num_params(), "vocab_size": r.model.vocab_size, "gpu": r.gpu_name, "n_gpus": r.n_gpus, "fit": r.fit, "micro_batch": r.micro_batch,
        "grad_accum": r.grad_accum, "batch_note": r.batch_note, "steps": r.steps, "seq_len": r.seq_len, "workdir": r.workdir,
        "price_per_hour_usd": r.price_per_hour_usd, "limits": r.limits, "planned": r.planned,
        "command": r.command, "run_yaml": r.trainer_config, "data": r.data, "disk": _disk_dict(r),
        "bandwidth": _transfer_lines(r), "on_end": r.on_end, "on_end_notes": _on_end_lines(r),
    }
    if across is not None:
        data["across"] = across
    volume = _planned_volume(r) if r.volume else None
    if volume is not None:
        data["volume"] = volume
    nodes_line, nodes = _nodes(r)
    if nodes is not None:
        data["nodes"] = nodes
    if json_:
        json_out(data)
        return
    import yaml

    o = out()
    o.print("[bold]Dry run[/]: nothing was rented or started.")
    _across_lines(across)
    hanging(f"run {r.name} on {r.provider}: {r.n_gpus}x {r.gpu_name} ({r.profile}, phase {r.phase}), "
            + (f"your own code ({r.planned.source})" if r.own_code and r.planned.tokens_per_s is None else
               f"your own code, estimated as a model of {si(r.model.num_params())} params" if r.own_code else
               f"model {r.model.name} ({si(r.model.num_params())} params, vocabulary {r.model.vocab_size}), "
               f"{r.steps} steps of {r.n_gpus} x {r.micro_batch} x {r.grad_accum} "
               f"sequences of {r.seq_len} tokens ({r.fit})"))
    if r.batch_note:
        hanging(f"batch: {r.batch_note}", markup=False)
    if nodes_line:
        hanging(f"nodes: {nodes_line}", markup=False)
    if r.price_per_hour_usd:
        hanging(f"price {money(r.price_per_hour_usd)}/h; limits: steps {r.limits.max_steps or '-'}, hours "
                f"{r.limits.max_hours or '-'}, budget {money(r.limits.budget_usd) if r.limits.budget_usd else '-'}, "
                f"stall {r.limits.stall_minutes:g} min")
    if r.planned.hours is not None:
        hanging(f"planned: {si(r.planned.tokens_per_s)} tokens/s, {hours(r.planned.hours)}"
                + (f", {money(r.planned.cost_usd)}" if r.planned.cost_usd is not None else "")
                + f" [dim]({r.planned.source})[/]")
    if volume is not None:
        hanging(_planned_volume_line(volume), markup=False)
    for line in _disk_lines(r) + _on_end_lines(r):
        hanging(line, markup=False)
    o.print(f"\n[bold]On the pod[/], in {r.workdir}/code:\n  {r.command}", markup=True, soft_wrap=True)
    o.print(f"\n[bold]{r.workdir}/run.yaml[/]:")
    o.print(yaml.safe_dump(to_jsonable(dict(r.trainer_config)), sort_keys=False).rstrip(), markup=False)


def _nodes(r: ResolvedLaunch) -> tuple[str | None, dict[str, Any] | None]:
    """A run over several machines: its ``nodes:`` line and JSON object (the link, and whether it is
    measured at launch); (None, None) for one machine."""
    if r.nodes <= 1:
        return None, None
    link = link_for(get_target(r.provider).caps.link(), r.link_gbps)
    return describe(r.nodes, r.n_gpus, r.gpu_name, link, r.price_per_hour_usd), {
        "count": r.nodes, "gpus_per_node": r.n_gpus, "gpus": r.nodes * r.n_gpus, "link_gbps": link.gbps,
        "link_source": link.source, "link_probed": link.probed, "price_per_hour_usd_all_nodes": r.price_per_hour_usd}


def _own_plan(r: ResolvedLaunch, task: list[str], *, json_: bool, across: dict[str, Any] | None = None) -> None:
    nodes_line, nodes = _nodes(r)
    if json_:
        json_out({"run": r.name, "provider": r.provider, "profile": r.profile, "gpu": r.gpu_name,
                  "n_gpus": r.n_gpus, "workdir": r.workdir, "price_per_hour_usd": r.price_per_hour_usd,
                  "limits": r.limits, "planned": r.planned, "disk": _disk_dict(r), "command": r.command,
                  "task": task, **({"nodes": nodes} if nodes is not None else {}),
                  **({"across": across} if across is not None else {})})
        return
    o = out()
    o.print("[bold]Dry run[/]: nothing was rented or started.")
    _across_lines(across)
    hanging(f"run {r.name} on {r.provider}: {r.n_gpus}x {r.gpu_name} ({r.profile}), "
            + (f"your own code ({r.planned.source})" if r.planned.tokens_per_s is None else
               f"your own code, estimated as a model of {si(r.model.num_params())} params"))
    if nodes_line:
        hanging(f"nodes: {nodes_line}", markup=False)
    limits = (f"limits: hours {r.limits.max_hours or '-'}, budget "
              f"{money(r.limits.budget_usd) if r.limits.budget_usd else '-'}, stall {r.limits.stall_minutes:g} min")
    hanging((f"price {money(r.price_per_hour_usd)}/h; " if r.price_per_hour_usd else "") + limits, markup=False)
    if r.planned.hours is not None:
        hanging(f"planned: {si(r.planned.tokens_per_s)} tokens/s, {hours(r.planned.hours)}"
                + (f", {money(r.planned.cost_usd)}" if r.planned.cost_usd is not None else "")
                + f" [dim]({r.planned.source})[/]")
    for line in _disk_lines(r) + _on_end_lines(r):
        hanging(line, markup=False)
    o.print(f"\n[bold]On the host[/], in {r.workdir}/code:\n  {r.command}\n", markup=True, soft_wrap=True)
    for line in task:
        o.print(line, markup=False, highlight=False, soft_wrap=True)


def _across_lines(across: dict[str, Any] | None) -> None:
    """A launch over several providers: the offers it would try, cheapest whole run first (the plan
    below is priced on the first of them)."""
    if across is None:
        return
    offers = across.get("offers") or []
    hanging(f"across {', '.join(across.get('providers') or [])}: {len(offers)} offers, tried in this order until "
            "one passes its health check" if offers else
            f"across {', '.join(across.get('providers') or [])}: no offer now", markup=False)
    for i, c in enumerate(offers[:ACROSS_SHOWN], 1):
        what = f"{c['nodes']} x {c['gpus']}x {c['gpu']}" if c.get("nodes", 1) > 1 else f"{c['gpus']}x {c['gpu']}"
        where = c.get("label") if c.get("nodes", 1) > 1 else f"offer {c['offer']}"
        hanging(f"  {i}. {what} on {c['provider']} ({where}), {money(c['usd_per_hour'])}/h, "
                f"{money(c['run_usd'])} for the run", markup=False)
    if len(offers) > ACROSS_SHOWN:
        hanging(f"  ... and {len(offers) - ACROSS_SHOWN} more (--json lists them all)", markup=False)
    for note in across.get("notes") or []:
        hanging(f"  {note}", markup=False)


ACROSS_SHOWN = 5  # offers listed by a dry run over several providers


def _planned_volume(r: ResolvedLaunch) -> dict[str, Any]:
    from gpucli.providers.runpod.api import volume_usd_per_month

    size = r.volume_size_gb
    return {"name": r.volume, "create_size_gb": size,
            "create_usd_per_month": round(volume_usd_per_month(size), 2) if size else None}


def _planned_volume_line(v: dict[str, Any]) -> str:
    if not v["create_size_gb"]:
        return f"network volume {v['name']} at /workspace (it must exist): run folder, checkpoints, prepared data"
    return (f"network volume {v['name']}: attached if your RunPod account has one of that name, else created "
            f"({v['create_size_gb']} GB in the data centre of the chosen GPU, ${v['create_usd_per_month']:.2f}/month "
            f"at RunPod's published price); kept after the run (it holds the data) until you delete it")


def _disk_dict(r: ResolvedLaunch) -> dict[str, Any] | None:
    d = r.disk
    if d is None:
        return None
    c = d.checkpoints
    return {"weights_gb": c.weights_gb, "weight_copies": c.weight_copies, "optimizer_gb": c.optimizer_gb,
            "per_rank_optimizer_gb": c.per_rank_optimizer_gb,
            "checkpoint_gb": c.checkpoint_gb, "keep_last": d.keep_last, "checkpoints_at_once": c.at_once,
            "checkpoints_gb": c.disk_gb, "data_gb": d.data_gb, "headroom_gb": d.headroom_gb, "need_gb": d.need_gb,
            "have_gb": d.have_gb, "where": d.where, "fits": d.fits, "checkpoints_written": d.written,
            "checkpoints_written_note": d.written_note, "all_kept_gb": d.all_kept_gb}


def _disk_lines(r: ResolvedLaunch) -> list[str]:
    """The dry run's checkpoint and disk lines: what one checkpoint is, how many the keep-policy holds,
    and the disk that needs against the disk there is."""
    d = r.disk
    if d is None:
        return []
    c = d.checkpoints

    def size(gb: float) -> str:
        return f"{gb * 1000:.1f} MB" if gb < 1 else f"{gb:.1f} GB"

    per_rank = (f", {size(c.per_rank_optimizer_gb)} optimizer per rank" if r.n_gpus > 1 else "")
    data = "data size unknown before the launch" if d.data_gb is None else f"{size(d.data_gb)} data"
    if d.have_gb is None:
        verdict = (f"{d.where}: its size is checked at launch" if r.volume else
                   f"{d.where}: free space is not known before the launch; the trainer checks it before each "
                   "checkpoint")
    else:
        verdict = f"{d.where}: {'fits' if d.fits else 'does NOT fit'}"
    return [f"checkpoints: {size(c.checkpoint_gb)} each (weights {size(c.weights_gb)} + optimizer "
            f"{size(c.optimizer_gb)}{per_rank}); keep_last {d.keep_last} + the best + the one being written = "
            f"{c.at_once} at once = {size(c.disk_gb)}",
            f"disk: {size(c.disk_gb)} checkpoints + {data} + {size(d.headroom_gb)} headroom = "
            f"{size(d.need_gb)}; {verdict}" + (f" ({size(d.have_gb)})" if d.have_gb is not None and get_target(r.provider).caps.this_machine else "")
            ] + ([f"checkpoints written: {d.written} ({d.written_note}); keeping them all would need "
                  f"{size(d.all_kept_gb or 0)} (--set training.keep_last={d.written})"] if d.written else []) \
        + _store_lines(r) + _transfer_lines(r)


def _transfer_lines(r: ResolvedLaunch) -> list[str]:
    """The planned bandwidth (gpucli.run.files.transfer): each leg's GB, and its $ where the provider bills bytes
    (vast: at the offer's $/GB, chosen at launch; RunPod: none)."""
    from gpucli.providers.registry import get_target
    from gpucli.run.files.transfer import plan_transfer

    target = get_target(r.provider)
    if not target.cloud:
        return []
    billed = target.caps.bills_transfer is not False
    return plan_transfer(r).lines(None if billed else (0.0, 0.0), billed=billed)


def _store_lines(r: ResolvedLaunch) -> list[str]:
    """The checkpoint store's line: what it uploads, keeps and costs (gpucli.plan.storecost)."""
    from gpucli.run.files.store import quote

    q = quote(r)
    return [f"{q.line()} ({r.store})"] if q is not None else ([f"store: {r.store}"] if r.store else [])


def _on_end_lines(r: ResolvedLaunch) -> list[str]:
    """What ``--on-end stop`` keeps, what it bills and what can still lose it (the provider's own words,
    declared in its capabilities), and how to read the kept pod."""
    caps = get_target(r.provider).caps
    if r.on_end != "stop" or not caps.stop_supported:
        return []
    risk = f"; {caps.kept_storage_risk}" if caps.kept_storage_risk else ""
    return [f"on end: the pod is stopped, not terminated: {caps.kept_storage}{risk}; `gpucli fetch-best` "
            "starts it, reads it and stops it again"]
