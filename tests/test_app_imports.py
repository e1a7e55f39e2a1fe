"""The app on imported H100 traces: a liveness click reports the curve's own bytes and
where they come from, since an import has no per-variable data (never "0 variables, 0 B");
an operations filter error names columns as the headers do (ns, rank)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from popviz_app import create_app, render

import popviz
from popviz.figures.style import fmt_bytes
from tests.dash_util import component_text

FIXTURES = Path(__file__).parent / "fixtures"
PIPELINE = FIXTURES / "kineto_pipelining_interleaved_1rank.json.gz"
RESNET = FIXTURES / "kineto_resnet50_b64.json.gz"
SNAPSHOT = FIXTURES / "memsnap_resnet50_b32.pickle.gz"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    top = tmp_path_factory.mktemp("imports")
    popviz.import_trace([PIPELINE], top / "fx")
    popviz.import_trace([RESNET], top / "rn", memory_snapshot=SNAPSHOT)
    return top


@pytest.mark.parametrize(("rel", "source"), [
    ("fx/profile.h5", "the trace's memory events"),
    ("rn/profile.h5", "the CUDA memory snapshot's allocations")])
def test_a_click_on_an_import_gives_the_curves_bytes(root: Path, rel: str,
                                                     source: str) -> None:
    with popviz.open(root / rel) as p:
        live = p.liveness
        assert p.variables.empty  # the premise: no per-variable data in an import
    peak = live.loc[live["not_always_live_bytes"].idxmax()]
    assert peak["not_always_live_bytes"] > 0
    app: Any = create_app(root)
    step, ipu = int(peak["step"]), int(peak["ipu"])
    head, box = app.popviz_callbacks["liveness.click"](
        {"points": [{"x": step, "customdata": ["", "", 0, ipu]}]}, f"?profile={rel}")
    assert head.startswith(f"rank {ipu}, step {step}: ")
    assert fmt_bytes(peak["not_always_live_bytes"]) in head and source in head
    assert "no per-variable data" in head and "0 B" not in head
    assert box == []  # no empty table with IPU-worded headers


def test_the_opening_heading_is_the_peak_step_of_the_curve(root: Path) -> None:
    with popviz.open(root / "fx/profile.h5") as p:
        live = p.liveness
    peak = live.loc[live["not_always_live_bytes"].idxmax()]
    app: Any = create_app(root)
    text = component_text(render(app.popviz_context, "/liveness", "?profile=fx/profile.h5")[1])
    assert f"step {int(peak['step'])}: {fmt_bytes(peak['not_always_live_bytes'])} " \
        "not-always-live, from the trace's memory events" in text
    assert "0 not-always-live variables" not in text and "stashed micro-batches" not in text
    fig = app.popviz_callbacks["liveness.zoom"]({"xaxis.autorange": True},
                                                "?profile=fx/profile.h5")
    assert "no per-variable data" in fig.layout.title.text
    assert "list the variables" not in fig.layout.title.text


def test_a_filter_error_names_the_column_as_its_header(root: Path) -> None:
    app: Any = create_app(root)
    _, _, note = app.popviz_callbacks["operations.refresh"](
        0, 25, [], "{cycles} s= fast", "?profile=rn/profile.h5")
    assert "filter not understood, ignored: 'ns' holds numbers; 'fast' is not one" in note


def test_the_program_tree_of_an_import_says_what_its_widths_are_and_what_is_unknown(
        root: Path) -> None:
    """An import's op cost is its kernels' GPU time; bytes written are not in the trace
    and these traces were recorded without FLOPs, so both read 'unknown', never 0."""
    app: Any = create_app(root)
    text = component_text(render(app.popviz_context, "/tree", "?profile=rn/profile.h5")[1])
    assert "measured GPU time (ns) of each op's kernels" in text and "host time" not in text
    # one stage, no recomputation: the words say what this run has, not a pipeline's
    assert "over every pass (forward, backward, optimiser), coloured by stage." in text
    assert "several stages" not in text and "recompute" not in text
    stages = json.dumps(render(app.popviz_context, "/stages", "?profile=rn/profile.h5")[1]
                        .to_plotly_json(), default=str)
    assert "one stage, on rank 0" in stages and "they run in turn" not in stages
    with popviz.open(root / "rn/profile.h5") as p:
        ops = p.ops
    assert "bytes_written" not in ops.columns and not (ops["flops"] > 0).any()  # premise
    panel, _, _ = app.popviz_callbacks["tree.pick"]({"points": [{"id": "model"}]}, "model",
                                                    "?profile=rn/profile.h5")
    head = " ".join(component_text(c) for c in panel)
    assert "unknown FLOPs, unknown written, largest temporary unknown" in head
    assert "0 FLOPs" not in head and "0 B" not in head
