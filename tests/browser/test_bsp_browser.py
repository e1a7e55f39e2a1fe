"""The BSP view of a superstep on /trace through `popviz serve` (waitress): a click on a
compute bar shows that superstep tile by tile, a typed superstep another one, and no
callback request carries more than a few numbers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

import popviz
from popviz.analysis.superstep import KINDS, per_tile, superstep_view

from .conftest import SCREENSHOTS
from .test_app_browser import _open

pytestmark = pytest.mark.browser

MODELLED = "rn50_pipeline/profile.h5"
MEASURED = "tutorial_measured_2ranks/profile.h5"
MAX_CALLBACK_BODY = 16 * 1024  # ids and numbers, never a figure

# the centre (page pixels) of the widest compute bar drawn, and its IPU and end
WIDEST_COMPUTE_BAR = """() => {
    const gd = document.querySelector('#trace-graph .js-plotly-plot');
    const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
    const box = gd.getBoundingClientRect();
    let best = null;
    gd.data.forEach((tr, i) => {
        if (tr.type !== 'bar' || !String(tr.name).startsWith('compute')) { return; }
        (gd.calcdata[i] || []).forEach((pt, j) => {
            const c = tr.customdata[j];
            const x0 = Math.max(pt.s0, xa.range[0]), x1 = Math.min(pt.s1, xa.range[1]);
            if (x1 - x0 > 0 && (!best || x1 - x0 > best.w)) {
                best = {w: x1 - x0, x: box.left + xa._offset + xa.l2p((x0 + x1) / 2),
                        y: box.top + ya._offset + ya.l2p(pt.p), ipu: Number(c[5]),
                        end: Number(c[4])};
            }
        });
    });
    return best;
}"""
TRACE_DRAWN = ("() => { const g = document.querySelector('#trace-graph .js-plotly-plot');"
               " return !!(g && g.calcdata); }")
# counts the clicks Plotly reports on the trace
CLICKS_SEEN = """() => {
    const gd = document.querySelector('#trace-graph .js-plotly-plot');
    window.popvizClicks = 0;
    gd.on('plotly_click', () => { window.popvizClicks += 1; });
}"""
META = "() => document.querySelector('#trace-bsp-graph .js-plotly-plot').layout.meta"


def _shown(page: Any, superstep: int) -> None:
    page.wait_for_function(
        "k => { const g = document.querySelector('#trace-bsp-graph .js-plotly-plot');"
        " return g && g.layout.meta && g.layout.meta.superstep === k && g.calcdata; }",
        arg=superstep, timeout=30_000)


def _click_widest_compute_bar(page: Any) -> dict[str, Any]:
    """Click the widest compute bar; return its centre, IPU and end. A click that Plotly
    never saw (the page still laying out on a loaded machine moved the bar under the
    pointer) is made again; one that Plotly saw must show its superstep."""
    page.evaluate(CLICKS_SEEN)
    for _ in range(3):
        bar = page.evaluate(WIDEST_COMPUTE_BAR)
        assert bar, "no compute bar drawn in the opening window"
        page.mouse.move(bar["x"], bar["y"])
        page.mouse.click(bar["x"], bar["y"])
        try:
            page.wait_for_function("() => window.popvizClicks > 0", timeout=5_000)
            return bar
        except PlaywrightTimeout:
            continue
    pytest.fail("three clicks on the widest compute bar and Plotly saw none")


def _expected(profile: Any, ipu: int, k: int) -> dict[str, float]:
    view = superstep_view(profile.trace, profile.ops,
                          int(profile.meta["target"]["tiles_per_ipu"]), ipu, k)
    totals = per_tile(view)[list(KINDS)].sum() / (view.tiles * view.length)
    return {kind: float(totals[kind]) for kind in KINDS}


def test_click_a_compute_bar_for_its_superstep(browser_context: Any, base_url: str,
                                               served: Path) -> None:
    if not (served / MODELLED).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    page, errors = _open(browser_context, f"{base_url}/trace?profile={quote(MODELLED)}")
    big: list[str] = []

    def check(request: Any) -> None:
        size = len(request.post_data_buffer or b"")
        if size > MAX_CALLBACK_BODY:
            big.append(f"{request.url} ({size:,} B)")

    page.on("request", check)
    page.wait_for_function(TRACE_DRAWN, timeout=90_000)  # the profile may be being vetted
    bar = _click_widest_compute_bar(page)
    with popviz.open(served / MODELLED) as profile:
        tr = profile.trace
        hit = tr[(tr["ipu"] == bar["ipu"]) & (tr["kind"] == "compute")
                 & (np.abs(tr["end"] - bar["end"]) < 0.5)]
        assert len(hit) == 1
        k = int(hit["superstep"].iloc[0])
        _shown(page, k)
        meta = page.evaluate(META)
        assert (meta["ipu"], meta["superstep"]) == (bar["ipu"], k)
        ev = tr[(tr["ipu"] == bar["ipu"]) & (tr["superstep"] == k)]
        assert meta["range"] == [float(ev["start"].min()), float(ev["end"].max())]
        want = _expected(profile, bar["ipu"], k)
        for kind in KINDS:
            assert meta["share"][kind] == pytest.approx(want[kind], abs=2e-3)
        status = page.inner_text("#trace-bsp-status")
        assert status.startswith(f"IPU {bar['ipu']}, superstep {k}: ")
        assert page.input_value("#trace-bsp-step") == str(k)
        # hover a cell a third of the way across: its tiles, time, shares and op
        page.locator("#trace-bsp-graph").scroll_into_view_if_needed()
        strip = page.locator("#trace-bsp-graph .xy .nsewdrag").first.bounding_box()
        page.mouse.move(strip["x"] + strip["width"] / 3, strip["y"] + strip["height"] / 2)
        tip = page.locator("#trace-bsp-graph .hoverlayer .hovertext").first
        tip.wait_for(timeout=10_000)
        text = tip.text_content() or ""  # SVG: no inner_text
        assert re.search(r"the \d+ tiles around tile [\d,]+ · around [\d,]+ cycles", text), \
            text
        assert re.search(r"(compute|exchange|sync|idle) \d+%", text), text
        assert "op: " in text, text  # a third of the way in, an op is running
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("#trace-bsp").screenshot(path=str(SCREENSHOTS / "trace_bsp_click.png"))
        # another superstep typed in (Enter: the input is debounced)
        other = int(tr.loc[tr["ipu"] == bar["ipu"], "superstep"].max())
        page.fill("#trace-bsp-step", str(other))
        page.press("#trace-bsp-step", "Enter")
        _shown(page, other)
        meta = page.evaluate(META)
        want = _expected(profile, bar["ipu"], other)
        assert meta["share"]["compute"] == pytest.approx(want["compute"], abs=2e-3)
    assert page.locator("#callback-error .message").count() == 0
    assert big == [] and errors == [], (big, errors)
    page.close()


def test_measured_profile_has_no_bsp_section(browser_context: Any, base_url: str,
                                            served: Path) -> None:
    """A measured run has no BSP supersteps on tiles: /trace says nothing of them."""
    if not (served / MEASURED).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    page, errors = _open(browser_context, f"{base_url}/trace?profile={quote(MEASURED)}")
    page.wait_for_selector("#trace-graph .js-plotly-plot", timeout=90_000)  # after vetting
    assert page.locator("#trace-bsp").count() == 1 and page.locator("#trace-bsp").is_hidden()
    assert page.locator("#trace-bsp-graph").count() == 0
    text = page.inner_text("#page")
    assert "BSP" not in text and "superstep" not in text
    assert errors == [], errors
    page.close()
