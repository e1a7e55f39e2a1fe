"""Every page of one profile of each kind in a real browser: figures hold data, the console
stays clean, a broken file is listed with its error while the others work. Every page of
every bundled profile is also rendered without a browser (tests/test_bundled_profiles.py).
Screenshots go to test-artifacts/screenshots/."""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from popviz_app.pages import PAGES

import popviz

from .conftest import BROKEN, SCREENSHOTS

pytestmark = pytest.mark.browser

PROFILE_PAGES = [p for p in PAGES if p.NEEDS_PROFILE]


def _profiles(served: Path) -> list[str]:
    return sorted(p.relative_to(served).as_posix() for p in served.rglob("*.h5")
                  if p.relative_to(served).as_posix() != BROKEN)


def _kind(served: Path, rel: str) -> tuple[object, ...]:
    """What changes which figures and words a page shows: the device family, the target,
    training or inference, the schedule, one device or several."""
    with popviz.open(served / rel) as profile:
        meta, options = profile.meta, profile.meta.get("options") or {}
        target = meta.get("target") or {}
        return (meta.get("kind"), meta.get("device_kind"), target.get("name"),
                bool(options.get("training")), options.get("schedule"),
                int(target.get("num_ipus") or 1) > 1)


def one_of_each_kind(served: Path) -> list[str]:
    """The smallest served profile of each kind (a browser visit of all nine bundled ones
    costs three minutes of a CI run and finds nothing a visit of each kind does not)."""
    chosen: dict[tuple[object, ...], str] = {}
    for rel in sorted(_profiles(served), key=lambda r: ((served / r).stat().st_size, r)):
        chosen.setdefault(_kind(served, rel), rel)
    return sorted(chosen.values())


def _count(served: Path, rel: str, measure: Callable[[Any], int]) -> int:
    """`measure(profile)` for one served profile."""
    with popviz.open(served / rel) as profile:
        return int(measure(profile))


def _profile_with_most(served: Path, measure: Callable[[Any], int]) -> str:
    """The served profile for which `measure(profile)` is largest (first one on ties)."""
    return max(_profiles(served), key=lambda rel: _count(served, rel, measure))


# the page is drawn: a heading or message, every dcc.Graph has a computed Plotly plot, and
# no callback is still running
_SETTLED = """() => {
    const graphs = document.querySelectorAll('.dash-graph');
    const plots = [...document.querySelectorAll('.js-plotly-plot')];
    return !!document.querySelector('#page h2, #page .message')
        && graphs.length === plots.length && plots.every(p => p.calcdata)
        && !document.querySelector('[data-dash-is-loading="true"]');
}"""


def _open(context: Any, url: str) -> tuple[Any, list[str]]:
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # a request the server refuses (413 from waitress, a 500) is an error even when the
    # page looks fine: Dash then keeps the old outputs without a word
    page.on("response", lambda r: errors.append(f"HTTP {r.status} {r.request.method} {r.url}")
            if r.status >= 400 else None)
    page.goto(url)
    page.wait_for_selector("nav.nav", timeout=30_000)
    page.wait_for_function(_SETTLED, timeout=30_000)
    return page, errors


def go_by_nav(page: Any, spec: Any) -> None:
    """Reach page `spec` through its nav link, as a user does: client-side routing, so
    the Plotly bundle is not loaded again. Waits until the page is drawn."""
    page.click(f"nav a[href^='{spec.PATH}?']")
    page.wait_for_function(
        "t => (document.querySelector('.nav-link.active') || {}).innerText === t",
        arg=spec.TITLE, timeout=30_000)
    page.wait_for_function(_SETTLED, timeout=60_000)


def box_select_trace(page: Any, start: float, width: float) -> None:
    """Pick Box Select on the trace and drag over [start, start + width] of its width (as
    fractions); wait until the statistics are of the selected range."""
    page.locator("#trace-graph .modebar-btn[data-val='select']").first.click()
    box = page.locator("#trace-graph .nsewdrag").first.bounding_box()
    x0, y0 = box["x"] + box["width"] * start, box["y"] + 10
    page.mouse.move(x0, y0)
    page.mouse.down()
    page.mouse.move(x0 + box["width"] * width, y0 + box["height"] * 0.5, steps=8)
    page.mouse.up()
    page.wait_for_function("() => (document.querySelector('#trace-stats-head') || {})"
                           ".innerText.startsWith('Selected range')", timeout=20_000)


def click_liveness_point(page: Any, point_js: str) -> None:
    """A real click on /liveness' curve at the pixel `point_js` (a JS function returning
    [x, y] in the page) gives, scrolled into view first; waits until the variables'
    heading has changed."""
    page.evaluate(f"() => window.scrollBy(0, ({point_js})()[1] - 450)")  # in the viewport
    page.wait_for_timeout(300)
    spot = page.evaluate(point_js)
    head = page.inner_text("#live-vars-head")
    page.mouse.move(spot[0], spot[1])
    page.mouse.click(spot[0], spot[1])
    page.wait_for_function("b => document.querySelector('#live-vars-head').innerText != b",
                           arg=head, timeout=20_000)


def _plot_traces(page: Any) -> list[int]:
    """Number of traces with at least one computed point, per Plotly graph on the page
    (calcdata: numpy arrays arrive base64-encoded, so `data[i].x.length` would lie)."""
    return page.eval_on_selector_all(
        ".js-plotly-plot", "els => els.map(e => (e.calcdata || []).filter("
        "cd => cd.some(p => Number.isFinite(p.x) || Number.isFinite(p.y) || "
        "Number.isFinite(p.s) || Number.isFinite(p.b) || (p.z && p.z.length) || "
        "(p.hierarchy && p.hierarchy.children))).length)")  # icicle: a hierarchy


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def test_home_lists_profiles_and_the_broken_file(browser_context: Any, base_url: str,
                                                 served: Path) -> None:
    page, errors = _open(browser_context, base_url + "/")
    page.wait_for_selector("#profile-table")
    text = page.inner_text("#profile-table")
    for rel in _profiles(served):
        assert rel in text
    # a file is listed broken once the vetting worker has read it: on a loaded machine that
    # may be after the first listing, which the page then refreshes by itself
    page.wait_for_selector(f"#profile-table tr.broken >> text={BROKEN}", timeout=30_000)
    row = page.locator("tr.broken", has_text=BROKEN)
    assert row.count() == 1
    assert "truncated" in row.inner_text() or "damaged" in row.inner_text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "home.png"), full_page=True)
    # a run that finishes while the page is open shows up without a reload or restart
    fresh = served / "fresh" / "profile.h5"
    fresh.parent.mkdir()
    shutil.copy(served / _profiles(served)[0], fresh)
    try:
        page.wait_for_selector("#profile-table >> text=fresh/profile.h5", timeout=15_000)
    finally:
        shutil.rmtree(fresh.parent)
    assert errors == []
    page.close()


def test_every_page_of_each_kind_of_profile_has_data(browser_context: Any, base_url: str,
                                                     served: Path) -> None:
    """Each profile is loaded once; its pages are then reached through the nav links, as a
    user would (client-side routing, so no reload of the Plotly bundle per page)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    kinds = one_of_each_kind(served)
    if len(_profiles(served)) >= 9:  # the bundled set: IPU Mk1 and Mk2, inference, measured
        assert len(kinds) >= 4, kinds
    for rel in kinds:
        first = PROFILE_PAGES[0]
        # a measured profile (popviz.measure) has no tiles: its tile figures are absent
        with popviz.open(served / rel) as profile:
            no_tiles = profile.tile_memory.empty
        page, errors = _open(browser_context, f"{base_url}{first.PATH}?profile={quote(rel)}")
        for spec in PROFILE_PAGES:
            where = f"{spec.PATH} of {rel}"
            if spec is not first:
                go_by_nav(page, spec)
            assert f"profile={quote(rel, safe='')}" in page.url.replace("/", "%2F") or \
                quote(rel) in page.url, where
            assert page.locator(".message.error").count() == 0, where
            if spec.FIGURES and not (no_tiles and spec.PATH in ("/summary", "/memory")):
                counts = _plot_traces(page)
                assert counts and all(n > 0 for n in counts), f"{where}: traces {counts}"
            else:
                page.wait_for_selector(".dash-spreadsheet, .message.info", timeout=30_000)
            assert "No data" not in page.inner_text("body"), where
            page.screenshot(path=str(SCREENSHOTS / f"{_slug(rel)}_{spec.TITLE.lower()}.png"),
                            full_page=True)
            assert errors == [], f"{where}: {errors}"
        # /compare takes two: the first kind against each other family (an IPU plan
        # against a measured run); every bundled pair is compared without a browser
        if rel == kinds[0]:
            family = {k: _kind(served, k)[1] for k in kinds}
            for other in [k for k in kinds if family[k] != family[rel]]:
                page.goto(f"{base_url}/compare?profile={quote(rel)}&other={quote(other)}")
                page.wait_for_function(_SETTLED, timeout=60_000)
                where = f"/compare of {rel} and {other}"
                assert page.locator(".message.error").count() == 0, where
                assert page.locator("#compare-verdict").count() == 1, where
                page.screenshot(path=str(SCREENSHOTS / f"{_slug(rel)}_vs_{_slug(other)}.png"),
                                full_page=True)
                assert errors == [], f"{where}: {errors}"
        page.close()


def test_broken_and_escaping_profiles_show_a_message(browser_context: Any, base_url: str) -> None:
    for rel, expected in ((BROKEN, "truncated"), ("../../etc/passwd", "outside"),
                          ("/etc/passwd", "relative")):
        page, errors = _open(browser_context, f"{base_url}/summary?profile={quote(rel)}")
        box = page.wait_for_selector(".message.error")
        assert expected in box.inner_text()
        assert errors == []
        page.close()


def test_trace_zoom_switches_to_single_events(browser_context: Any, base_url: str,
                                              served: Path) -> None:
    # the one most likely to start zoomed out
    rel = _profile_with_most(served, lambda profile: len(profile.trace))
    page, errors = _open(browser_context, f"{base_url}/trace?profile={quote(rel)}")
    page.wait_for_selector("#trace-graph .main-svg")
    before = page.inner_text("#trace-status")
    # a long run opens on its ramp-up (single events): reset to the whole run first
    for _ in range(5):
        if "zoom in for single events" in before:
            break
        page.evaluate("""() => Plotly.relayout(document.querySelector(
            '#trace-graph .js-plotly-plot'), {'xaxis.autorange': true})""")
        with contextlib.suppress(PlaywrightTimeout):  # tried again below
            page.wait_for_function("() => document.querySelector('#trace-status').innerText"
                                   ".includes('zoom in for single events')", timeout=5_000)
        before = page.inner_text("#trace-status")
    assert "zoom in for single events" in before
    # zoom to a sliver at the start, as a drag would; dcc.Graph may bind its relayout
    # listener a moment after the plot is drawn, so repeat the zoom until the server answers
    for _ in range(5):
        page.evaluate("""() => { const g = document.querySelector('#trace-graph .js-plotly-plot');
            const r = g.layout.xaxis.range; const w = (r[1] - r[0]) / 400;
            Plotly.relayout(g, {'xaxis.range[0]': r[0], 'xaxis.range[1]': r[0] + w}); }""")
        try:
            page.wait_for_function("b => document.querySelector('#trace-status').innerText != b",
                                   arg=before, timeout=5_000)
            break
        except PlaywrightTimeout:
            continue
    assert "every event drawn" in page.inner_text("#trace-status")
    page.screenshot(path=str(SCREENSHOTS / "trace_zoomed.png"), full_page=True)
    assert errors == []
    page.close()


def _type_ops_filter(browser_context: Any, base_url: str, served: Path, column: str,
                     text: str) -> tuple[Any, list, str]:
    """Operations page of the first profile with `text` typed into `column`'s filter cell;
    returns the page, its errors and the row note from before the filter."""
    rel = _profiles(served)[0]
    page, errors = _open(browser_context, f"{base_url}/operations?profile={quote(rel)}")
    page.wait_for_selector("#ops-table .dash-spreadsheet")
    before = page.inner_text("#ops-note")
    cell = page.locator(f'th.dash-filter[data-dash-column="{column}"] input').first
    cell.click()
    cell.fill(text)
    cell.press("Enter")
    page.wait_for_function("b => document.querySelector('#ops-note').innerText != b",
                           arg=before, timeout=20_000)
    return page, errors, before


def test_operations_filter_typed_in_the_table(browser_context: Any, base_url: str,
                                              served: Path) -> None:
    page, errors, before = _type_ops_filter(browser_context, base_url, served, "op_class",
                                            "conv")
    shown = page.locator('#ops-table td[data-dash-column="op_class"]').all_inner_texts()
    assert shown and all("conv" in s for s in shown)
    assert int(page.inner_text("#ops-note").split(" of ")[0].replace(",", "")) < int(
        before.split(" of ")[0].replace(",", ""))
    assert errors == []
    page.close()


def test_a_word_in_a_number_filter_is_a_one_line_error(browser_context: Any, base_url: str,
                                                      served: Path) -> None:
    page, errors, _ = _type_ops_filter(browser_context, base_url, served, "cycles", "fast")
    note = page.inner_text("#ops-note")
    assert "filter not understood, ignored: 'cycles' holds numbers; 'fast' is not one" in note
    assert "\n" not in note
    assert errors == []
    page.close()


def test_clicking_a_liveness_bump_lists_its_variables(browser_context: Any, base_url: str,
                                                      served: Path) -> None:
    def ipus(profile: Any) -> int:
        return int(profile.liveness["ipu"].nunique())

    rel = _profile_with_most(served, ipus)
    last = _count(served, rel, ipus) - 1
    page, errors = _open(browser_context, f"{base_url}/liveness?profile={quote(rel)}")
    before = page.inner_text("#live-vars-head")
    marker = page.locator("#live-graph path.point").last  # a bump on the last IPU's panel
    marker.scroll_into_view_if_needed()
    box = marker.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function("b => document.querySelector('#live-vars-head').innerText != b",
                           arg=before, timeout=20_000)
    head = page.inner_text("#live-vars-head")
    assert head.startswith(f"IPU{last}, step ")
    assert page.locator("#live-vars-box td").count() > 0
    assert errors == []
    page.close()


def test_clicking_the_tile_map_shows_that_tiles_breakdown(browser_context: Any, base_url: str,
                                                          served: Path) -> None:
    rel = _profiles(served)[0]
    page, errors = _open(browser_context, f"{base_url}/memory?profile={quote(rel)}")
    title = "#mem-breakdown .gtitle"
    before = page.text_content(title)  # an SVG text node: text_content, not inner_text
    area = page.locator("#mem-map .nsewdrag").first
    area.scroll_into_view_if_needed()  # the map is below the fold; mouse clicks need it shown
    box = area.bounding_box()
    assert box is not None
    spot = {"x": box["width"] * 0.55, "y": box["height"] * 0.45}
    area.hover(position=spot)
    area.click(position=spot)
    page.wait_for_function("([s, b]) => document.querySelector(s).textContent != b",
                           arg=[title, before], timeout=20_000)
    after = page.text_content(title) or ""
    assert re.match(r"IPU\d+ tile \d+: ", after) and after != before
    assert errors == []
    page.close()


# how far a table's content reaches past its half-width panel (0: it fits)
# (a DataTable's cell table, or a plain table's own content: its scroll width)
_OVERRUN = """sel => { const t = document.querySelector(sel + ' table.cell-table')
    || document.querySelector('table' + sel);
  const half = document.querySelector(sel).closest('.half');
  const r = t.getBoundingClientRect();
  return Math.max(r.right, r.left + t.scrollWidth) - half.getBoundingClientRect().right; }"""


@pytest.mark.parametrize(("path", "table"), [("/summary", "#peak-liveness"),
                                             ("/trace", "#trace-stats-top")])
def test_summary_and_trace_tables_fit_their_half_panels(browser_context: Any, base_url: str,
                                                        served: Path, path: str,
                                                        table: str) -> None:
    rels = _profiles(served)
    rel = next((r for r in rels if r.startswith("rn50_pipeline/")), rels[0])
    page, errors = _open(browser_context, f"{base_url}{path}?profile={quote(rel)}")
    page.set_viewport_size({"width": 1280, "height": 900})
    page.wait_for_selector(f"{table} table.cell-table, table{table} td", timeout=30_000)
    assert page.evaluate(_OVERRUN, table) <= 1
    assert errors == []
    page.close()


def test_operations_filter_placeholder_is_not_cut_and_the_first_column_stays(
        browser_context: Any, base_url: str, served: Path) -> None:
    page, errors = _open(browser_context,
                         f"{base_url}/operations?profile={quote(_profiles(served)[0])}")
    cell = page.locator('th.dash-filter[data-dash-column="op_id"] input').first
    cell.wait_for()
    # the placeholder's drawn width, in the input's own font, against the room it has
    need, room = cell.evaluate("""e => { const c = document.createElement('canvas')
        .getContext('2d'); const s = getComputedStyle(e); c.font = s.font;
        return [c.measureText(e.placeholder).width, e.clientWidth
                - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight)]; }""")
    assert cell.get_attribute("placeholder") and need <= room, (need, room)
    # the first column stays in view while the table scrolls sideways in its box
    page.wait_for_selector("#ops-table td.dash-cell")
    moved = page.evaluate("""() => {
        const rows = [...document.querySelectorAll('#ops-table tr')]
            .filter(r => r.querySelector('td.dash-cell'));
        let box = rows[0];
        while (box && !(box.scrollWidth > box.clientWidth + 50 &&
                        getComputedStyle(box).overflowX !== 'visible')) box = box.parentElement;
        const left = el => el.getBoundingClientRect().left;
        const first = rows[0].querySelector('td'), second = rows[0].querySelectorAll('td')[1];
        const before = [left(first), left(second)];
        box.scrollLeft = 400;
        return {box: left(box), before, after: [left(first), left(second)],
                scrolled: box.scrollLeft};
    }""")
    assert moved["scrolled"] > 0, moved  # the ops table is wider than its box
    assert moved["after"][0] == pytest.approx(moved["before"][0], abs=1), moved
    assert moved["after"][1] < moved["before"][1] - 100, moved
    page.screenshot(path=str(SCREENSHOTS / "operations_scrolled_sideways.png"))
    assert errors == []
    page.close()
