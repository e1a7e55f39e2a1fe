"""The BSP view of a superstep (popviz.analysis.superstep, popviz.figures.superstep and its
/trace wiring) on a bundled modelled profile. Every expectation is computed from the
profile's own tables: the profiles are regenerated."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from dash.exceptions import PreventUpdate
from popviz_app import create_app

from popviz.analysis.superstep import (
    KINDS,
    SuperstepError,
    bucketed,
    has_tiles,
    per_tile,
    superstep_at,
    superstep_view,
)
from popviz.analysis.trace_detail import pass_ops
from popviz.figures.superstep import COLS, ROWS, superstep_figure
from popviz.format import reader
from tests.dash_util import component_text, find_components

ROOT = Path(__file__).resolve().parents[1] / "profiles"
REL = "rn50_pipeline/profile.h5"
MEASURED = "tutorial_measured_2ranks/profile.h5"


@pytest.fixture(scope="module")
def profile() -> Any:
    if not (ROOT / REL).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    prof = reader.open(ROOT / REL)
    yield prof
    prof.close()


def _tiles(profile: Any) -> int:
    return int(profile.meta["target"]["tiles_per_ipu"])


def _cases(profile: Any) -> list[tuple[int, int]]:
    """The busiest superstep of each IPU (most compute events), the first and the last."""
    tr = profile.trace
    comp = tr[tr["kind"] == "compute"]
    out = []
    for ipu, grp in comp.groupby("ipu"):
        out.append((int(ipu), int(grp.groupby("superstep").size().idxmax())))
    out += [(0, int(tr["superstep"].min())), (int(tr["ipu"].max()), int(tr["superstep"].max()))]
    return out


def test_every_tile_accounts_for_the_whole_superstep(profile: Any) -> None:
    tr = profile.trace
    for ipu, k in _cases(profile):
        ev = tr[(tr["ipu"] == ipu) & (tr["superstep"] == k)]
        length = float(ev["end"].max() - ev["start"].min())
        view = superstep_view(tr, profile.ops, _tiles(profile), ipu, k)
        assert view.length == length
        totals = per_tile(view)
        assert len(totals) == _tiles(profile)
        np.testing.assert_allclose(totals[list(KINDS)].sum(axis=1), length, rtol=1e-9)
        # the waits and the sync are sync on every tile; exchange and host copies exchange
        dur = (ev["end"] - ev["start"]).astype(float)
        waits = dur[ev["kind"].isin(["sync", "idle"])].sum()
        np.testing.assert_allclose(totals["sync"], waits, rtol=1e-9)
        outside = dur[ev["kind"].isin(["exchange", "host_io"])].sum()
        assert (totals["exchange"] >= outside - 1e-6).all()
        busy = dur[ev["kind"] == "compute"].sum()
        np.testing.assert_allclose(totals[["compute", "idle"]].sum(axis=1)
                                   + totals["exchange"] - outside, busy, rtol=1e-9)


def test_each_op_runs_on_its_tiles_used_and_the_rest_idle(profile: Any) -> None:
    tr, ops = profile.trace, profile.ops.set_index("op_id")
    ipu, k = _cases(profile)[0]
    view = superstep_view(tr, profile.ops, _tiles(profile), ipu, k)
    assert len(view.ops) > 10
    rects = view.rects
    comp = tr[(tr["ipu"] == ipu) & (tr["superstep"] == k) & (tr["kind"] == "compute")]
    pass_cycles = profile.ops.groupby(["stage", "pass"])["cycles"].sum()
    for row in view.ops.rename(columns={"pass": "pass_"}).itertuples(index=False):
        inside = rects[(rects["start"] >= row.start - 1e-6) & (rects["end"] <= row.end + 1e-6)]
        work = inside[inside["kind"].isin(["compute", "exchange"])]
        tiles = np.zeros(view.tiles, dtype=bool)
        for a, b in zip(work["tile0"], work["tile1"], strict=True):
            tiles[a:b] = True
        assert int(tiles.sum()) == int(ops.loc[row.op_id, "tiles_used"]), row.op
        # on its tiles the op's whole duration is work; off them, idle
        idle = inside[inside["kind"] == "idle"]
        dur = row.end - row.start
        np.testing.assert_allclose(((idle["tile1"] - idle["tile0"]) * (idle["end"]
                                    - idle["start"])).sum(), (view.tiles - tiles.sum()) * dur)
        # the plan's internal exchange, scaled as the op is to its pass's event
        event = comp[(comp["start"] <= row.start + 1e-6) & (comp["end"] >= row.end - 1e-6)]
        stage = int(event["stage"].iloc[0])
        scale = float(event["end"].iloc[0] - event["start"].iloc[0]) / float(
            pass_cycles[(stage, row.pass_)])
        want = min(float(ops.loc[row.op_id, "exchange_cycles_internal"]) * scale, dur)
        ex = work[work["kind"] == "exchange"]
        got = ((ex["end"] - ex["start"]) * (ex["tile1"] - ex["tile0"])).sum() / max(
            tiles.sum(), 1)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_buckets_keep_every_share(profile: Any) -> None:
    ipu, k = _cases(profile)[0]
    view = superstep_view(profile.trace, profile.ops, _tiles(profile), ipu, k)
    grid = bucketed(view, rows=64, cols=300)
    tiles = _tiles(profile)
    assert grid.share.shape == (len(KINDS), -(-tiles // -(-tiles // 64)), 300)
    np.testing.assert_allclose(grid.share.sum(axis=0), 1.0, atol=1e-9)
    # each kind's share of the whole box, bucketed or not (weights: tiles per row)
    rows = np.diff(np.append(grid.row_tiles, tiles))
    from_grid = (grid.share.mean(axis=2) * rows).sum(axis=1) / tiles
    from_tiles = per_tile(view)[list(KINDS)].sum().to_numpy() / (tiles * view.length)
    np.testing.assert_allclose(from_grid, from_tiles, atol=1e-9)
    assert set(grid.op[grid.op != ""]) <= set(view.ops["op"])


def test_figure_is_quick_and_says_what_it_drew(profile: Any) -> None:
    tr = profile.trace
    templates = pass_ops(profile.ops)
    ipu, k = _cases(profile)[0]
    t0 = time.perf_counter()
    view = superstep_view(tr, profile.ops, _tiles(profile), ipu, k, templates)
    fig = superstep_figure(view)
    took = time.perf_counter() - t0
    assert took < 1.5, took  # ~0.25 s alone; the machine is shared in CI
    meta = fig.layout.meta
    assert (meta["ipu"], meta["superstep"], meta["range"]) == (ipu, k, [view.start, view.end])
    heat = fig.data[0]
    assert np.asarray(heat.z).shape == (meta["rows"], meta["cols"])
    assert meta["rows"] * meta["tiles_per_row"] >= _tiles(profile)
    totals = per_tile(view)[list(KINDS)].sum() / (_tiles(profile) * view.length)
    for kind in KINDS:
        assert meta["share"][kind] == pytest.approx(totals[kind], abs=2e-3)
    assert len(fig.to_json()) < 1_000_000  # sent to the browser on every pick


def test_docs_say_the_buckets() -> None:
    docs = " ".join((Path(__file__).parents[1] / "docs" / "app.md").read_text().split())
    assert f"are {ROWS} rows of {-(-1472 // ROWS)})" in docs
    assert f"cycles across ({COLS} buckets)" in docs


def test_superstep_at_and_bad_requests(profile: Any) -> None:
    tr = profile.trace
    comp = tr[tr["kind"] == "compute"].iloc[len(tr) // 10]
    assert superstep_at(tr, int(comp["ipu"]), float(comp["end"])) == int(comp["superstep"])
    assert superstep_at(tr, int(comp["ipu"]), float(comp["start"]) + 1) == int(comp["superstep"])
    with pytest.raises(SuperstepError, match="no superstep"):
        superstep_view(tr, profile.ops, _tiles(profile), 0, int(tr["superstep"].max()) + 5)
    with pytest.raises(SuperstepError, match="no event"):
        superstep_at(tr, 0, float(tr["end"].max()) + 10)
    with pytest.raises(SuperstepError, match="tiles"):
        superstep_view(tr, profile.ops, 0, 0, 1)
    assert has_tiles(profile.ops, measured=False)
    assert not has_tiles(profile.ops, measured=True)
    assert not has_tiles(pd.DataFrame(), measured=False)


def test_the_click_reads_the_bars_it_is_given(profile: Any) -> None:
    """app/trace_bsp.PICK reads a pass bar's IPU and end at customdata[5] and [4] (9
    fields, the true start last) and an op bar's at [5] and [6] (10 fields, the true start
    last): a change to the trace's bars must change it too. The end is the bar's own, not
    the drawn part's (a bar is drawn over its part in the window only)."""
    from popviz.figures.lod import TraceIndex
    from popviz.figures.trace_lanes import trace_lanes_figure

    tr = profile.trace
    first = tr[tr["kind"] == "compute"].iloc[0]
    # a window that cuts the first pass: its bar is drawn from lo, its customdata whole
    lo = float(first["start"]) + 0.25 * float(first["end"] - first["start"])
    hi = float(first["end"])
    fig = trace_lanes_figure(TraceIndex(tr), lo, hi, templates=pass_ops(profile.ops))
    seen = set()
    for bar in fig.data:
        if bar.type != "bar" or bar.customdata is None:
            continue
        custom = np.asarray(bar.customdata, dtype=object)
        base = np.asarray(bar.base, dtype=float)
        ends = base + np.asarray(bar.x, dtype=float)
        if bar.name.startswith("compute"):
            assert custom.shape[1] == 9
            end, start = custom[:, 4].astype(float), custom[:, 8].astype(float)
            seen.add("pass")
        elif bar.name.startswith("op: "):
            assert custom.shape[1] == 10
            end, start = custom[:, 6].astype(float), custom[:, 9].astype(float)
            seen.add("op")
        else:
            continue
        np.testing.assert_allclose(np.minimum(end, hi), ends)
        np.testing.assert_allclose(np.maximum(start, lo), base)
        assert set(custom[:, 5].astype(int)) <= set(tr["ipu"].astype(int))
    assert seen == {"pass", "op"}
    from popviz_app.trace_bsp import PICK

    assert "c.length === 9 ? 4 : (c.length === 10 ? 6 : -1)" in PICK and "c[5]" in PICK


def test_trace_page_wiring(profile: Any) -> None:
    app = create_app(ROOT, vetter=False)
    cb = app.popviz_callbacks
    tr = profile.trace
    comp = tr[tr["kind"] == "compute"].iloc[len(tr) // 7]
    search = f"?profile={REL}"
    ipu, step = cb["trace.bsp_pick"]({"ipu": int(comp["ipu"]), "t": float(comp["end"])}, search)
    assert (ipu, step) == (int(comp["ipu"]), int(comp["superstep"]))
    view, status = cb["trace.bsp_show"](ipu, step, search)
    fig = view.figure
    assert fig.layout.meta["superstep"] == step and fig.layout.meta["ipu"] == ipu
    assert status.startswith(f"IPU {ipu}, superstep {step}: ")
    _, status = cb["trace.bsp_show"](ipu, int(tr["superstep"].max()) + 3, search)
    assert "has no superstep" in status
    from popviz_app import trace_bsp

    shown = trace_bsp.section(app.popviz_context.cache.get(REL))  # an IPU plan's: drawn
    assert getattr(shown, "style", None) is None
    assert "BSP view of a superstep" in component_text(shown)
    if (ROOT / MEASURED).exists():
        from popviz_app.pages import trace as page

        # a measured run has no BSP supersteps on tiles: no section to speak of them
        entry = app.popviz_context.cache.get(MEASURED)
        layout = page.layout(app.popviz_context, entry)
        bsp = [c for c in find_components(layout, "Div")
               if getattr(c, "id", None) == "trace-bsp"]
        assert len(bsp) == 1 and getattr(bsp[0], "style", None) == {"display": "none"}
        assert component_text(bsp[0]).strip() == ""
        text = component_text(layout)
        assert "BSP" not in text and "superstep" not in text
        with pytest.raises(PreventUpdate):
            cb["trace.bsp_pick"]({"ipu": 0, "t": 1e5}, f"?profile={MEASURED}")


def test_a_modelled_profile_without_tiles_says_so(tmp_path: Path) -> None:
    """A synthetic profile (no tiles_used, no supersteps): the page says why, no view."""
    from popviz_app.pages import trace as page

    from popviz.format import write_report
    from tooling.testing.synthetic import synthetic_report

    write_report(synthetic_report(events=300, steps=30, model="small"), tmp_path / "s.h5")
    app = create_app(tmp_path, vetter=False)
    entry = app.popviz_context.cache.get("s.h5")
    text = component_text(page.layout(app.popviz_context, entry))
    assert "needs each op's tiles and the trace's supersteps, which this profile does not " \
        "have" in text
    with pytest.raises(PreventUpdate):
        app.popviz_callbacks["trace.bsp_show"](0, 1, "?profile=s.h5")
    with pytest.raises(PreventUpdate):
        app.popviz_callbacks["trace.bsp_pick"]({"ipu": 0, "t": 10.0}, "?profile=s.h5")


def test_op_hover_gives_the_duration_not_the_end(profile: Any) -> None:
    """Issue 31: the op lane's hover read %{x}, which for a horizontal bar with a base is
    where the bar ends; the duration is carried in the bar's own data."""
    tr = profile.trace
    ipu, k = _cases(profile)[0]
    view = superstep_view(tr, profile.ops, _tiles(profile), ipu, k, pass_ops(profile.ops))
    bars = [t for t in superstep_figure(view).data if str(t.name).startswith("op: ")]
    assert bars
    for bar in bars:
        assert "%{x" not in bar.hovertemplate
        custom = np.asarray(bar.customdata)
        duration = custom[:, 12].astype(float)
        assert duration == pytest.approx(np.asarray(bar.x, dtype=float), abs=1)
        assert (custom[:, 8].astype(float) - np.asarray(bar.base, dtype=float)) == \
            pytest.approx(duration, abs=1)
