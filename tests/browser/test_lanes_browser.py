"""/trace's thread and stream lanes, flame / flat, and every page at 1280 px, through the
real `popviz serve`. Screenshots go to test-artifacts/screenshots/ (lanes_*.png)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from popviz_app.pages import PAGES

import popviz
from popviz.analysis.trace_threads import launch_links
from tests.import_fixtures import RESNET

from .conftest import SCREENSHOTS
from .test_app_browser import _SETTLED, _open, go_by_nav

pytestmark = pytest.mark.browser

BUNDLED = "rn50_pipeline"  # a modelled pipeline over 4 IPUs: every page has data
OTHER = "rn50_recompute"
WIDTH = 1280

# no horizontal scroll bar, and no Plotly figure wider than the box it sits in or past the
# viewport's right edge (a clipped figure)
_FITS = """() => {
    const doc = document.documentElement;
    const out = {scroll: doc.scrollWidth, clipped: []};
    for (const p of document.querySelectorAll('.js-plotly-plot')) {
        const svg = p.querySelector('.main-svg');
        if (!svg) continue;
        const r = svg.getBoundingClientRect();
        const box = p.parentElement.getBoundingClientRect();
        if (r.right > doc.clientWidth + 1 || r.width > box.width + 1)
            out.clipped.push([p.parentElement.id || p.id, Math.round(r.width),
                              Math.round(box.width)]);
    }
    return out;
}"""


def _rel(served: Path, name: str) -> str:
    return next((served / name).rglob("*.h5")).relative_to(served).as_posix()


def _status_after(page: Any, before: str, js: str, timeout: int = 8_000) -> str:
    """Run `js` (a relayout) until #trace-status changes (dcc.Graph may bind its listener
    a moment after the plot is drawn); returns the new status."""
    page.wait_for_selector("#trace-graph .main-svg")
    page.wait_for_function("() => typeof Plotly !== 'undefined'", timeout=20_000)
    for _ in range(5):
        page.evaluate(js)
        with contextlib.suppress(PlaywrightTimeout):
            page.wait_for_function("b => document.querySelector('#trace-status').innerText"
                                   " != b", arg=before, timeout=timeout)
            break
    return page.inner_text("#trace-status")


def _zoom(page: Any, lo: float, hi: float) -> str:
    return _status_after(page, page.inner_text("#trace-status"), f"""() => Plotly.relayout(
        document.querySelector('#trace-graph .js-plotly-plot'),
        {{'xaxis.range[0]': {lo}, 'xaxis.range[1]': {hi}}})""")


def _pick(page: Any, mode: str) -> str:
    before = page.inner_text("#trace-status")
    page.locator(f"#trace-mode input[value='{mode}']").check()
    page.wait_for_function("b => document.querySelector('#trace-status').innerText != b",
                           arg=before, timeout=20_000)
    page.wait_for_function(_SETTLED, timeout=20_000)
    return page.inner_text("#trace-status")


def _meta(page: Any) -> dict:
    return page.evaluate("() => document.querySelector('#trace-graph .js-plotly-plot')"
                         ".layout.meta")


def test_every_page_fits_1280_px(browser: Any, base_url: str, served: Path) -> None:
    context = browser.new_context(viewport={"width": WIDTH, "height": 800})
    try:
        rel, other = _rel(served, BUNDLED), _rel(served, OTHER)
        page, errors = _open(context, f"{base_url}/summary?profile={quote(rel)}")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        # a profile's pages through the nav links (no reload), then home and /compare
        # (which takes a pair) by address
        for spec in sorted(PAGES, key=lambda spec: not spec.NEEDS_PROFILE):
            if not spec.NEEDS_PROFILE:
                url = f"{base_url}{spec.PATH}?profile={quote(rel)}"
                page.goto(url + (f"&other={quote(other)}" if spec.PATH == "/compare" else ""))
                page.wait_for_selector("nav.nav", timeout=30_000)
                page.wait_for_function(_SETTLED, timeout=60_000)
            elif spec.PATH != "/summary":
                go_by_nav(page, spec)
            fit = page.evaluate(_FITS)
            page.screenshot(path=str(SCREENSHOTS / f"lanes_1280_{spec.TITLE.lower()}.png"),
                            full_page=True)
            assert fit["scroll"] <= WIDTH, f"{spec.PATH}: scrollWidth {fit['scroll']}"
            assert fit["clipped"] == [], f"{spec.PATH}: clipped figures {fit['clipped']}"
        assert errors == []
        page.close()
    finally:
        context.close()


def test_an_import_in_thread_and_stream_lanes_flame_then_flat(
        browser_context: Any, base_url: str, served: Path) -> None:
    folder = served / "imported_lanes"  # served only for this test: others count profiles
    popviz.import_trace([RESNET], folder)
    try:
        with popviz.open(folder) as p:
            links = launch_links(p.table("host_slices"), p.trace)
        mid = links.iloc[len(links) // 2]
        lo, hi = float(mid["launch_start"]) - 150_000, float(mid["start"]) + 150_000
        page, errors = _open(browser_context,
                             f"{base_url}/trace?profile=imported_lanes/profile.h5")
        assert "launch" in page.inner_text("#trace-status")
        status = _zoom(page, lo, hi)
        assert "every slice drawn" in status and "launch → kernel arrows" in status
        assert status.endswith("(flame layout).")
        flame = _meta(page)
        assert flame["view"] == "flame" and flame["flows_drawn"] > 0
        assert any(r.startswith("depth") for r in flame["rows"])
        assert any(r.startswith("stream") for r in flame["rows"])
        page.screenshot(path=str(SCREENSHOTS / "lanes_import_flame.png"), full_page=True)
        status = _pick(page, "flat")
        flat = _meta(page)
        assert status.endswith("(flat layout).") and flat["range"] == flame["range"]  # same window
        assert not any(r.startswith("depth") for r in flat["rows"])
        assert len(flat["rows"]) < len(flame["rows"])
        assert flat["flows_drawn"] == flame["flows_drawn"]
        page.screenshot(path=str(SCREENSHOTS / "lanes_import_flat.png"), full_page=True)
        assert errors == []
        page.close()
    finally:
        shutil.rmtree(folder)


def test_a_gpu_idle_gap_says_why_on_hover(browser_context: Any, base_url: str,
                                          served: Path) -> None:
    folder = served / "imported_idle"
    popviz.import_trace([RESNET], folder)
    try:
        with popviz.open(folder) as p:
            tr = p.trace
            gaps = tr[tr["op"] == "GPU idle"]
            gap = gaps.loc[(gaps["end"] - gaps["start"]).idxmax()]
        width = float(gap["end"] - gap["start"])
        page, errors = _open(browser_context,
                             f"{base_url}/trace?profile=imported_idle/profile.h5")
        _zoom(page, float(gap["start"]) - width, float(gap["end"]) + width)
        meta = _meta(page)
        row = meta["rows"].index("GPU idle")
        box = page.locator("#trace-graph .nsewdrag").first.bounding_box()
        rows = len(meta["rows"])
        x = box["x"] + box["width"] * 0.5  # the gap's middle: the window is 3 gaps wide
        y = box["y"] + box["height"] * (row + 0.5) / rows
        page.mouse.move(x, y)
        page.wait_for_selector(".hoverlayer .hovertext", timeout=10_000)
        text = page.evaluate("() => document.querySelector('.hoverlayer').textContent")
        assert "GPU idle" in text and "host launched the next kernel" in text
        page.screenshot(path=str(SCREENSHOTS / "lanes_idle_hover.png"), full_page=True)
        assert errors == []
        page.close()
    finally:
        shutil.rmtree(folder)


def test_a_kernel_says_its_launch_on_hover(browser_context: Any, base_url: str,
                                           served: Path) -> None:
    """The widest kernel of the H100 recording, hovered in its stream lane: its grid,
    block, registers and occupancy as the trace's kernel event gives them."""
    folder = served / "imported_launch"
    popviz.import_trace([RESNET], folder)
    try:
        with popviz.open(folder) as p:
            tr, kernels = p.trace, p.table("kernels").set_index("correlation")
            kern = tr[tr["correlation"].isin(kernels.index)]
            widest = kern.loc[(kern["end"] - kern["start"]).idxmax()]
        launch = kernels.loc[int(widest["correlation"])]
        width = float(widest["end"] - widest["start"])
        page, errors = _open(browser_context,
                             f"{base_url}/trace?profile=imported_launch/profile.h5")
        _zoom(page, float(widest["start"]) - width, float(widest["end"]) + width)
        meta = _meta(page)
        row = next(i for i, r in enumerate(meta["rows"])
                   if r.endswith(f"stream {int(widest['stream'])}"))
        box = page.locator("#trace-graph .nsewdrag").first.bounding_box()
        x = box["x"] + box["width"] * 0.5  # the kernel's middle: the window is 3 kernels wide
        y = box["y"] + box["height"] * (row + 0.5) / len(meta["rows"])
        page.mouse.move(x, y)
        page.wait_for_selector(".hoverlayer .hovertext", timeout=10_000)
        text = page.evaluate("() => document.querySelector('.hoverlayer').textContent")
        # the whole name, wrapped (a template kernel's runs to hundreds of characters)
        name = str(widest["op"])
        assert name.replace(" ", "") in text.replace(" ", ""), text
        assert f"grid {launch['grid'].replace(',', '×')}" in text, text
        assert f"block {launch['block'].replace(',', '×')}" in text, text
        assert f"{launch['registers']:,.0f} registers a thread" in text, text
        occupancy = float(launch["occupancy_pct"])
        assert (f"occupancy {occupancy:,.0f}% (CUPTI's estimate)" if occupancy > 0 else
                "occupancy not estimated (CUPTI gives 0%)") in text, text
        # Kineto's per-SM figures are the grid's share of each SM, and are said so
        assert f"grid over the SMs: {launch['blocks_per_sm']:,.1f} blocks" in text, text
        page.screenshot(path=str(SCREENSHOTS / "lanes_kernel_hover.png"), full_page=True)
        assert errors == []
        page.close()
    finally:
        shutil.rmtree(folder)


def test_a_modelled_pass_flame_then_flat(browser_context: Any, base_url: str,
                                         served: Path) -> None:
    rel = _rel(served, BUNDLED)
    with popviz.open(served / rel) as p:
        comp = p.trace[p.trace["kind"] == "compute"].sort_values("start")
        first = comp.iloc[0]
    page, errors = _open(browser_context, f"{base_url}/trace?profile={quote(rel)}")
    status = _zoom(page, float(first["start"]), float(first["end"]))
    assert "laid out in modelled order" in status
    flame = _meta(page)
    assert flame["view"] == "flame" and any(x.endswith(" ops") for x in flame["lanes"])
    page.screenshot(path=str(SCREENSHOTS / "lanes_modelled_flame.png"), full_page=True)
    _pick(page, "flat")
    flat = _meta(page)
    assert flat["view"] == "flat" and not any(x.endswith(" ops") for x in flat["lanes"])
    assert flat["ops_drawn"] == flame["ops_drawn"] > 0 and flat["range"] == flame["range"]
    page.screenshot(path=str(SCREENSHOTS / "lanes_modelled_flat.png"), full_page=True)
    assert errors == []
    page.close()
