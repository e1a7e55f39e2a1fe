"""Polish found by a browser sweep of `popviz serve`: a flag never wraps in a hint, the
memory-over-time chart starts at 0, the summary's peaks line up with the other blocks,
/compare's counts, picker and verdict read right, /liveness states a range outside the
run readably, a filter error quotes what was typed, and a bump's label keeps off the
peak's star."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from dash import html
from popviz_app import create_app, render
from popviz_app.pages import compare as compare_page
from popviz_app.style import CSS

import popviz
from popviz import analysis
from popviz.analysis.liveness_sections import liveness_layers, phase_bands, section_bumps
from popviz.figures.liveness_sections import liveness_sections_figure
from popviz.figures.memory_counters import allocated_over_time
from popviz.vocab import naming_of
from tests.dash_util import component_text, find_components

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
RESNET = Path(__file__).parent / "fixtures" / "kineto_resnet50_b64.json.gz"
CUDA = "rn50_cuda/profile.h5"
MEASURED = "tutorial_measured_2ranks/profile.h5"
PIPELINE = "rn50_pipeline/profile.h5"


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The served folder of the sweep: the ResNet-50 H100 import and two bundled runs."""
    root = tmp_path_factory.mktemp("served")
    popviz.import_trace([RESNET], root / "rn50_cuda")
    for rel in (MEASURED, PIPELINE):
        (root / rel).parent.mkdir(parents=True)
        shutil.copy(PROFILES / rel, root / rel)
    return create_app(root, vetter=False)


def _page(app: Any, path: str, search: str) -> Any:
    if path == "/compare":  # its router reads the pair from the callback's inputs
        return compare_page.page(app.popviz_context, search)
    return render(app.popviz_context, path, search)[1]


def _by_id(page: Any, kind: str, id_: str) -> Any:
    (found,) = [c for c in find_components(page, kind) if getattr(c, "id", None) == id_]
    return found


def _strings(component: Any) -> list[str]:
    """The text of a tree outside any html.Code (what the browser may wrap anywhere)."""
    if isinstance(component, str):
        return [component]
    if isinstance(component, html.Code):
        return []
    children = getattr(component, "children", None)
    if isinstance(children, (list, tuple)):
        return [s for c in children for s in _strings(c)]
    return [] if children is None else _strings(children)


def test_a_flag_in_the_memory_hint_is_kept_whole(app: Any) -> None:
    """'--memory-snapshot' wrapped after its first '-' (a lone '-' ending a line): a flag
    is in a no-wrap `flag` element, never in running text."""
    page = _page(app, "/memory", f"?profile={CUDA}")
    flags = [c for c in find_components(page, "Code") if "flag" in str(c.className)]
    assert "--memory-snapshot" in [c.children for c in flags]
    assert not [s for s in _strings(page) if "--" in s]
    assert ".flag { white-space: nowrap; }" in CSS


def test_a_cpu_run_is_not_told_to_take_a_cuda_snapshot(app: Any) -> None:
    """The gloo CPU run's memory hint suggested torch.cuda.memory._snapshot(): a CPU run
    has no CUDA allocator to snapshot."""
    text = component_text(_page(app, "/memory", f"?profile={MEASURED}"))
    assert "cuda" not in text.lower() and "CPU allocator" in text


def test_the_tune_page_of_a_measured_run_keeps_its_flag_whole(app: Any) -> None:
    page = _page(app, "/tune", f"?profile={MEASURED}")
    assert "train.py --profile" in [c.children for c in find_components(page, "Code")]
    assert not [s for s in _strings(page) if "--" in s]


def test_a_flag_in_an_advice_is_kept_whole() -> None:
    """Advice names flags too ('--strategy pipelined', 'train.py --batch-size 48')."""
    from popviz_app.pages.summary import flags_whole
    text = "pipeline them (--strategy pipelined, with 8 to fill the pipeline)."
    parts = flags_whole(text)
    assert component_text(html.Li(parts)).replace(" ", "") == text.replace(" ", "")
    assert [c.children for c in find_components(html.Li(parts), "Code")] == ["--strategy"]
    assert not [s for s in _strings(html.Li(parts)) if "--" in s]
    assert flags_whole("no flag - here") == "no flag - here"


def test_memory_over_time_starts_at_zero(app: Any) -> None:
    """The import's curve holds 400 MiB and more all run long: autorange started the axis
    near there (its lowest tick 1,000 MiB), hiding the floor."""
    with popviz.open(app.popviz_context.root / CUDA) as p:
        fig = allocated_over_time(p.liveness, naming_of(dict(p.meta or {})))
    assert fig.layout.yaxis.rangemode == "tozero"
    graph = _by_id(_page(app, "/memory", f"?profile={CUDA}"), "Graph", "mem-counters")
    assert graph.figure.layout.yaxis.rangemode == "tozero"


@pytest.mark.parametrize("rel", [CUDA, MEASURED])
def test_the_peak_liveness_block_lines_up_with_the_others(app: Any, rel: str) -> None:
    """A measured run has no fullest tiles: their empty placeholder was the flex row's
    first child and the row's 14 px gap pushed the peaks right of every other block."""
    page = _page(app, "/summary", f"?profile={rel}")
    (row,) = [d for d in find_components(page, "Div")
              if "row" in str(getattr(d, "className", "")).split()
              and "Peak liveness" in component_text(d)]
    assert all("half" in str(getattr(c, "className", "")) for c in row.children), \
        row.children


def test_compare_cards_count_one_rank_as_one(app: Any) -> None:
    page = _page(app, "/compare", f"?profile={PIPELINE}&other={CUDA}")
    b = component_text(_by_id(page, "Div", "compare-side-B"))
    assert "samples/s on 1 rank" in b and "1 ranks" not in b and "rank(s)" not in b
    a = component_text(_by_id(page, "Div", "compare-side-A"))
    assert "samples/s on 4 IPUs" in a and "4 IPUs x 1 replica" in a


def test_compare_says_not_like_for_like_once(app: Any) -> None:
    """The banner lists the terms; the bold headline said 'Not like for like: A and B
    differ in ...' again under it."""
    page = _page(app, "/compare", f"?profile={PIPELINE}&other={CUDA}")
    text = component_text(_by_id(page, "Div", "compare-verdict"))
    assert text.count("Not like for like") == 1
    assert "kind modelled vs measured" in text and "no winner" in text


def test_the_judge_picker_shows_its_choice_whole(app: Any) -> None:
    """'total throughput (the same work in less time)' is 364 px at the picker's 16 px
    font, in a 330 px box with its arrow: cut to 'total throughput (the same work…'.
    About 8.1 px a character and 50 px of padding and arrow."""
    page = _page(app, "/compare", f"?profile={PIPELINE}&other={CUDA}")
    picker = _by_id(page, "Dropdown", "compare-judge")
    assert picker.options == compare_page.JUDGE_OPTIONS
    for option in picker.options:
        assert len(option["label"]) * 8.1 + 50 <= picker.style["width"], option
        assert option.get("title")  # what the question means, on hover


@pytest.mark.parametrize(("t0", "t1"), [("9e99", "1e100"), ("-1e100", "-9e99")])
def test_a_liveness_range_outside_the_run_is_said_readably(app: Any, t0: str,
                                                            t1: str) -> None:
    """It printed 'No liveness step in 8,999,999,999,...' (100 digits and more)."""
    cb = app.popviz_callbacks["liveness.from_trace"]
    *_, note = cb(None, f"?profile={PIPELINE}&t0={t0}&t1={t1}")
    assert "outside the run (0 to " in note and "showing every step" in note
    assert len(note) < 120, note  # not 100 digits of 9e99
    with popviz.open(app.popviz_context.root / PIPELINE) as p:
        end = float(p.trace["end"].max())
    assert f"{end:,.0f} cycles" in note


def test_a_liveness_range_reaching_past_the_run_is_clipped_to_it(app: Any) -> None:
    cb = app.popviz_callbacks["liveness.from_trace"]
    _fig, ranges, note = cb(None, f"?profile={PIPELINE}&t0=-1e30&t1=1e30")
    with popviz.open(app.popviz_context.root / PIPELINE) as p:
        end = float(p.trace["end"].max())
    assert f"0 to {end:,.0f} cycles" in note and "1,000,000" not in note
    assert ranges  # the whole run: every device has its steps


@pytest.mark.parametrize(("query", "quoted"), [
    ("{cycles} s> >>", "'>>>'"),  # what DataTable sends for >>> typed in the cell
    ("{cycles} s< <", "'<<'"),
    ("{cycles} s>= =x", "'>==x'"),
    ("{cycles} s> lots", "'lots'"),  # an operator then a word: the word is not a number
])
def test_a_filter_error_quotes_what_was_typed(query: str, quoted: str) -> None:
    errors: list[str] = []
    analysis.filter_table(pd.DataFrame({"cycles": [1, 2]}), query, errors=errors)
    assert len(errors) == 1 and f"holds numbers; {quoted} is not one" in errors[0], errors


def _bump_on_star() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One training step whose activations peak at step 10, the peak of all (no
    temporaries): the bump's triangle sits under the star."""
    rise = [float(min(s, 20 - s)) for s in range(21)]
    live = pd.DataFrame({"ipu": 0, "step": range(21), "always_live_bytes": 1e6,
                         "not_always_live_bytes": [1e6 * r for r in rise],
                         "phase": ["forward"] * 11 + ["backward"] * 10})
    layers = liveness_layers(live, pd.DataFrame())
    bands = phase_bands(live, pd.DataFrame())
    return layers, bands, section_bumps(layers, bands)


@pytest.mark.parametrize("pixels", [1000, 200])
def test_a_bump_label_keeps_off_the_peak_star_on_it(pixels: int) -> None:
    """A bump whose top is the peak (rn50_cuda's step 492, the measured tutorial's rank 0
    step 128): the label beside the triangle ('middle left') began 6 px from the
    triangle's middle, inside the 14 px star over it. It is a note past both markers."""
    layers, bands, bumps = _bump_on_star()
    fig = liveness_sections_figure(layers, bands, bumps, pixels=pixels)
    (bump,) = [t for t in fig.data if t.name == "section bump"]
    (star,) = [t for t in fig.data if t.name == "peak"]
    assert list(bump.x) == list(star.x) == [10]
    assert list(bump.text) == [""]  # not drawn beside the triangle
    (note,) = [a for a in fig.layout.annotations if a.name == "bump-label"]
    assert note.text == "F+B" and note.x == 10 and note.showarrow is False
    # its near edge at least the star's half width and its rim (8 px) from the middle
    assert (note.xanchor, note.xshift <= -10) == ("right", True) or \
        (note.xanchor, note.xshift >= 10) == ("left", True)


def test_a_bump_on_the_star_at_the_panels_left_edge_is_labelled_to_its_right() -> None:
    layers, bands, bumps = _bump_on_star()
    fig = liveness_sections_figure(layers, bands, bumps, start=9.5, end=30)
    (note,) = [a for a in fig.layout.annotations if a.name == "bump-label"]
    assert note.xanchor == "left" and note.xshift >= 10


def test_the_liveness_hint_says_what_a_cpu_trace_leaves_out(app: Any) -> None:
    """A CPU rank's always-live is 0 B: its trace's memory events count only what was
    allocated after the profiler started. The hint says so there, and on a GPU import
    (whose allocator totals include the weights) names what always-live holds."""
    with popviz.open(PROFILES / MEASURED) as p:
        assert int(p.liveness.loc[p.liveness["ipu"] == 0, "always_live_bytes"].max()) == 0
    cpu = component_text(_page(app, "/liveness", f"?profile={MEASURED}"))
    assert "count only what was allocated after the profiler started" in cpu
    assert "(its parameters, gradients and optimiser state)" not in cpu
    gpu = component_text(_page(app, "/liveness", f"?profile={CUDA}"))
    assert "(its parameters, gradients and optimiser state)" in gpu
    assert "after the profiler started" not in gpu


def test_sizes_keep_one_unit_a_column(app: Any) -> None:
    """The summary's peaks mixed units down a column ('827.0 KiB' under '17.1 MiB', sorted
    as text); /compare's metrics said 'bytes' beside '510.5 MiB'."""
    peaks = _by_id(_page(app, "/summary", f"?profile={PIPELINE}"), "DataTable",
                   "peak-liveness")
    columns = {c["id"]: c for c in peaks.columns}
    for name in ("peak MiB", "always-live MiB", "not-always-live MiB"):
        assert columns[name]["type"] == "numeric"
        assert columns[name]["format"]["specifier"] == ",.1f"  # 457.0 beside 510.5
    with popviz.open(app.popviz_context.root / PIPELINE) as p:
        peak = p.liveness.eval("always_live_bytes + not_always_live_bytes").max() / 2**20
    assert max(r["peak MiB"] for r in peaks.data) == pytest.approx(peak, abs=0.05)
    page = _page(app, "/compare", f"?profile={PIPELINE}&other={CUDA}")
    metrics = _by_id(page, "DataTable", "compare-metrics")
    sizes = [r for r in metrics.data if r["metric"] == "peak bytes max"]
    assert sizes and sizes[0]["unit"] == "" and sizes[0]["A"].endswith("MiB")


def test_compare_metrics_are_named_in_the_sides_words(app: Any) -> None:
    """Two ranks read 'throughput_per_ipu', 'total_ipus', 'oom_tiles' (a GPU and a CPU
    run have no tiles): named per device in the sides' words, the JSON unchanged."""
    page = _page(app, "/compare", f"?profile={CUDA}&other={MEASURED}")
    names = [r["metric"] for r in _by_id(page, "DataTable", "compare-metrics").data]
    assert {"throughput per rank", "total ranks", "inter rank bytes"} <= set(names)
    assert not [n for n in names if "ipu" in n or "tile" in n or "_" in n]
    ipus = _page(app, "/compare", f"?profile={PIPELINE}&other={PIPELINE}")
    names = [r["metric"] for r in _by_id(ipus, "DataTable", "compare-metrics").data]
    assert "throughput per IPU" in names and "oom tiles" in names


def test_the_trace_says_its_window_is_not_the_step(app: Any) -> None:
    """/trace's whole run of an import (50.4 ms: time before and after its step) gave
    23.7% idle where /summary, over the 48.8 ms step, gave 24.5%: the head says which."""
    from popviz.metrics import step_time

    head = _by_id(_page(app, "/trace", f"?profile={CUDA}"), "Div", "trace-stats-head")
    with popviz.open(app.popviz_context.root / CUDA) as p:
        step = step_time(p.trace)
    assert f"count over the step ({step:,.0f} ns)" in component_text(head)
    modelled = _by_id(_page(app, "/trace", f"?profile={PIPELINE}"), "Div", "trace-stats-head")
    assert "count over the step" not in component_text(modelled)


def test_a_measured_stage_table_shows_whole_ns(app: Any) -> None:
    """Means over recorded steps read '7,061,044.5' ns: whole ns on a measured run."""
    table = _by_id(_page(app, "/stages", f"?profile={MEASURED}"), "DataTable",
                   "stages-table")
    times = [c["id"] for c in table.columns if "_cycles" in c["id"]]
    assert "idle_cycles" in times and "forward_cycles_per_microbatch" in times
    assert all(isinstance(r[c], int) for r in table.data for c in times)


def test_a_compare_card_never_shows_an_empty_value(tmp_path: Path) -> None:
    """The interleaved import's stages come from its annotations and name no split: its
    card read 'splits · recomputation off'."""
    popviz.import_trace([RESNET.parent / "kineto_pipelining_interleaved_1rank.json.gz"],
                        tmp_path / "interleaved")
    served = create_app(tmp_path, vetter=False)
    page = compare_page.page(served.popviz_context,
                             "?profile=interleaved/profile.h5&other=interleaved/profile.h5")
    text = component_text(_by_id(page, "Div", "compare-side-A"))
    # the layout differences' word for it ("splits: unknown vs none")
    assert "splits unknown ·" in text and "splits ·" not in text


def test_a_compare_link_to_a_missing_profile_says_so(app: Any) -> None:
    """`other=nope.h5&judge=bogus` showed only 'Pick two profiles': the B picker had no
    option for nope.h5 and cleared it. It keeps it, marked, and the page says what is
    wrong with the link."""
    page = _page(app, "/compare", f"?profile={PIPELINE}&other=nope.h5&judge=bogus")
    picker = _by_id(page, "Dropdown", "compare-b")
    assert picker.value == "nope.h5"
    assert {"label": "nope.h5 (not served)", "value": "nope.h5"} in picker.options
    text = component_text(_by_id(page, "Div", "compare-body"))
    assert "no profile 'nope.h5'" in text and "judge='bogus' is not a question" in text
    assert "Pick two profiles" not in text


def test_a_compare_link_by_folder_name_picks_the_listed_profile(app: Any) -> None:
    """Every page takes a profile's folder (`?profile=rn50_pipeline`); /compare showed both
    sides as "rn50_pipeline (not served)" while comparing them. The pickers now hold the
    listed profile.h5 of that folder."""
    folder = PIPELINE.split("/")[0]
    page = _page(app, "/compare", f"?profile={folder}&other={MEASURED.split('/')[0]}")
    a, b = _by_id(page, "Dropdown", "compare-a"), _by_id(page, "Dropdown", "compare-b")
    assert (a.value, b.value) == (PIPELINE, MEASURED)
    labels = [o["label"] for o in a.options]
    assert not any("not served" in label for label in labels)
    assert "no profile" not in component_text(_by_id(page, "Div", "compare-body"))


@pytest.mark.parametrize(("rel", "offered"), [(CUDA, False), (MEASURED, False),
                                              (PIPELINE, True)])
def test_variables_csv_only_where_there_are_variables(app: Any, rel: str,
                                                      offered: bool) -> None:
    """An import keeps no variables: its /liveness offered a variables.csv of a header."""
    links = [c.children for c in find_components(_page(app, "/liveness", f"?profile={rel}"),
                                                 "A")]
    assert "liveness.csv" in links
    assert ("variables.csv" in links) == offered
