"""`/tune`: run `popviz tune` on the open profile in the background (app.tune_jobs; the
page polls the job), rank its plans, draw throughput against peak memory (Pareto), and
compare any plan with the current profile on /compare; below, what each AMP step trades
on each IPU (popviz.analysis.amp, shown at once). A max tile fill below 100 % is the
memory ceiling of `popviz tune --max-tile-fill`: a plan fits only when no tile is fuller.
The plan is compiled in memory and served under a virtual name (`@tune/...`): nothing
is written into the served folder."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from popviz.advise.plans import compile_plan, plans_table, run_tune
from popviz.advise.tune_search import fit_words
from popviz.analysis.amp import amp_steps
from popviz.errors import ProfileError
from popviz.figures.tune import amp_steps_figure, tune_figure
from popviz.format.memory import ReportProfile
from popviz.units import count_of

from ..cache import VIRTUAL_PREFIX, Entry
from ..common import (
    AppContext,
    capacity_per_ipu,
    graph,
    message,
    naming,
    profile_of,
    table,
    title_of,
)
from ..tune_jobs import FULL

if TYPE_CHECKING:
    from popviz.advise.tune import TuneResult

PATH = "/tune"
TITLE = "Tune"
NEEDS_PROFILE = True
FIGURES: dict[str, Any] = {}
DEFAULT_BUDGET = 16
POLL_MS = 700
SHOWN = ["plan", "splits", "amp", "recomputation", "schedule", "fits", "throughput",
         "throughput_per_ipu", "vs_now", "step_ms", "idle_fraction", "peak_MiB",
         "fullest_tile", "pareto"]



# the search's notes name the command line's flags; here the boxes above set the same
FLAG_WORDS = (("raise --max-compiles", "raise the compile budget"),
              ("(--max-tile-fill)", "(max tile fill %)"))


def page_words(note: str) -> str:
    """A note of the search in the page's words (its controls, not the CLI's flags)."""
    for flag, words in FLAG_WORDS:
        note = note.replace(flag, words)
    return note


def _plan_rel(entry: Entry, budget: int, rank: int, fill: int = FULL) -> str:
    """The virtual name a compiled plan is served under (app.cache.VIRTUAL_PREFIX). A run
    with a ceiling names it (`fill60`): its plan #1 is another plan than the 100 % run's;
    a run without one keeps the name plans always had."""
    ceiling = f"/fill{fill}" if fill < FULL else ""
    return f"{VIRTUAL_PREFIX}tune/{entry.rel}/budget{budget}{ceiling}/plan{rank}"


def _budget(value: Any) -> int:
    try:
        return max(2, min(200, int(value or DEFAULT_BUDGET)))
    except (TypeError, ValueError):
        return DEFAULT_BUDGET


def _fill(value: Any) -> int:
    """The max tile fill input, a whole percent in 1..100; empty or anything else (the
    browser sends nothing for a number out of range) means no ceiling, 100."""
    try:
        fill = float(value)
    except (TypeError, ValueError):
        return FULL
    return round(fill) if 1 <= fill <= FULL else FULL  # NaN fails the test too


def _input_problem(budget: Any, fill: Any) -> str | None:
    """What is wrong with the inputs a press would run, in words; None when both are
    usable. The browser sends None for an empty box or a number outside its min..max."""
    def whole(value: Any, low: int, high: int) -> bool:
        try:
            number = float(value)
        except (TypeError, ValueError):
            return False
        return number == round(number) and low <= number <= high

    if not whole(budget, 2, 200):
        return "Nothing run: the compile budget must be a whole number from 2 to 200."
    if not whole(fill, 1, FULL):
        return ("Nothing run: max tile fill must be a whole percent from 1 to 100 "
                "(100: no ceiling).")
    return None


def _fits_words(plans: Any, fill: int) -> list[str]:
    """The fits column as `popviz tune` prints it: yes, or NO (N tiles > 60%)."""
    return [fit_words(bool(f), int(n), fill / FULL)
            for f, n in zip(plans["fits"], plans["oom_tiles"], strict=True)]


def results(ctx: AppContext, entry: Entry, budget: int, result: TuneResult,
            fill: int = FULL) -> list[Any]:
    """The ranked plans, the Pareto figure and a compare link per plan (its button names
    the run it came from: budget and fill)."""
    strategy = str(((entry.profile.meta or {}).get("options") or {}).get("strategy")
                   or "pipelined")  # the flags popviz tune prints for this profile
    plans = plans_table(result, strategy)
    gpu = naming(entry).gpu_plan  # no AMP and no tiles on a GPU: no columns of them
    columns = [c for c in SHOWN if not (gpu and c in ("amp", "fullest_tile"))]
    shown = plans.assign(fits=_fits_words(plans, fill), recomputation=plans["recompute"],
                         peak_MiB=(plans["peak_bytes"] / 2**20).round(1),
                         throughput=plans["throughput"].round().astype("int64"),
                         throughput_per_ipu=plans["throughput_per_ipu"].round().astype("int64"),
                         step_ms=plans["step_ms"].round(3),
                         vs_now=plans["vs_now"].round(2),
                         # shares stay numbers (shown as percent: common.is_share), so
                         # they sort as numbers: as text "100 %" came before "9 %"
                         fullest_tile=plans["fullest_tile"].astype(float),
                         idle_fraction=plans["idle_fraction"].astype(float))[columns]
    links: list[Any] = [html.Span("Compare with this profile: ", className="label")]
    for rank in range(1, len(result.candidates) + 1):
        links.append(html.Button(f"plan #{rank}", id={"type": "tune-compare", "rank": rank,
                                                      "budget": budget, "fill": fill},
                                 n_clicks=0, className="download"))
    notes = [html.Li(page_words(n)) for n in result.notes]
    return [
        html.Div(_head(result, gpu), className="status", id="tune-head"),
        html.Div(f"fits = every tile at most {fill}% full (max tile fill); the current "
                 "layout is judged the same way.", className="status", id="tune-ceiling")
        if fill < FULL else html.Div(),
        graph("tune-graph", tune_figure(plans, capacity_per_ipu(entry),
                                        max_tile_fill=fill / FULL)),
        table("tune-plans", shown, page_size=20),
        html.Div(links, className="downloads", id="tune-links"),
        html.Div(id="tune-go"),
        html.Ul(notes, className="hint") if notes else html.Div(),
        html.H3("train.py flags of each plan"),
        html.Ul([html.Li(f"{p}: train.py ... {a}") for p, a in
                 zip(plans["plan"], plans["train_args"], strict=True)], className="hint"),
    ]


def _head(result: TuneResult, gpu: bool) -> str:
    """What the search did, in one line; one that found no other layout says so and what
    to do (a table of the current layout alone read like an empty result)."""
    device = "GPU" if gpu else "IPU"
    on = f"{count_of(result.num_ipus, device)} on {result.target}"
    took = f"{result.compiles} compiles ({result.seconds:.1f} s)"
    if not result.candidates:
        return (f"No layout besides the current one came out of {took} for {on}: raise the "
                "compile budget to search further.")
    return (f"{result.layouts} layouts in {took} for {on}. Ranked: fitting first, then "
            "throughput, then memory headroom.")


def poll(ctx: AppContext, entry: Entry, budget: int,
         fill: int = FULL) -> tuple[list[Any], bool]:
    """(what the results area shows, whether to stop polling) for the job of `budget` and
    `fill`."""
    job = ctx.tune_jobs.get(entry.rel, budget, fill)
    if job is None:
        return [message("Press Run tune (about a second per compile, in the background).",
                        "info")], True
    if job.state == "error":
        return [message(job.error)], True
    if job.state != "done":
        return [html.Div(job.progress(), className="status", id="tune-progress")], False
    return results(ctx, entry, budget, job.result, fill), True


def amp_section(entry: Entry) -> html.Div:
    """What each AMP step trades on each IPU: the profile's conv / matmul ops re-planned
    at every step (instant: no compile), as a figure and a table. None on a GPU plan:
    AMP is an IPU option."""
    if not naming(entry).has_amp:
        return html.Div(id="tune-amp")
    steps = entry.get("amp_steps", lambda: amp_steps(entry.profile.ops, entry.profile.meta))
    head = [html.H3("What each AMP step trades"), html.P(
        "The current layout's convolutions and matmuls re-planned at each "
        "availableMemoryProportion, per IPU: a lower AMP bounds the temporary memory a "
        "plan adds to a tile, so it rules out the fast, replicated partitions. Cycles of "
        "one micro-batch; the temporary memory is the largest any of the IPU's ops adds to "
        "a tile; 'changes' says whether the step differs from the next lower one.",
        className="hint")]
    if steps is None:
        return html.Div([*head, message("No convolution or matmul to re-plan here.", "info")],
                        id="tune-amp")
    shown = steps.assign(amp=steps["amp"].map(lambda a: f"{a:g}"),
                         Mcycles=(steps["cycles"] / 1e6).round(3),
                         temp_KiB=(steps["temp_bytes"] / 1024).round(1),
                         in_force=steps["in_force"].map({True: "in force", False: ""}),
                         changes=steps["changes"].map({True: "yes", False: ""}))
    shown = shown[["ipu", "amp", "in_force", "Mcycles", "temp_KiB", "serial_ops",
                   "over_amp_ops", "ops", "changes"]]
    return html.Div([*head, graph("tune-amp-graph", amp_steps_figure(steps)),
                     table("tune-amp-table", shown, page_size=len(shown))], id="tune-amp")


def layout(ctx: AppContext, entry: Entry) -> html.Div:
    if naming(entry).measured:
        return html.Div([html.H2(title_of(entry)), html.Div([
            "A measured profile holds no recorded program to re-plan; tune needs a modelled "
            "one (", html.Code("train.py --profile", className="flag"), ")."],
            className="message info")])
    if entry.rel.startswith(VIRTUAL_PREFIX):
        return html.Div([html.H2(title_of(entry)), message(
            "This is a tune plan held in memory; tune the profile it came from.", "info")])
    # a reload shows the search last run here again, with the inputs it was run with
    last = ctx.tune_jobs.latest(entry.rel)
    budget, fill = (last.budget, last.fill) if last is not None else (DEFAULT_BUDGET, FULL)
    shown, done = poll(ctx, entry, budget, fill)
    return html.Div([
        html.H2(title_of(entry)),
        html.P("Re-plans the recorded program with other split points, "
               + ("" if naming(entry).gpu_plan else "AMP per IPU, ") +
               "recomputation and schedule (popviz tune): every plan is compiled with the "
               "cost model, nothing is run. Each run compiles up to the budget below, in "
               "the background; one search per profile at a time.", className="hint"),
        html.Div([html.Span("compile budget", className="label"),
                  dcc.Input(id="tune-budget", type="number", min=2, max=200, step=1,
                            value=budget, style={"width": 80}),
                  *_fill_input(naming(entry).gpu_plan, fill),
                  html.Button("Run tune", id="tune-run", n_clicks=0)],
                 className="row", style={"alignItems": "center"}),
        dcc.Store(id="tune-job", data={"budget": budget, "fill": fill}),
        dcc.Interval(id="tune-poll", interval=POLL_MS, disabled=done),
        html.Div(shown, id="tune-results"),
        amp_section(entry),
    ])


def _fill_input(gpu: bool, fill: int = FULL) -> list[Any]:
    """The max tile fill input; a GPU has no tiles, so there it is hidden at 100."""
    if gpu:
        return [dcc.Input(id="tune-fill", type="hidden", value=FULL)]
    return [html.Span("max tile fill %", className="label",
                      title="a plan fits only when no tile is fuller than this share of its "
                      "memory (popviz tune --max-tile-fill); 100: no ceiling"),
            dcc.Input(id="tune-fill", type="number", min=1, max=FULL, step=1, value=fill,
                      style={"width": 70})]


def register(app: dash.Dash, ctx: AppContext) -> dict[str, Any]:
    # the job polled is the one a press started (kept in tune-job), not what the inputs
    # say now: editing them while a search runs does not lose it
    @app.callback(Output("tune-results", "children"), Output("tune-poll", "disabled"),
                  Output("tune-job", "data"),
                  Input("tune-run", "n_clicks"), Input("tune-poll", "n_intervals"),
                  State("tune-budget", "value"), State("tune-fill", "value"),
                  State("tune-job", "data"), State("url", "search"),
                  prevent_initial_call=True)
    def run(clicks: int, ticks: int | None, budget: Any, fill: Any, key: dict | None,
            search: str) -> tuple[list[Any], bool, dict]:
        entry = ctx.cache.get(profile_of(search))
        key = key or {"budget": DEFAULT_BUDGET, "fill": FULL}
        if dash.ctx.triggered_id == "tune-run" or (dash.ctx.triggered_id is None and clicks):
            if (problem := _input_problem(budget, fill)) is not None:
                return [message(problem)], True, key
            budget, fill, profile = _budget(budget), _fill(fill), entry.profile
            try:
                job = ctx.tune_jobs.start(
                    entry.rel, budget, lambda: run_tune(profile, max_compiles=budget,
                                                        max_tile_fill=fill / FULL), fill)
            except RuntimeError as exc:
                return [message(str(exc))], True, key
            key = {"budget": job.budget, "fill": job.fill}  # a running one may be another
        elif not ticks:
            raise PreventUpdate
        return (*poll(ctx, entry, _budget(key.get("budget")), _fill(key.get("fill"))), key)

    @app.callback(Output("tune-go", "children"),
                  Input({"type": "tune-compare", "rank": dash.ALL, "budget": dash.ALL,
                         "fill": dash.ALL}, "n_clicks"),
                  State("url", "search"), prevent_initial_call=True)
    def compare_plan(clicks: list[int], search: str) -> Any:
        picked = dash.ctx.triggered_id if clicks and any(clicks) else None
        if not picked:
            raise PreventUpdate
        return link_to_compare(ctx, profile_of(search), int(picked["rank"]),
                               _budget(picked["budget"]), _fill(picked["fill"]))

    return {"run": run, "compare_plan": compare_plan}


def link_to_compare(ctx: AppContext, rel: str, rank: int, budget: int,
                    fill: int = FULL) -> Any:
    """Compile plan #rank of the run (budget, fill) in memory (once), serve it under a
    virtual name and navigate to /compare?profile=<plan>&other=<this>."""
    entry = ctx.cache.get(rel)
    job = ctx.tune_jobs.get(rel, budget, fill)
    if job is None or job.state != "done":
        return message("Run tune first.", "info")
    plan_rel = _plan_rel(entry, budget, rank, fill)
    try:
        ctx.cache.get(plan_rel)
    except ProfileError:
        try:
            report = compile_plan(entry.profile, job.result, rank)
        except (OSError, ValueError) as exc:
            return message(f"could not compile plan #{rank}: {exc}")
        ctx.cache.register_virtual(plan_rel, ReportProfile(report, name=f"plan #{rank}",
                                                           path=plan_rel))
    href = "/compare?" + urlencode({"profile": plan_rel, "other": rel})
    return dcc.Location(id="tune-location", href=href, refresh=True)
