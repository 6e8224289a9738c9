"""The presentation layer for sweeps (``gpucli sweep``, ``sweep status``, ``sweep down``): part of render."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpucli.cli.render import info, json_out, money, out, table
from gpucli.cli.render_runs import duration

if TYPE_CHECKING:
    from gpucli.run.inputs.launch import ResolvedLaunch
    from gpucli.run.life.sweep import RunView, Sweep, SweepRun


def _row(v: RunView, best: str | None) -> dict[str, Any]:
    from gpucli.run.life.sweep import settings_line

    st = v.status
    return {"run": v.run.name, "settings": dict(v.run.settings), "settings_line": settings_line(v.run.settings),
            "state": v.state, "best": v.run.name == best,
            "step": st.step if st else None, "max_steps": st.max_steps if st else None,
            "loss": st.loss if st else None, "val_loss": st.val_loss if st else None,
            "best_val_loss": st.best_val_loss if st else None,
            "cost_usd": st.cost_usd if st and st.cost_usd is not None else (v.committed_usd if not v.running else None),
            "cap_usd": v.run.cap_usd, "eta_s": st.eta_s if st else None, "error": v.run.error}


def summary(sweep: Sweep, views: list[RunView]) -> dict[str, Any]:
    """The sweep as ``sweep status --json`` gives it."""
    from gpucli.run.life.sweep import best as best_of

    best = best_of(views)
    return {"sweep": sweep.name, "axes": {a.key: list(a.values) for a in sweep.axes}, "fixed": list(sweep.fixed),
            "budget_usd": sweep.budget_usd, "run_budget_usd": sweep.run_budget_usd, "parallel": sweep.parallel,
            "committed_usd": round(sum(v.committed_usd for v in views), 6),
            "running": sum(v.running for v in views), "ended": sweep.ended, "best": best,
            "runs": [_row(v, best) for v in views]}


def status(sweep: Sweep, views: list[RunView], *, json_: bool) -> None:
    data = summary(sweep, views)
    if json_:
        json_out(data)
        return
    budget = f", budget {money(sweep.budget_usd)}" if sweep.budget_usd is not None else ""
    t = table(f"sweep {sweep.name}: {len(views)} runs, {data['running']} running, committed "
              f"{money(data['committed_usd'])}{budget}" + (" (ended)" if sweep.ended else ""))
    for col in ("run", "settings", "state", "step", "loss", "val loss", "$", "ETA"):
        t.add_column(col, justify="right" if col in ("step", "loss", "val loss", "$") else "left")
    for r in data["runs"]:
        loss = r["best_val_loss"] if r["best_val_loss"] is not None else r["val_loss"]
        t.add_row(("* " if r["best"] else "") + r["run"], r["settings_line"], r["state"],
                  "-" if r["step"] is None else str(r["step"]), "-" if r["loss"] is None else f"{r['loss']:.4f}",
                  "-" if loss is None else f"{loss:.4f}", "-" if r["cost_usd"] is None else money(r["cost_usd"]),
                  duration(r["eta_s"]) if r["state"] == "running" else "-")
    out().print(t)
    if data["best"]:
        out().print(f"* best: {data['best']} (lowest validation loss); `gpucli fetch-best {data['best']}`",
                    markup=False, highlight=False)
    for r in data["runs"]:
        if r["error"]:
            out().print(f"{r['run']}: {r['error']}", markup=False, highlight=False)


def planned(sweep: Sweep, plans: list[tuple[SweepRun, ResolvedLaunch]], *, json_: bool) -> None:
    """``sweep --dry-run``: each combination's run, machine and limits; nothing was started."""
    from gpucli.run.life.sweep import settings_line

    rows = [{"run": run.name, "settings": dict(run.settings), "provider": r.provider, "profile": r.profile,
             "gpu": r.gpu_name, "n_gpus": r.n_gpus, "steps": None if r.own_code else r.steps,
             "price_per_hour_usd": r.price_per_hour_usd, "planned_cost_usd": r.planned.cost_usd,
             "planned_hours": r.planned.hours, "command": r.command} for run, r in plans]
    data = {"sweep": sweep.name, "dry_run": True, "budget_usd": sweep.budget_usd, "parallel": sweep.parallel,
            "runs": rows}
    if json_:
        json_out(data)
        return
    t = table(f"Dry run: sweep {sweep.name}, {len(rows)} runs, at most {sweep.parallel} at once"
              + (f", {money(sweep.budget_usd)} in all" if sweep.budget_usd is not None else "")
              + "; nothing was started")
    for col in ("run", "settings", "machine", "steps", "$/h", "planned $"):
        t.add_column(col)
    for (run, r), row in zip(plans, rows, strict=True):
        t.add_row(run.name, settings_line(run.settings), f"{r.n_gpus}x {r.gpu_name} ({r.provider})",
                  "-" if row["steps"] is None else str(row["steps"]),
                  money(r.price_per_hour_usd) if r.price_per_hour_usd else "-",
                  money(r.planned.cost_usd) if r.planned.cost_usd is not None else "-")
    out().print(t)


def ended(name: str, runs: list[str], *, json_: bool) -> None:
    if json_:
        json_out({"sweep": name, "ended": True, "runs_ended": runs})
        return
    info(f"sweep {name} ended: " + (f"{len(runs)} run(s) stopped ({', '.join(runs)})" if runs
                                     else "no run was running") + "; no more runs start")
