"""The presentation of the catalogue and plans: tables, JSON, the terminal chart, the PNG plot (offers:
render_offers.py).

Part of the presentation layer (with render.py, whose consoles and number formats it uses).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucli.cli.render import Notes, hours, info, json_out, money, out, si, table

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog
    from gpucli.plan.planner import Estimate, Plan
    from gpucli.plan.storecost import StoreQuote


def gpus_table(catalog: Catalog, today: dt.date) -> None:
    from gpucli.plan.planner import _quote, choose_price

    stale_days = catalog.defaults.stale_after_days
    t = table("GPUs (dense BF16; the price per GPU-hour that plan uses: newest, then cheapest)")
    num = {"justify": "right", "no_wrap": True}
    for col, kw in (("id", {"no_wrap": True}), ("GPU", {}), ("VRAM", num), ("TFLOP/s", num), ("GB/s", num),
                    ("link", {}), ("on-demand", num), ("spot", num), ("price from", {"no_wrap": True})):
        t.add_column(col, **kw)
    notes = Notes()
    for gpu in catalog.gpus.values():
        # The same choice the planner makes for one GPU: newest dated price, then cheapest.
        prices = catalog.prices_for(gpu.id)
        od = choose_price(prices, 1, "on-demand")
        spot = choose_price(prices, 1, "spot")
        src = od or spot
        if src is not None:
            q = _quote(src, today, stale_days)
            where = f"{notes.ref(src.source)} {q.age_text}" + ("[yellow]*[/]" if q.stale else "")
        else:
            where = "[dim]no price[/]"
        t.add_row(gpu.id, gpu.name, f"{gpu.vram_gb:g} GB", f"{gpu.bf16_dense_tflops:g}",
                  f"{gpu.memory_bandwidth_gbps:g}", gpu.interconnect,
                  money(od.usd_per_gpu_hour) if od else "-", money(spot.usd_per_gpu_hour) if spot else "-", where)
    out().print(t)
    notes.print()
    out().print(f"[dim]{len(catalog.prices)} prices in {catalog.directory / 'prices.yaml'}; * stale: older than "
                f"{stale_days} days. Specs: datasheets, named per GPU in gpus.yaml (gpucli gpus --json).[/]")


def profiles_tables(catalog: Catalog) -> None:
    t = table("Single-GPU profiles")
    for col in ("profile", "GPU", "batch", "grad accum", "bf16", "compile", "notes"):
        t.add_column(col)
    for p in catalog.single_profiles.values():
        gpu = catalog.gpus[p.gpu].name if p.gpu else "CPU"
        t.add_row(p.name, gpu, str(p.batch_size), str(p.grad_accum), "yes" if p.bf16 else "no",
                  "yes" if p.compile else "no", p.description)
    out().print(t)
    c = table("Cluster profiles: per-GPU micro-batch x grad accum = sequences per step, per phase")
    phases = [ph for ph in catalog.phases if any(ph in cp.phases for cp in catalog.cluster_profiles.values())]
    for col in ["profile", "GPUs"] + [f"{ph}" for ph in phases] + ["notes"]:
        c.add_column(col)
    for cp in catalog.cluster_profiles.values():
        cells = []
        for ph in phases:
            b = cp.phases.get(ph)
            if b is None:
                cells.append("-")
                continue
            rate = f", {b.sec_per_step[0]:g}-{b.sec_per_step[1]:g} s/step" if b.sec_per_step else ""
            cells.append(f"{b.micro_batch} x {b.grad_accum} = {b.micro_batch * b.grad_accum * cp.count}{rate}")
        c.add_row(cp.name, f"{cp.count}x {catalog.gpus[cp.gpu].name}", *cells, cp.description)
    out().print(c)
    out().print("[dim]A phase without a column takes the fast phase's batch x its batch scale.[/]")
    pt = table("Phases")
    for col in ("phase", "iterations", "matrix LR", "embedding LR", "batch scale", "description"):
        pt.add_column(col)
    for phase in catalog.phases.values():
        st = phase.stages
        desc = phase.description + (
            f" (stage 1: {st.stage1_steps:,} steps, chunk {st.stage1_chunk_size}; stage 2: {st.stage2_steps:,}, "
            f"chunk {st.stage2_chunk_size})" if st else "")
        pt.add_row(phase.name, str(phase.iterations), f"{phase.matrix_lr:g}", f"{phase.embedding_lr:g}",
                   f"{phase.batch_scale:g}", desc)
    out().print(pt)


def models_table(catalog: Catalog) -> None:
    from gpucli.plan.estimate import count_params, train_flops_per_token

    notes = Notes()
    num = {"justify": "right", "no_wrap": True}
    columns: list[tuple[str, dict[str, Any], Any, int]] = [
        ("model", {"no_wrap": True}, lambda m, p: m.name, 0),
        ("params", num, lambda m, p: si(p.total), 0),
        ("layers", num, lambda m, p: str(m.n_layers), 0),
        ("width", num, lambda m, p: str(m.d_model), 0),
        ("heads", num, lambda m, p: str(m.n_heads), 3),
        ("MLP", num, lambda m, p: str(m.d_ff), 4),
        ("vocab", num, lambda m, p: str(m.vocab_size), 0),
        ("context", num, lambda m, p: str(m.max_seq_len), 2),
        ("GFLOP/token", num, lambda m, p: f"{train_flops_per_token(m) / 1e9:.2f}", 1),
        ("about", {"no_wrap": True}, lambda m, p: notes.ref(m.source) if m.source else "-", 0),
    ]
    t = _fitting_table("Model presets (parameters computed from the shape)", columns,
                       [(m, count_params(m)) for m in catalog.models.values()], notes)
    out().print(t)
    notes.print()
    out().print("[dim]width: d_model; MLP: its hidden size; context: tokens a sequence (T). "
                "GFLOP/token = 6N + 12*L*d*T for training (N: layers + LM head). "
                "Any nanochat depth works too: --model d32.[/]")


# --------------------------------------------------------------------------------------------------
# Plans


# What the memory line of --explain ends with, per Fit value.
_FIT_WORDS = {"fits": "fits", "sharded": "fits only sharded (FSDP)", "no": "does not fit"}


def _fit_text(e: Estimate) -> str:
    from gpucli.plan.estimate import Fit

    return {Fit.FITS: "yes", Fit.SHARDED: "[yellow]sharded[/]", Fit.NO: "[red]no[/]"}[e.fit]


def _price_text(e: Estimate, notes: Notes) -> str:
    """A footnote to where the price came from, and its age ("[2] 11 mo stale")."""
    q = e.setup.price
    if q.offer_id is not None or q.source == "--price":  # a live offer or the user's own price: no age
        return notes.ref(q.source)
    return f"{notes.ref(q.source)} {q.age_text}" + ("[yellow]*[/]" if q.stale else "")


def _fitting_table(title: str, columns: list[tuple[str, dict[str, Any], Any, int]], rows: list[Any],
                   notes: Notes) -> Any:
    """A table of ``rows`` that fits the terminal whole: on a narrow one (80 columns) the columns with
    the highest drop rank go first, so no cell is ever cut (`8x B2…`, `$95…`). ``notes`` is refilled
    for the columns kept, so a footnote is never listed for a column not shown."""
    from rich.measure import Measurement

    o = out()
    shown = list(columns)
    while True:
        notes.clear()
        t = table(title)
        for name, kw, _, _ in shown:
            t.add_column(name, **kw)
        for i, e in rows:
            t.add_row(*(cell(i, e) for _, _, cell, _ in shown))
        droppable = [c for c in shown if c[3] > 0]
        if Measurement.get(o, o.options.update_width(10_000), t).maximum <= o.width or not droppable:
            return t
        shown.remove(max(droppable, key=lambda c: c[3]))


def plan_tables(plan: Plan, *, show_all: bool = False) -> None:
    from rich.markup import escape

    req = plan.request
    o = out()
    kind = "spot" if req.spot else "on-demand"
    if any(e.setup.price.offer_id for e in plan.estimates):
        kind = f"live {kind} offer"
    if req.workload == "generate":
        names = ", ".join(m.name for m in req.models)
        o.print(f"[bold]{names}[/]: {si(plan.params)} params{' each' if len(req.models) > 1 else ''}, generate, "
                f"{plan.tokens_note}; serving engine per GPU (batch = sequences decoded together); {kind} prices")
    else:
        o.print(f"[bold]{req.model.name}[/]: {si(plan.params)} params, {req.workload}, {plan.tokens_note}; "
                f"T {plan.seq_len}; {plan.flops_per_token / 1e9:.2f} GFLOP/token; {kind} prices")
    notes = Notes()  # speed and price sources, numbered in one list below the table
    num = {"justify": "right", "no_wrap": True}
    text = {"no_wrap": True}
    # (column, style, cell per front member, dropped on a narrow terminal: lowest first; 0 = always)
    columns: list[tuple[str, dict[str, Any], Any, int]] = [
        ("#", num, lambda i, e: str(i), 3),
        ("setup", text, lambda i, e: e.setup.label, 0),
        ("hours", num, lambda i, e: hours(e.hours), 0),
        ("cost", num, lambda i, e: money(e.cost_usd), 0),
        ("$/h", num, lambda i, e: money(e.setup.usd_per_hour), 0),
        ("fits?", text, lambda i, e: _fit_text(e), 0),
        ("GB/GPU", num, lambda i, e: f"{e.memory_gb:.0f}", 5),
        ("batch", num, lambda i, e: str(e.micro_batch) if e.micro_batch else "-", 6),
        ("tok/s", num, lambda i, e: si(e.tokens_per_s), 0),
        ("speed", text, lambda i, e: escape(f"MFU {e.mfu:.0%} {notes.ref(e.speed_source)}" if e.mfu is not None
                                            else f"decode {notes.ref(e.speed_source)}"), 2),
        ("price", text, lambda i, e: _price_text(e, notes), 4),
    ]
    title = f"Pareto front: cost against time ({len(plan.front)} of {len(plan.estimates)} setups)"
    t = _fitting_table(title, columns, list(enumerate(plan.front, 1)), notes)
    o.print(t)
    notes.print()

    picks = plan.picks
    rows: list[tuple[str, Estimate | None]] = [("cheapest", picks.cheapest), ("fastest", picks.fastest),
            ("best value", picks.best_value)]
    if req.budget_usd is not None:
        rows.append((f"best within {money(req.budget_usd)}", picks.within_budget))
    if req.deadline_hours is not None:
        rows.append((f"best within {hours(req.deadline_hours)}", picks.within_deadline))
    if req.budget_usd is not None and req.deadline_hours is not None:
        rows.append(("best within both", picks.within_both))
    p = table("Picks")
    for col in ("pick", "setup", "hours", "cost"):
        p.add_column(col)
    for name, chosen in rows:
        if chosen is None:
            p.add_row(name, "[red]none meets it[/]", "-", "-")
        else:
            p.add_row(name, chosen.setup.label, hours(chosen.hours), money(chosen.cost_usd))
    o.print(p)
    o.print("[dim]best value: the front member with the lowest cost/cheapest + hours/fastest.[/]")

    if plan.budget_views:
        b = table(f"What {money(req.budget_usd)} buys on the front")
        for col in ("setup", "hours of renting", "tokens trained", "whole run?"):
            b.add_column(col)
        front_ids = {id(e) for e in plan.front}
        for v in plan.budget_views:
            if id(v.estimate) in front_ids or show_all:
                b.add_row(v.estimate.setup.label, hours(v.hours), si(v.tokens),
                          "yes" if v.finishes else f"{v.tokens / plan.tokens:.0%} of it")
        o.print(b)

    if plan.dominated:
        limit = None if show_all else 12
        d = table(f"Dominated setups ({len(plan.dominated)}; cheapest first"
                   + ("" if show_all or len(plan.dominated) <= 12 else ", --all for every one") + ")")
        for col in ("setup", "hours", "cost", "fits?", "dominated by"):
            d.add_column(col)
        for e, by in sorted(plan.dominated, key=lambda x: x[0].cost_usd)[:limit]:
            d.add_row(e.setup.label, hours(e.hours), money(e.cost_usd), _fit_text(e),
                      f"{by.setup.label} ({hours(by.hours)}, {money(by.cost_usd)})")
        o.print(d)
    if plan.unfit:
        names = ", ".join(f"{e.setup.label} (needs {e.memory_gb:.0f} GB)" for e in plan.unfit[:8])
        more = f" and {len(plan.unfit) - 8} more" if len(plan.unfit) > 8 else ""
        o.print(f"[red]Does not fit[/] even at {'batch' if req.workload == 'generate' else 'micro-batch'} 1: "
                f"{names}{more}")
    if plan.disk is not None:
        d = plan.disk
        o.print(f"Checkpoints: {d.checkpoint_gb:.1f} GB each ({d.weights_gb:.1f} GB weights + {d.optimizer_gb:.1f} GB "
                f"AdamW state); {d.at_once - 2} kept + the best + the one being written = {d.disk_gb:.0f} GB "
                "of disk (launch --disk)")
    for note in plan.notes:
        o.print(f"[dim]{note}[/]")


def plan_json(plan: Plan) -> dict[str, Any]:
    def est(e: Estimate) -> dict[str, Any]:
        q = e.setup.price
        return {
            "setup": e.setup.label, "gpu": e.setup.gpu.id, "gpu_name": e.setup.gpu.name, "n_gpus": e.setup.n_gpus,
            "hours": e.hours, "cost_usd": e.cost_usd, "usd_per_hour": e.setup.usd_per_hour,
            "fits": e.fit.value, "memory_gb_per_gpu": e.memory_gb, "micro_batch": e.micro_batch,
            "tokens_per_s": e.tokens_per_s, "mfu": e.mfu, "speed_source": e.speed_source,
            "price": {"usd_per_gpu_hour": q.usd_per_gpu_hour, "kind": q.kind, "source": q.source,
                      "as_of": q.as_of_text, "age_days": q.age_days, "stale": q.stale, "offer_id": q.offer_id,
                      "provider": q.provider},
        }

    def pick(e: Estimate | None) -> str | None:
        return None if e is None else e.setup.label

    req = plan.request
    return {
        "model": req.model.name, "models": [m.name for m in req.models], "order": req.order,
        "workload": req.workload, "params": plan.params, "tokens": plan.tokens,
        "tokens_note": plan.tokens_note, "seq_len": plan.seq_len, "flops_per_token": plan.flops_per_token,
        "spot": req.spot, "budget_usd": req.budget_usd, "deadline_hours": req.deadline_hours,
        "front": [est(e) for e in plan.front],
        "dominated": [dict(est(e), dominated_by=by.setup.label) for e, by in plan.dominated],
        "does_not_fit": [est(e) for e in plan.unfit],
        "picks": {"cheapest": pick(plan.picks.cheapest), "fastest": pick(plan.picks.fastest),
                  "best_value": pick(plan.picks.best_value), "within_budget": pick(plan.picks.within_budget),
                  "within_deadline": pick(plan.picks.within_deadline), "within_both": pick(plan.picks.within_both)},
        "budget": [{"setup": v.estimate.setup.label, "hours": v.hours, "tokens": v.tokens, "finishes": v.finishes}
                   for v in plan.budget_views],
        "notes": list(plan.notes),
        "checkpoint_disk": None if plan.disk is None else {
            "weights_gb": plan.disk.weights_gb, "optimizer_gb": plan.disk.optimizer_gb,
            "checkpoint_gb": plan.disk.checkpoint_gb, "checkpoints_at_once": plan.disk.at_once,
            "disk_gb": plan.disk.disk_gb},
    }


def _axis(values: Sequence[float], size: int) -> tuple[Any, float, float, bool]:
    lo, hi = min(values), max(values)
    log = lo > 0 and hi / lo > 20
    if log:
        lo_t, hi_t = math.log10(lo), math.log10(hi)
    else:
        lo_t, hi_t = lo, hi
    span = (hi_t - lo_t) or 1.0

    def pos(v: float) -> int:
        t = math.log10(v) if log else v
        return min(size - 1, max(0, round((t - lo_t) / span * (size - 1))))

    return pos, lo, hi, log


def plan_chart(plan: Plan, width: int = 64, height: int = 16) -> None:
    """Cost (up) against time (right), in the shape of the Pareto cost analysis's chart; front members are numbered."""
    points = [e for e in plan.estimates if e.runs]
    if not points:
        return
    xpos, xlo, xhi, xlog = _axis([e.hours for e in points], width)
    ypos, ylo, yhi, ylog = _axis([max(e.cost_usd, 1e-9) for e in points], height)
    grid = [[" "] * width for _ in range(height)]
    for e in points:
        grid[height - 1 - ypos(max(e.cost_usd, 1e-9))][xpos(e.hours)] = "."
    for i, e in enumerate(plan.front, 1):
        row, col = height - 1 - ypos(max(e.cost_usd, 1e-9)), xpos(e.hours)
        label = str(i)
        for k, ch in enumerate(label):
            if col + k < width:
                grid[row][col + k] = ch
    o = out()
    o.print(f"[bold]Cost against time[/] (numbers: the front; dots: other setups"
            f"{'; log scales' if xlog or ylog else ''})")
    ylab_hi, ylab_lo = money(yhi), money(ylo)
    pad = max(len(ylab_hi), len(ylab_lo))
    for r, line in enumerate(grid):
        lab = ylab_hi if r == 0 else ylab_lo if r == height - 1 else ""
        o.print(f"{lab:>{pad}} |" + "".join(line), highlight=False, markup=False)
    o.print(" " * pad + " +" + "-" * width, markup=False)
    left, right = hours(xlo), hours(xhi)
    o.print(" " * (pad + 2) + left + " " * max(1, width - len(left) - len(right)) + right, markup=False)


def plot_png(plan: Plan, path: Path) -> None:
    """A PNG of the same chart (matplotlib, the `plot` extra)."""
    from gpucli.errors import UsageError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UsageError("--plot needs matplotlib", hint="pip install 'gpucli[plot]'") from exc
    points = [e for e in plan.estimates if e.runs]
    front_ids = {id(e) for e in plan.front}
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    others = [e for e in points if id(e) not in front_ids]
    ax.scatter([e.hours for e in others], [e.cost_usd for e in others], s=14, c="#9aa0a6", label="dominated")
    ax.plot([e.hours for e in plan.front], [e.cost_usd for e in plan.front], "-o", c="#d93025", ms=5,
            label="Pareto front")
    for e in plan.front:
        ax.annotate(e.setup.label, (e.hours, e.cost_usd), textcoords="offset points", xytext=(5, 4), fontsize=8)
    hs = [e.hours for e in points]
    cs = [e.cost_usd for e in points if e.cost_usd > 0]
    if hs and max(hs) / max(min(hs), 1e-9) > 20:
        ax.set_xscale("log")
    if cs and max(cs) / max(min(cs), 1e-9) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("hours")
    ax.set_ylabel("cost (USD)")
    ax.set_title(f"{plan.request.model.name}: {plan.tokens_note}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the format is the suffix plan_cmd checked; saving through an open file keeps matplotlib from
        # appending one of its own (`--plot /tmp/x` would write /tmp/x.png and report /tmp/x)
        with open(path, "wb") as fh:
            fig.savefig(fh, format=path.suffix[1:].lower())
    except OSError as exc:
        raise UsageError(f"--plot: cannot write {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)


def wrote(path: Path) -> None:
    """The last line of a plan that wrote a file, so it does not scroll away above the tables."""
    info(f"wrote {path}")


# --------------------------------------------------------------------------------------------------
# Live offers and keys


def explanation(x: Any, *, json_: bool) -> None:
    """`gpucli plan --explain SETUP`: params -> FLOPs/token -> MFU source -> tokens/s -> hours -> dollars."""
    if json_:
        json_out(x)
        return
    from rich.markup import escape

    o = out()
    mem = x.memory
    o.print(f"[bold]{x.setup}[/]" + (" (on the Pareto front)" if x.on_front else
                                       f" (dominated by {x.dominated_by})" if x.dominated_by else ""))
    steps = [
        ("parameters", f"{si(x.params)} ({si(x.flop_params)} doing matmuls: layers + LM head)"),
        ("FLOPs/token", f"6 x {si(x.flop_params)} + 12 x {x.n_layers} x {x.d_model} x {x.seq_len} "
                        f"= {x.flops_per_token / 1e9:.3f} GFLOP"),
        ("speed from", escape(x.speed_source)),
    ]
    if x.mfu is not None:
        sf = x.speed_flops_per_token or x.flops_per_token
        if sf > x.flops_per_token * 1.0001:
            steps.append(("fp32 memory", f"the memory's fp32 work runs on TF32 at half the BF16 peak: counted twice, "
                                         f"{sf / 1e9:.3f} GFLOP/token at the BF16 rate"))
        steps.append(("tokens/s", f"{x.n_gpus} GPUs x {x.peak_tflops:g} TFLOP/s x MFU {x.mfu:.1%} x scaling "
                                  f"{x.scaling:.3f} / {sf / 1e9:.3f} GFLOP = {si(x.tokens_per_s)}"))
    else:
        steps.append(("tokens/s", si(x.tokens_per_s)))
    steps += [
        ("hours", f"{si(x.tokens)} tokens / {si(x.tokens_per_s)} tokens/s = {hours(x.hours)}"),
        ("dollars", f"{hours(x.hours)} x {money(x.usd_per_gpu_hour)}/GPU-h x {x.n_gpus} = {money(x.cost_usd)}"
                    f"  [dim]({escape(x.price_source)})[/]"),
    ]
    p = getattr(x, "prepare", None)
    if p is not None:
        steps.append(("data prep", f"{si(p.tokens)} tokens / ({si(p.tokens_per_s_per_core)} tokens/s/core x "
                                   f"{p.cores} cores) = {hours(p.hours)} on the pod before training, x "
                                   f"{money(x.usd_per_gpu_hour)}/GPU-h x {x.n_gpus} = {money(x.prepare_cost_usd)}"
                                   f"  [dim]({escape(p.source)})[/]"))
    if hasattr(mem, "weights_gb") and hasattr(mem, "activations_gb"):
        steps.append(("memory/GPU", f"weights {mem.weights_gb:.1f} + grads {mem.grads_gb:.1f} + AdamW "
                                    f"{mem.optimizer_gb:.1f} + activations {mem.activations_gb:.1f} + logits "
                                    f"{mem.logits_gb:.1f} + overhead {mem.overhead_gb:.1f} = {mem.total_gb:.1f} GB "
                                    f"at micro-batch {mem.micro_batch}"
                                    + (f", sharded over {mem.sharded_over}" if mem.sharded_over > 1 else "")
                                    + f" -> {_FIT_WORDS.get(x.fit, x.fit)}"))
    elif hasattr(mem, "kv_cache_gb"):
        steps.append(("memory/GPU", f"weights {mem.weights_gb:.1f} + KV cache {mem.kv_cache_gb:.2f} + overhead "
                                    f"{mem.overhead_gb:.1f} = {mem.total_gb:.1f} GB -> {_FIT_WORDS.get(x.fit, x.fit)}"))
    t = table(show_header=False)
    t.add_column("step", style="dim")
    t.add_column("how")
    for k, v in steps:
        t.add_row(k, v)
    o.print(t)
    if getattr(x, "constants", ()):
        c = table("Constants: each with its source, or marked an assumption")
        for col in ("constant", "value", "source"):
            c.add_column(col)
        for name, value, source in x.constants:
            c.add_row(name, escape(value), escape(source))
        o.print(c)


def store_quote_line(q: StoreQuote, url: str) -> None:
    """``plan --store``: what the store keeps and costs a month, and who bills the uploads."""
    out().print(f"store {url}: {q.checkpoint_gb:.2f} GB a checkpoint; keeps keep_last 3 + the best = "
                f"{4 * q.checkpoint_gb:.1f} GB: ${4 * q.checkpoint_gb * q.storage_rate_usd_per_gb_month:.2f}/month at "
                f"${q.storage_rate_usd_per_gb_month:g}/GB-month. Uploads (each checkpoint once): vast.ai bills "
                "them at the offer's inet_up_cost $/GB, RunPod does not.", markup=False, highlight=False, soft_wrap=True)
