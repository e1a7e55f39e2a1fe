"""A measured profile (popviz.measure: ranks, ns, no tiles, no AMP) speaks of ranks and ns
in every figure and page; a modelled one keeps IPUs and cycles (and nearly empty tiles are
drawn to their own scale). Uses the example profiles in profiles/ and the figure builders and
pages called directly."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dash import html
from popviz_app import ProfileCache, render
from popviz_app.common import AppContext

import popviz
from popviz import analysis, figures
from popviz.api import compare
from popviz.figures import compare as cf
from popviz.vocab import MEASURED, MODELLED, naming_for, naming_of
from tests.bundled_fixtures import MEASURED_REL, MODELLED_REL, ROOT
from tests.dash_util import component_text as _text
from tests.dash_util import find_components


def test_the_example_profiles_are_there() -> None:
    # committed files: a missing one is a failure, never a skipped module
    assert (ROOT / MEASURED_REL).is_file() and (ROOT / MODELLED_REL).is_file()




def _words(fig: Any) -> str:
    """Everything a user can read in a figure: titles, ticks, names, hover, annotations."""
    return json.dumps(fig.to_plotly_json(), default=str)


def test_naming_follows_kind_and_target(measured: Any, modelled: Any) -> None:
    assert naming_for(measured) is MEASURED and naming_for(modelled) is MODELLED
    assert naming_of(None, {"target": {"name": "cpu-gloo"}}) is MEASURED
    assert naming_of("modelled", {"target": {"name": "mk2"}}) is MODELLED
    assert [MEASURED.label(1), MODELLED.label(1)] == ["rank 1", "IPU1"]
    assert MEASURED.column("forward_cycles") == "forward ns"
    assert MEASURED.column("ipu") == "rank" and MODELLED.column("ipu") == "ipu"
    assert MEASURED.column("cycles") == "ns" and MODELLED.column("cycles") == "cycles"


def test_trace_of_a_measured_profile_has_rank_rows_and_ns(measured: Any) -> None:
    ranks = sorted(int(i) for i in measured.trace["ipu"].unique())
    for max_events in (10**6, 10):  # single events, and buckets
        fig = figures.trace_figure(measured.trace, naming=MEASURED, max_events=max_events)
        assert list(fig.layout.yaxis.ticktext) == [f"rank {r}" for r in ranks]
        assert fig.layout.xaxis.title.text == "time (ns)"
        text = _words(fig)
        assert "IPU" not in text and "cycles" not in text
        assert " ns" in text and "rank" in text


def test_trace_of_a_modelled_profile_keeps_ipus_and_cycles(modelled: Any) -> None:
    fig = figures.trace_figure(modelled.trace, naming=naming_for(modelled))
    assert fig.layout.yaxis.ticktext[0] == "IPU0"
    assert fig.layout.xaxis.title.text == "cycles"
    assert "rank" not in _words(fig) and " ns" not in _words(fig)


def test_exchange_figures_of_a_measured_profile(measured: Any) -> None:
    matrix = figures.exchange_matrix_figure(analysis.exchange_matrix(measured.exchange, 2),
                                            naming=MEASURED)
    heat = matrix.data[0]
    assert list(heat.x) == ["rank 0", "rank 1"] == list(heat.y)  # no empty host row
    over = figures.exchange_time_figure(analysis.exchange_over_time(measured.exchange),
                                        naming=MEASURED)
    assert over.layout.xaxis.title.text == "time (ns)"
    for fig in (matrix, over):
        assert "IPU" not in _words(fig) and "cycles" not in _words(fig)


def test_stage_figures_of_a_measured_profile(measured: Any) -> None:
    stages = measured.stages
    time = figures.ipu_time_figure(stages, naming=MEASURED)
    assert list(time.data[0].x) == ["rank 0", "rank 1"]
    assert time.layout.yaxis.title.text == "ns per step"
    assert time.layout.title.text.startswith("Time per rank")
    load = figures.stage_load_figure(stages, naming=MEASURED)
    stash = figures.stash_figure(stages, naming=MEASURED)
    assert list(load.data[0].x) == ["stage 0 (rank 0)", "stage 1 (rank 1)"]
    assert list(stash.data[0].x) == list(load.data[0].x)
    # a run's traces show no stash: no empty stash bars that read as none, the title says so
    assert [t.name for t in stash.data] == ["peak liveness"]
    assert "show no stash" in stash.layout.title.text
    for fig in (time, load, stash):
        assert "IPU" not in _words(fig) and "cycles" not in _words(fig)
    amp = figures.amp_figure(stages, measured.meta, naming=MEASURED)
    assert len(amp.data) == 0 and "default 0.6" not in _words(amp)
    assert "measured run has none" in amp.layout.annotations[0].text


def test_liveness_of_a_measured_profile_has_rank_panels(measured: Any) -> None:
    fig = figures.liveness_figure(measured.liveness, analysis.bumps(measured.liveness),
                                  naming=MEASURED)
    assert [a.text for a in fig.layout.annotations][:2] == ["rank 0", "rank 1"]
    assert set(fig.layout.meta["points"]) == {"rank 0", "rank 1"}
    assert "IPU" not in _words(fig)
    # a live run's liveness is torch.profiler's memory events, as an import's
    assert fig.layout.xaxis2.title.text == "memory event on the rank (an allocation or free)"
    older = figures.liveness_figure(measured.liveness.drop(columns="time"), naming=MEASURED)
    assert older.layout.xaxis2.title.text == "compute action on the rank"  # no times: actions


def test_an_imports_liveness_steps_are_allocator_events(measured: Any) -> None:
    # an import's liveness carries each sample's time: one step is an allocation or free
    # (issue 21: it said "compute action" while counting a snapshot's allocator events)
    live = measured.liveness.assign(time=measured.liveness["step"] * 1000)
    fig = figures.liveness_figure(live, naming=MEASURED)
    assert fig.layout.xaxis2.title.text == "memory event on the rank (an allocation or free)"
    modelled = figures.liveness_figure(live.drop(columns="time"), naming=MODELLED)
    assert modelled.layout.xaxis2.title.text == "program step"


_find = find_components


@pytest.fixture(scope="module")
def ctx() -> AppContext:
    return AppContext(root=ROOT, cache=ProfileCache(ROOT))


def test_pages_of_a_measured_profile_say_rank_and_ns(ctx: AppContext) -> None:
    query = f"?profile={MEASURED_REL}"
    summary = _text(render(ctx, "/summary", query)[1])
    assert "on rank " in summary and " ns (" in summary and "Peak liveness per rank" in summary
    headers = [c["name"] for t in _find(render(ctx, "/summary", query)[1], "DataTable")
               for c in t.columns]
    assert "peak step" in headers and "at" not in headers  # no empty column of op names
    stages = render(ctx, "/stages", query)[1]
    # a measured run has no compiler options: no AMP chart, nor a note about one
    assert "availableMemoryProportion" not in _text(stages) and "AMP" not in _text(stages)
    assert "stages-amp" not in [g.id for g in _find(stages, "Graph")]
    assert not [c for c in find_components(stages, "Div")
                if getattr(c, "id", None) == "stages-amp-note"]
    headers = [c["name"] for t in _find(stages, "DataTable") for c in t.columns]
    assert "forward ns" in headers and "rank" in headers
    assert not [h for h in headers if "cycles" in h or h == "ipu"]
    rows = [r for t in _find(stages, "DataTable") for r in t.data if "stash" in r]
    assert rows and {r["stash"] for r in rows} == {"not measured"}
    assert not [h for h in headers if h.startswith("stash ")]  # no zeros that read as none
    exchange = render(ctx, "/exchange", query)[1]
    headers = [c["name"] for t in _find(exchange, "DataTable") for c in t.columns]
    assert "ns" in headers and "cycles" not in headers
    for path in ("/trace", "/exchange", "/stages", "/liveness"):
        for graph in _find(render(ctx, path, query)[1], "Graph"):
            assert "IPU" not in _words(graph.figure), f"{path}: {graph.id}"
            assert "cycles" not in _words(graph.figure), f"{path}: {graph.id}"


def test_modelled_stages_page_keeps_amp_and_cycles(ctx: AppContext) -> None:
    stages = render(ctx, "/stages", f"?profile={MODELLED_REL}")[1]
    assert "stages-amp" in [g.id for g in _find(stages, "Graph")]
    headers = [c["name"] for t in _find(stages, "DataTable") for c in t.columns]
    assert "forward cycles" in headers and "ipu" in headers


def test_compare_of_modelled_and_measured_names_each_sides_devices(measured: Any,
                                                                   modelled: Any) -> None:
    comp = compare(modelled, measured)
    time = cf.ipu_time_compare_figure(comp)
    sides, devices = (list(v) for v in time.data[0].x)
    assert sides == ["A"] * 4 + ["B"] * 2
    assert devices == ["IPU0", "IPU1", "IPU2", "IPU3", "rank 0", "rank 1"]
    assert "IPU / rank" in time.layout.title.text
    live = cf.liveness_compare_figure(comp)
    names = [t.name for t in live.data]
    assert any(n.endswith("· rank 1") and n.startswith("B") for n in names)
    assert not any("IPU" in n for n in names if n.startswith("B"))
    page = _text(render(ctx=AppContext(root=ROOT, cache=ProfileCache(ROOT)), path="/compare",
                        search=None)[1])
    assert "Pick two profiles" in page


def test_small_exchanges_in_kib_and_the_load_painted_as_measured(measured: Any) -> None:
    largest = int(measured.exchange["bytes"].sum())
    assert largest < 2**20  # the example's messages are a few KiB: MiB would read 0.0025
    matrix = figures.exchange_matrix_figure(analysis.exchange_matrix(measured.exchange, 2),
                                            naming=MEASURED)
    assert matrix.data[0].colorbar.title.text == "KiB"
    assert max(max(r) for r in matrix.data[0].z) == 20.0  # 20,480 bytes each way
    over = figures.exchange_time_figure(analysis.exchange_over_time(measured.exchange),
                                        naming=MEASURED)
    assert over.layout.yaxis.title.text == "KiB"
    load = figures.stage_load_figure(measured.stages, naming=MEASURED)
    # a recording's balance is its own (gloo's waits count as busy exchange and vary from
    # run to run): red exactly when a stage is 15% over the mean, as the title says
    heaviest = float(max(load.data[0].y))
    red = "#c53a32" in load.data[0].marker.color
    assert red == (heaviest > 1.15)
    title = load.layout.title.text
    assert ("red: bottleneck" if red else "busiest within 15% of the mean") in title


def test_measured_ops_table_shows_times_in_ns(ctx: AppContext) -> None:
    ops = render(ctx, "/operations", f"?profile={MEASURED_REL}")[1]
    headers = {c["id"]: c["name"] for t in _find(ops, "DataTable") for c in t.columns}
    assert headers["start"] == "start ns" and headers["ipu"] == "rank"


def test_nearly_empty_tiles_are_drawn_to_their_own_scale() -> None:
    """A profile whose tiles hold ~1% of their capacity (the tutorial sharded inference)
    is drawn to its data, the capacity named in the title, not a flat line at 0."""
    with popviz.open(ROOT / "tutorial_sharded/inference/profile.h5") as profile:
        tm = profile.tile_memory
    fullest = float((tm["total_bytes"] / tm["capacity_bytes"]).max())
    assert fullest < 0.25
    tiles = figures.tile_memory_figure(tm, 0)
    assert tiles.layout.yaxis.range[1] < float(tm["capacity_bytes"].max()) / 1024
    assert "off the scale" in tiles.layout.title.text
    tmap = figures.tile_map_figure(tm, 0)
    assert tmap.data[0].zmax < 100 and f"{tmap.data[0].zmax:g}%" in tmap.layout.title.text
    hist = figures.memory_histogram(tm)
    assert "off the scale" in hist.layout.title.text and not hist.layout.shapes
    totals = figures.ipu_totals_figure(analysis.ipu_totals(tm))
    assert "capacity" not in [d.name for d in totals.data]
    assert "off the scale" in totals.layout.title.text


def test_time_per_sample_never_draws_a_negative_rest(measured: Any, modelled: Any) -> None:
    comp = compare(modelled, measured)
    tps = comp.time_per_sample.set_index("category")
    fig = cf.time_per_sample_figure(comp)
    assert all(x >= 0 for d in fig.data for x in d.x)
    notes = {a.y: a.text for a in fig.layout.annotations}
    b_note = next(t for y, t in notes.items() if y.startswith("B"))
    assert f"{tps['b'].sum():,.4g} µs per sample" in b_note
    if (tps["b"] < 0).any():  # the measured side's events overlap in time
        assert "overlap" in b_note


def test_compare_memory_figures_fit_the_data_not_a_far_capacity(measured: Any,
                                                                 modelled: Any) -> None:
    comp = compare(modelled, measured)
    peak = float(comp.ipus[comp.ipus["metric"] == "peak_bytes"][["a", "b"]].max().max())
    mem = cf.ipu_memory_compare_figure(comp)
    tiles = cf.tile_distribution_figure(comp)
    if peak < 0.25 * float(comp.sides["ipu_capacity_bytes"].max()):
        assert [d.name for d in mem.data] == ["peak"] and "off the scale" in mem.layout.title.text
    if float(comp.tiles["total_bytes"].max()) < 0.25 * float(comp.tiles["capacity_bytes"].max()):
        assert not [d for d in tiles.data if "capacity" in d.name]
        assert "off the scale" in tiles.layout.title.text


def test_measured_ops_page_shows_no_minus_one_for_none(ctx: AppContext) -> None:
    """A host op outside every micro-batch and an op with no peer show blank cells."""
    from popviz_app.pages import operations

    entry = ctx.cache.get(MEASURED_REL)
    with popviz.open(ROOT / MEASURED_REL) as p:
        assert (p.ops["microbatch"] == -1).any() and (p.ops["peer"] == -1).any()
    rows, _, _ = operations.page(entry, "", [], 0, size=200)
    assert rows and all(r["microbatch"] != -1 and r["peer"] != -1 for r in rows)
    assert any(r["microbatch"] is None for r in rows)


def test_tree_of_a_run_recorded_without_flops_reads_unknown(ctx: AppContext) -> None:
    """Every op of the measured run stores 0 FLOPs (a trace recorded without them): the
    tree's hover and its op table say unknown, never 0; a modelled run keeps its numbers."""
    from popviz_app.pages import tree

    tables = [t for t in _find(render(ctx, "/tree", f"?profile={MEASURED_REL}")[1],
                               "DataTable") if t.id == "tree-node-ops"]
    assert tables and tables[0].data
    assert {r["flops"] for r in tables[0].data} == {"unknown"}
    hover = tree.tree(ctx, ctx.cache.get(MEASURED_REL))
    assert {str(c[2]) for c in hover.data[0].customdata} == {"unknown"}
    modelled = [t for t in _find(render(ctx, "/tree", f"?profile={MODELLED_REL}")[1],
                                 "DataTable") if t.id == "tree-node-ops"]
    assert any(isinstance(r["flops"], (int, float)) and r["flops"] > 0
               for r in modelled[0].data)


def test_a_clicked_node_says_its_op_list_is_the_heaviest_few(ctx: AppContext) -> None:
    """The op table under a node holds its NODE_OPS_SHOWN heaviest ops: with more, a line
    says so (the heading counts all of them), and the rows are the heaviest."""
    from popviz_app.pages import tree

    entry = ctx.cache.get(MODELLED_REL)
    panel = html.Div(tree.node_panel(entry, "model"))
    caption = [d for d in _find(panel, "Div")
               if getattr(d, "id", None) == "tree-node-ops-caption"]
    table = next(t for t in _find(panel, "DataTable") if t.id == "tree-node-ops")
    n = len(entry.profile.ops)
    assert n > tree.NODE_OPS_SHOWN and len(table.data) == tree.NODE_OPS_SHOWN
    assert caption and f"{tree.NODE_OPS_SHOWN} heaviest ops of {n:,}" in caption[0].children
    top = entry.profile.ops["cycles"].nlargest(tree.NODE_OPS_SHOWN).min()
    assert min(r["cycles"] for r in table.data) >= top


def test_measured_memory_page_says_what_it_shows_instead_of_tiles(ctx: AppContext) -> None:
    """No per-tile memory in a measured run: the page says so in a measured run's words
    and says what is below (its allocated bytes over time), not IPU terms alone."""
    page = render(ctx, "/memory", f"?profile={MEASURED_REL}")[1]
    said = " ".join(str(c) for m in _find(page, "Div") for c in
                    ([m.children] if isinstance(m.children, str) else []))
    assert "This measured run has no per-tile memory" in said and "IPU" not in said
    assert "Below: the bytes it allocated over time." in said
    assert [g for g in _find(page, "Graph") if g.id == "mem-counters"]


def test_an_op_box_of_a_measured_tree_links_to_its_heaviest_op(ctx: AppContext) -> None:
    """A measured run's ops sit under no module, so an op box offered no link at all: it
    links to its heaviest op on /trace, outlined, in a window around it; a module box
    of a modelled run keeps its module's links and gets no op link."""
    from urllib.parse import parse_qs, urlparse

    from popviz_app.pages import tree

    entry = ctx.cache.get(MEASURED_REL)
    frame = tree.tree_of(entry)
    leaf = next(n for n in frame["id"] if "/" in n and n.split(" (")[0].endswith("conv2d"))
    links = {str(k.id): k.href for k in _find(html.Div(tree.node_panel(entry, leaf)), "Link")}
    assert set(links) == {"tree-to-op"}
    q = {k: v[0] for k, v in parse_qs(urlparse(links["tree-to-op"]).query).items()}
    heaviest = tree.node_ops(entry.profile.ops, leaf).iloc[0]
    assert q["op"] == str(int(heaviest["op_id"]))
    assert float(q["t0"]) <= float(heaviest["start"]) <= float(heaviest["end"]) \
        <= float(q["t1"])
    modelled = ctx.cache.get(MODELLED_REL)
    layer = html.Div(tree.node_panel(modelled, "layer1"))
    assert {str(k.id) for k in _find(layer, "Link")} >= {"tree-to-ops", "tree-to-trace"}
    assert "tree-to-op" not in {str(k.id) for k in _find(layer, "Link")}
