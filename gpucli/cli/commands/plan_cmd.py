"""`gpucli plan`: memory, speed, hours and dollars for every setup; the Pareto front and picks."""

from __future__ import annotations

from pathlib import Path

import typer


def plan(
    model: list[str] = typer.Option(..., "--model", "-m", help="Model preset (gpucli models) or nanochat depth dN; "
                                    "generation takes several (--model 7b --model 7b-b: a second model of 7b's shape)."),
    models: int = typer.Option(1, "--models", help="Generation: this many models of each --model's shape."),
    order: str = typer.Option("parallel", "--order", help="Generation with several models: parallel (side by "
                              "side on the GPUs) or sequence (one after another on every GPU)."),
    context: int = typer.Option(None, "--context", help="Generation: tokens of context a sequence (prompt and "
                                "output; default 512, the Pareto cost analysis's)."),
    tokens: str = typer.Option(None, "--tokens", help="Tokens to train on or generate: 20B, 500M, 1e9."),
    examples: str = typer.Option(None, "--examples", help="Training examples (with --epochs; each --seq-len tokens)."),
    epochs: float = typer.Option(None, "--epochs", help="Passes over --examples."),
    steps: int = typer.Option(None, "--steps", help="Optimizer steps (with --batch sequences a step)."),
    batch: int = typer.Option(None, "--batch", help="Sequences a step (with --steps)."),
    tokens_per_param: float = typer.Option(20.0, "--tokens-per-param", help="Token budget per parameter "
                                           "when --tokens is not given (20 = Chinchilla)."),
    seq_len: int = typer.Option(None, "--seq-len", help="Training sequence length (default: the model's)."),
    budget: float = typer.Option(None, "--budget", help="Dollars: the best setup within it, and what it buys."),
    deadline: str = typer.Option(None, "--deadline", help="Time limit: 24h, 90m, 2d."),
    spot: bool = typer.Option(False, "--spot", help="Plan with spot (interruptible) prices."),
    gpu: str = typer.Option(None, "--gpu", help="Only these GPUs, comma separated: h100,a100-80."),
    max_gpus: int = typer.Option(8, "--max-gpus", help="Largest GPU count per machine."),
    max_nodes: int = typer.Option(1, "--max-nodes", help="Also plan 2, 4, ... machines of the largest count "
                                  "(inter-node link and data-parallel model: gpucli/plan/internode.py)."),
    workload: str = typer.Option("train", "--workload",
                                 help="train, or generate (inference, bound by decode speed: tokens generated per second)."),
    price: float = typer.Option(None, "--price", help="Use this $/GPU-hour for every setup."),
    mfu: float = typer.Option(None, "--mfu", help="Use this model FLOPs utilisation (0-1) for training."),
    json_: bool = typer.Option(False, "--json", help="Print JSON."),
    plot: Path = typer.Option(None, "--plot", metavar="FILE", help="Write the cost/time chart as a PNG."),
    chart: bool = typer.Option(True, "--chart/--no-chart", help="Draw the cost/time chart in the terminal."),
    all_: bool = typer.Option(False, "--all", help="List every dominated setup."),
    live: bool = typer.Option(False, "--live", help="Plan on live provider offers (gpucli offers) instead of "
                              "catalogue prices; each price names its offer id."),
    query: str = typer.Option(None, "--query", "-q", metavar="QUERY",
                              help="With --live: vast.ai query for the offers, e.g. 'num_gpus>=4 reliability>0.98'."),
    provider: str = typer.Option("all", "--provider", help="vast, runpod or all: whose prices (catalogue, or "
                                 "with --live its offers)."),
    phase: str = typer.Option(None, "--phase", help="Training phase (gpucli profiles): a two-stage phase (tnt) "
                              "plans each stage at its own memory chunk size."),
    set_: list[str] = typer.Option([], "--set", help="Model override as for launch, e.g. --set model.refine_steps=4: "
                                   "the model planned is the one the trainer builds."),
    store: str | None = typer.Option(None, "--store", help="Also quote a checkpoint store (s3://... or hf://...): what "
                              "it keeps a month, and which provider bills the uploads."),
    explain: str = typer.Option(None, "--explain", metavar="SETUP",
                                help="Show how one setup's numbers were computed, e.g. --explain '8x H100 SXM'."),
) -> None:
    """Estimate every setup that fits and show the exact Pareto front of cost against time."""
    import datetime as dt

    from gpucli.cli import render, render_plan
    from gpucli.errors import UsageError
    from gpucli.plan.catalog import load_catalog
    from gpucli.plan.estimate import parse_duration_hours, parse_quantity
    from gpucli.plan.planner import PlanRequest, make_plan

    catalog = load_catalog()
    try:
        n_tokens = parse_quantity(tokens) if tokens is not None else None
        deadline_h = parse_duration_hours(deadline) if deadline is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for name, value, lo, hi in (("--tokens-per-param", tokens_per_param, 1e-9, 1e9),
                                ("--max-gpus", max_gpus, 1, 1024), ("--budget", budget, 1e-9, 1e12),
                                ("--price", price, 0, 1e6), ("--mfu", mfu, 1e-6, 1.0),
                                ("--seq-len", seq_len, 1, 10_000_000), ("--models", models, 1, 1024),
                                ("--context", context, 1, 10_000_000)):
        if value is not None and not (lo <= value <= hi):
            raise UsageError(f"{name} must be between {lo:g} and {hi:g}, got {value:g}")
    for name, value, lo, hi in (("--epochs", epochs, 1e-6, 1e6), ("--steps", steps, 1, 1e12), ("--batch", batch, 1, 1e9)):
        if value is not None and not (lo <= value <= hi):
            raise UsageError(f"{name} must be between {lo:g} and {hi:g}, got {value:g}")
    counted = _tokens_from_counts(examples, epochs, steps, batch, seq_len or catalog.model(model[0]).max_seq_len)
    if counted is not None:
        if n_tokens is not None:
            raise UsageError("--tokens and --examples/--epochs or --steps/--batch both say how much to train",
                             hint="use one of them")
        n_tokens = counted
        t = seq_len or catalog.model(model[0]).max_seq_len
        tokens_from = (f"{examples} examples x {epochs:g} epochs x {t} tokens" if examples is not None else
                       f"{steps:,} steps x {batch:,} sequences x {t} tokens")
    else:
        tokens_from = "--tokens"
    if plot is not None:
        plot = _check_plot_path(plot)
    gpus = tuple(g.strip() for g in gpu.split(",") if g.strip()) if gpu else ()
    for g in gpus:
        catalog.gpu(g)  # unknown names fail here, with suggestions
    if store:  # a bad URL is said before anything is planned
        from gpucli.runs.storeurl import store_url

        store = store_url(store)
    shapes = [_model_shape(catalog, name) for name in model]
    shapes = [s for s in shapes for _ in range(models)]
    if models > 1:
        import dataclasses

        shapes = [dataclasses.replace(s, name=f"{s.name}#{i % models + 1}") for i, s in enumerate(shapes)]
    shape = shapes[0]
    if set_:
        from gpucli.plan.runmodel import resolved_model

        sets = tuple(s if s.startswith("--") else f"--{s}" for s in set_)
        if any(not s.startswith(("--model.", "--data.tokenizer=", "--data.bpe_vocab_size=", "--training.stage"))
               for s in sets):
            raise UsageError("plan --set takes model.* (and data.tokenizer, data.bpe_vocab_size, "
                             "training.stage*) overrides")
        shapes = [resolved_model(s, sets, data_known=False) for s in shapes]
        shape = shapes[0]
    stages = ()
    if phase is not None:
        from gpucli.plan.runmodel import run_stages

        st = run_stages(catalog.phase(phase).stages, tuple(f"--{x}" if not x.startswith("--") else x for x in set_))
        stages = st.shares() if st is not None else ()
    request = PlanRequest(
        model=shape, stages=stages, tokens_from=tokens_from,
        provider=None if live or provider.strip().lower() == "all" else _provider_name(provider), more_models=tuple(shapes[1:]), order=order.strip().lower(), context_tokens=context, today=dt.date.today(), workload=workload.strip().lower(), tokens=n_tokens,
        tokens_per_param=tokens_per_param, seq_len=seq_len, spot=spot, gpus=gpus, max_gpus=max_gpus,
        budget_usd=budget, deadline_hours=deadline_h, price_per_gpu_hour=price, mfu=mfu)
    setups = None
    if live:
        setups = _live_setups(catalog, request, query=query, provider=provider)
    elif query is not None:
        raise UsageError("--query filters live offers: it can only apply with --live",
                         hint="--provider alone picks whose catalogue prices are used")
    result = make_plan(catalog, request, setups=setups)
    if max_nodes > 1:
        from gpucli.plan.internode import with_nodes
        from gpucli.providers.registry import all_targets

        unplanned = tuple(t.caps.link() for t in all_targets() if t.cloud and t.caps.link_gbps is None)
        result = with_nodes(catalog, request, result, max_nodes, unplanned=unplanned)
    if explain is not None:
        from gpucli.plan.explain import explain_setup

        render_plan.explanation(explain_setup(catalog, result, explain), json_=json_)
        return
    if plot is not None:
        render_plan.plot_png(result, plot)
    if json_:
        render.json_out(render_plan.plan_json(result))
    else:
        render_plan.plan_tables(result, show_all=all_)
        if chart:
            render_plan.plan_chart(result)
        if store:
            from gpucli.plan.disk import checkpoint_disk
            from gpucli.plan.storecost import store_quote
            from gpucli.run.files.store import storage_rate

            url = str(store)
            q = store_quote(checkpoint_gb=checkpoint_disk(shape).checkpoint_gb, written=1, keep_last=3, hours=None,
                            transfer_usd_per_gb=None, storage_usd_per_gb_month=storage_rate(url))
            render_plan.store_quote_line(q, url)
    if plot is not None:
        render_plan.wrote(plot)


def _provider_name(name: str) -> str:
    from gpucli.errors import UsageError
    from gpucli.providers.registry import all_targets

    key, clouds = name.strip().lower(), [t.name for t in all_targets() if t.cloud]  # whose catalogue prices exist
    if key not in clouds:
        raise UsageError(f"--provider must be {', '.join(clouds)} or all, got '{name}'")
    return key


def _tokens_from_counts(examples: str | None, epochs: float | None, steps: int | None, batch: int | None,
                       seq_len: int) -> float | None:
    """Tokens from examples x epochs or steps x batch, each sequence ``seq_len`` tokens (the GPU profiles guide counts
    "50,000 training examples, 10,000 iterations" at a batch)."""
    from gpucli.errors import UsageError
    from gpucli.plan.estimate import parse_quantity

    if (examples is None) != (epochs is None):
        raise UsageError("--examples and --epochs go together (tokens = examples x epochs x --seq-len)")
    if (steps is None) != (batch is None):
        raise UsageError("--steps and --batch go together (tokens = steps x batch x --seq-len)")
    if examples is not None and steps is not None:
        raise UsageError("give --examples/--epochs or --steps/--batch, not both")
    if examples is not None:
        try:
            n = parse_quantity(examples)
        except ValueError as exc:
            raise UsageError(f"--examples: {exc}") from None
        return n * float(epochs or 0) * seq_len
    if steps is not None:
        return float(steps) * float(batch or 0) * seq_len
    return None


def _model_shape(catalog, name: str):  # noqa: ANN001, ANN202
    """A preset, or ``PRESET-TAG`` for another model of a preset's shape (the Pareto cost analysis's four 7B models:
    --model 7b --model 7b-b ...): planned with the preset's shape under its own name."""
    import dataclasses

    from gpucli.errors import UnknownNameError
    from trainer.spec.presets import lookup

    if lookup(name) is None and "-" in name:
        base, _, tag = name.rpartition("-")
        spec = lookup(base)
        if spec is not None and tag:
            return dataclasses.replace(spec, name=name.strip())
    try:
        return catalog.model(name)
    except UnknownNameError:
        raise


PLOT_FORMATS = (".png", ".svg", ".pdf")


def _check_plot_path(path: Path) -> Path:
    """`--plot FILE`: a file (not a folder) whose suffix names a format we write."""
    from gpucli.errors import UsageError

    if path.is_dir() or str(path).endswith(("/", "\\")):
        raise UsageError(f"--plot {path} is a folder", hint=f"name a file in it, e.g. --plot {path / 'plan.png'}")
    if path.suffix.lower() not in PLOT_FORMATS:
        raise UsageError(f"--plot {path}: the file name must end in {', '.join(PLOT_FORMATS)}",
                         hint=f"e.g. --plot {path.with_suffix('.png')}")
    return path


LIVE_OFFER_LIMIT = 200  # per provider: enough for a front, few enough for one search call each


def _live_setups(catalog, request, *, query: str | None, provider: str) -> list:  # noqa: ANN001
    """Planner setups from live offers (warnings for skipped providers go to stderr)."""
    from gpucli.cli import render
    from gpucli.cli.commands.offers_cmd import resolve_providers
    from gpucli.errors import NothingFitsError, UsageError
    from gpucli.providers.offers import DEFAULT_ORDER, DEFAULT_SPOT_ORDER, offers_to_setups, search_all
    from gpucli.providers.query import parse_query

    if request.price_per_gpu_hour is not None:
        raise UsageError("--price and --live both set the price", hint="use one of them")
    names, required = resolve_providers(provider)
    offers, warnings = search_all(names, parse_query(query), spot=request.spot, limit=LIVE_OFFER_LIMIT,
                                  order=DEFAULT_SPOT_ORDER if request.spot else DEFAULT_ORDER, required=required)
    for message in warnings:
        render.warn(message)
    gpu_ids = {catalog.gpu(g).id for g in request.gpus} if request.gpus else None
    setups = offers_to_setups(catalog, offers, spot=request.spot, gpu_ids=gpu_ids, max_gpus=request.max_gpus)
    if not setups:
        raise NothingFitsError(f"none of the {len(offers)} live offers matches a catalogue GPU within the limits",
                               hint="widen --query, drop --gpu, raise --max-gpus, or see `gpucli offers`")
    return setups


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
