"""The analyser's interactions in a real browser: the trace down to ops, range statistics,
the program tree, numeric filters, liveness section bands, the tune page (also with a
memory ceiling) -> compare.
Screenshots go to test-artifacts/screenshots/analyser_*.png."""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from popviz_app.pages.tree import LEVELS

import popviz
from popviz.analysis.program_tree import program_tree

from .conftest import SCREENSHOTS
from .test_app_browser import _open, _profile_with_most, box_select_trace

pytestmark = pytest.mark.browser


def _shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"analyser_{name}.png"), full_page=True)


def _drawn(page: Any, graph: str) -> None:
    """Wait until the Plotly graph inside `#graph` has been drawn (its calcdata exists)."""
    page.wait_for_function("g => { const e = document.querySelector("
                           "'#' + g + ' .js-plotly-plot'); return e && e.calcdata; }",
                           arg=graph, timeout=30_000)


def _trace_names(page: Any, graph: str) -> list[str]:
    """The names of the traces the Plotly graph inside `#graph` holds."""
    return page.evaluate("g => document.querySelector('#' + g + ' .js-plotly-plot')"
                         ".data.map(d => d.name)", graph)


def _until_changed(page: Any, selector: str, before: str, act: str, tries: int = 5) -> str:
    """Run `act` (JS, given the attempt number) until `selector`'s text changes: Plotly
    follows the first relayout with an 'autosize' one, which supersedes the zoom request,
    so the zoom is repeated (slightly different each time, or dcc.Graph ignores it)."""
    for attempt in range(tries):
        page.evaluate(act, attempt)
        try:
            page.wait_for_function(
                "([s, b]) => (document.querySelector(s) || {}).innerText != b",
                arg=[selector, before], timeout=6_000)
            break
        except PlaywrightTimeout:
            continue
    return page.inner_text(selector)


def _modelled_with_ops(served: Path) -> str:
    return _profile_with_most(served, lambda p: int("cycles" in p.ops) * len(p.trace))


def test_trace_zooms_down_to_ops(browser_context: Any, base_url: str, served: Path) -> None:
    rel = _modelled_with_ops(served)
    page, errors = _open(browser_context, f"{base_url}/trace?profile={quote(rel)}")
    before = page.inner_text("#trace-status")
    _shot(page, "trace_opening")
    # the lane names once Plotly has drawn the y axis (under CI's two workers the page can
    # settle a moment before its ticks are laid out)
    ticks = page.wait_for_function("""() => {
        const t = Array.from(document.querySelectorAll('#trace-graph .ytick text'))
            .map(e => e.textContent);
        return t.some(x => x.endsWith('· compute')) && t.includes('ops') ? t : null; }""",
                                   timeout=30_000).json_value()
    assert "exchange" in ticks and "sync" in ticks
    # zoom to the first few ops of the first forward pass on IPU0
    after = _until_changed(page, "#trace-status", before, """(k) => {
        const g = document.querySelector('#trace-graph .js-plotly-plot');
        const bars = g.data.filter(d => d.name === 'compute: forward');
        const b0 = bars[0].base[0], w = bars[0].x[0];
        Plotly.relayout(g, {'xaxis.range[0]': b0, 'xaxis.range[1]': b0 + w / (8 + k)}); }""")
    assert "ops laid out in modelled order" in after, after
    names = _trace_names(page, "trace-graph")
    assert any(n.startswith("op: ") for n in names)
    # every event's tooltip says its duration: end - start, not the end time
    checked = page.evaluate("""() => {
        const g = document.querySelector('#trace-graph .js-plotly-plot');
        let n = 0;
        for (const d of g.data) { if (d.type !== 'bar' || !d.customdata) continue;
            const cd = d.customdata; const dur = d.name.startsWith('op: ') ? 7 : 6;
            const end = d.name.startsWith('op: ') ? 6 : 4;
            for (let i = 0; i < cd.length; i++) {
                if (Math.abs(cd[i][dur] - (cd[i][end] - d.base[i])) > 1e-6) return -1;
                n++; } }
        return n; }""")
    assert checked > 0
    labels = page.eval_on_selector_all("#trace-graph .bars text", "e => e.map(t => t.textContent)")
    assert labels, "no op or pass labels drawn"
    _shot(page, "trace_ops")
    assert errors == []
    page.close()


def test_brushing_a_range_gives_its_statistics(browser_context: Any, base_url: str,
                                               served: Path) -> None:
    rel = _modelled_with_ops(served)
    page, errors = _open(browser_context, f"{base_url}/trace?profile={quote(rel)}")
    assert page.inner_text("#trace-stats-head").startswith("Shown window")
    box_select_trace(page, 0.3, 0.2)
    kinds = page.locator("#trace-stats-kind td[data-dash-column='kind']").all_inner_texts()
    assert "compute" in kinds
    classes = page.locator("#trace-stats-class td[data-dash-column='op_class']")
    assert classes.count() > 0
    _shot(page, "trace_brush_stats")
    assert errors == []
    page.close()


def test_numeric_filters_typed_in_the_ops_table(browser_context: Any, base_url: str,
                                                served: Path) -> None:
    rel = _modelled_with_ops(served)
    page, errors = _open(browser_context, f"{base_url}/operations?profile={quote(rel)}")
    page.wait_for_selector("#ops-table .dash-spreadsheet")
    headers = page.locator("#ops-table th.dash-header").all_inner_texts()
    assert [h.strip() for h in headers].index("cycles") < 10
    for typed, check in (("> 100000", lambda v: v > 100_000),
                         ("< 10", lambda v: v < 10),
                         ("1000..5000", lambda v: 1000 <= v <= 5000)):
        before = page.inner_text("#ops-note")
        cell = page.locator('th.dash-filter[data-dash-column="cycles"] input').first
        cell.click()
        cell.fill(typed)
        cell.press("Enter")
        page.wait_for_function("b => document.querySelector('#ops-note').innerText != b",
                               arg=before, timeout=20_000)
        note = page.inner_text("#ops-note")
        assert "not understood" not in note, (typed, note)
        shown = page.locator('#ops-table td[data-dash-column="cycles"]').all_inner_texts()
        values = [float(s.replace(",", "")) for s in shown]
        assert values and all(check(v) for v in values), (typed, values[:5])
        _shot(page, "ops_filter_" + typed.replace(" ", "").replace(">", "gt")
              .replace("<", "lt").replace(".", "_"))
    assert errors == []
    page.close()


def _click_slice(page: Any, label: str) -> None:
    """Click the icicle box whose label is `label` (its first text line)."""
    slices = page.locator("#tree-graph g.slice")
    for i in range(slices.count()):
        if (slices.nth(i).locator("text").first.text_content() or "").startswith(label):
            slices.nth(i).click()
            return
    raise AssertionError(f"no box labelled {label}")


def test_tree_click_lists_ops_and_links_to_table_and_trace(browser_context: Any,
                                                           base_url: str,
                                                           served: Path) -> None:
    rel = _modelled_with_ops(served)
    page, errors = _open(browser_context, f"{base_url}/tree?profile={quote(rel)}")
    page.wait_for_selector("#tree-graph g.slice")
    before = page.inner_text("#tree-node-head")
    assert before.startswith("model:")
    _shot(page, "tree")
    # click the widest top-level module (a real click on its box)
    with popviz.open(served / rel) as profile:
        tree = program_tree(profile.ops)
    top = tree[(tree["parent"] == "model") & (tree["kind"] == "module")]
    label = str(top.sort_values("cycles").iloc[-1]["id"])
    _click_slice(page, label)
    page.wait_for_function("b => document.querySelector('#tree-node-head').innerText != b",
                           arg=before, timeout=20_000)
    assert page.inner_text("#tree-node-head").startswith(f"{label}:")
    modules = page.locator("#tree-node-ops td[data-dash-column='module']").all_inner_texts()
    assert modules and all(m == label or m.startswith(label + ".") for m in modules)
    _shot(page, "tree_clicked")
    # its own box again goes back up: the panel follows to the model (it kept the module)
    _click_slice(page, label)
    page.wait_for_function("() => document.querySelector('#tree-node-head').innerText"
                           ".startsWith('model:')", timeout=20_000)
    _click_slice(page, label)  # and down once more, for the links below
    page.wait_for_function("l => document.querySelector('#tree-node-head').innerText"
                           ".startsWith(l + ':')", arg=label, timeout=20_000)
    # the ops table, filtered to the module
    page.click("#tree-to-ops")
    page.wait_for_selector("#ops-table .dash-spreadsheet")
    page.wait_for_function("""() => { const t = (document.querySelector('#ops-note') || {})
        .innerText || ''; const m = t.match(/^([\\d,]+) of ([\\d,]+) ops/);
        return m && m[1] !== m[2]; }""", timeout=20_000)
    shown = page.locator("#ops-table td[data-dash-column='module']").all_inner_texts()
    assert shown and all(m == label or m.startswith(label + ".") for m in shown), shown[:5]
    _shot(page, "tree_to_operations")
    page.go_back()
    page.wait_for_selector("#tree-graph g.slice")
    _click_slice(page, label)
    page.wait_for_selector("#tree-to-trace", timeout=20_000)
    page.click("#tree-to-trace")
    page.wait_for_function("""() => { const g = document.querySelector(
        '#trace-graph .js-plotly-plot'); return g && g.data &&
        g.data.some(d => (d.name || '').includes('(selected module)')); }""", timeout=30_000)
    assert "ops laid out" in page.inner_text("#trace-status")
    _shot(page, "tree_to_trace")
    assert errors == []
    page.close()


_ICICLE = """() => { const d = document.querySelector('#tree-graph .js-plotly-plot').data[0];
    return {level: d.level || 'model', ids: [...d.ids]}; }"""


def test_tree_holds_the_levels_it_shows_and_zooms_both_ways(browser_context: Any,
                                                             base_url: str,
                                                             served: Path) -> None:
    """The icicle is sent the levels a view draws (a large program is slow to draw when
    sent whole); a click zooms at once, without Plotly's 750 ms animation, and brings the
    levels below; the view's own box and the path bar go back up with the boxes beside
    it, and no box is left where the zoom moved it."""
    rel = _modelled_with_ops(served)
    with popviz.open(served / rel) as profile:
        tree = program_tree(profile.ops)
    depth = dict(zip(tree["id"], tree["depth"], strict=True))
    page, errors = _open(browser_context, f"{base_url}/tree?profile={quote(rel)}")
    page.wait_for_selector("#tree-graph g.slice")
    shown = page.evaluate(_ICICLE)
    assert max(depth[i] for i in shown["ids"]) <= LEVELS - 1 < max(depth.values())
    top = tree[(tree["parent"] == "model") & (tree["kind"] == "module")]
    label = str(top.sort_values("cycles").iloc[-1]["id"])
    deepest = min(depth[label] + LEVELS - 1, max(depth.values()))
    deeper = [i for i in tree["id"] if depth[i] == deepest
              and str(i).startswith((label + ".", label + "/"))]
    page.wait_for_function("() => document.querySelector('#tree-graph .js-plotly-plot')"
                           "._popvizNoAnimation === true")
    page.evaluate("""() => { const p = document.querySelector('#tree-graph .js-plotly-plot');
        window._animated = false; const t0 = performance.now();
        const tick = () => { window._animated ||= !!p._transitioning;
            if (performance.now() - t0 < 3000) requestAnimationFrame(tick); };
        requestAnimationFrame(tick); }""")
    _click_slice(page, label)
    page.wait_for_function(f"() => ({_ICICLE})().level === {label!r} && ({_ICICLE})().ids"
                           f".some(i => {deeper!r}.includes(i))", timeout=20_000)
    assert page.evaluate("() => window._animated") is False
    below = page.evaluate(_ICICLE)["ids"]
    assert all(i in ("model", label) or i.startswith((label + ".", label + "/"))
               for i in below)
    assert max(depth[i] for i in below) == deepest
    # the view's own box: back up to the model, the other top-level modules back too
    _click_slice(page, label)
    page.wait_for_function(f"() => ({_ICICLE})().level === 'model' && ({_ICICLE})().ids"
                           f".includes({str(top.iloc[0]['id'])!r})", timeout=20_000)
    page.wait_for_timeout(1_000)  # the zoom's animation is over
    # every top-level module's box sits in the column, none overlapping another
    boxes = page.evaluate("""() => [...document.querySelectorAll('#tree-graph g.slice')]
        .filter(e => e.__data__ && e.__data__.parent && e.__data__.parent.data &&
                     e.__data__.parent.data.data.id === 'model')
        .map(e => { const r = e.getBoundingClientRect(); return [r.top, r.bottom]; })
        .sort((a, b) => a[0] - b[0])""")
    assert len(boxes) == int((tree["parent"] == "model").sum())
    assert all(a[1] <= b[0] + 1 for a, b in pairwise(boxes)), boxes
    _shot(page, "tree_back_up")
    assert errors == []
    page.close()


def test_liveness_shows_numbered_section_bands(browser_context: Any, base_url: str,
                                               served: Path) -> None:
    rel = _profile_with_most(served, lambda p: int(p.ops["section"].nunique())
                             if "section" in p.ops else 0)
    page, errors = _open(browser_context, f"{base_url}/liveness?profile={quote(rel)}")
    page.wait_for_selector("#live-graph .main-svg")
    notes = page.eval_on_selector_all("#live-graph .annotation-text",
                                      "e => e.map(t => t.textContent)")
    assert {"R1", "B1", "F0"} <= set(notes), notes
    assert any("folded" in n for n in notes)
    names = _trace_names(page, "live-graph")
    assert "temporaries (one op's working memory)" in names and "section bump" in names
    # the bands are drawn behind the curves: one rect per band
    shapes = page.evaluate("() => document.querySelector('#live-graph .js-plotly-plot')"
                           ".layout.shapes.length")
    assert shapes >= 10
    # the y-axis is fitted: its top is near the data's peak, not at the IPU's capacity
    with popviz.open(served / rel) as profile:
        live = profile.liveness
        peak = float((live["always_live_bytes"] + live["not_always_live_bytes"]).max())
    top = page.evaluate("() => document.querySelector('#live-graph .js-plotly-plot')"
                        "._fullLayout.yaxis.range[1]")
    assert top < 1.6 * peak / 2**20
    _shot(page, "liveness_sections")
    assert errors == []
    page.close()


def test_tune_page_ranks_plans_and_opens_compare(browser_context: Any, base_url: str,
                                                 served: Path) -> None:
    # the smallest modelled program that has split points to move: quick to re-plan
    def small(profile: Any) -> int:
        ok = profile.kind == "modelled" and profile.meta["options"].get("training", True)
        return -len(profile.ops) if ok and profile.meta["target"]["num_ipus"] > 1 else -10**9

    rel = _profile_with_most(served, small)
    page, errors = _open(browser_context, f"{base_url}/tune?profile={quote(rel)}")
    page.fill("#tune-budget", "8")
    page.click("#tune-run")
    page.wait_for_selector("#tune-head", timeout=120_000)
    assert "compiles" in page.inner_text("#tune-head")
    # the table's rows can render a moment after the heading: wait for them, not a sleep
    page.wait_for_selector("#tune-plans td[data-dash-column='plan']", timeout=30_000)
    plans = page.locator("#tune-plans td[data-dash-column='plan']").all_inner_texts()
    assert plans[0] == "now" and "#1" in plans
    _drawn(page, "tune-graph")
    names = _trace_names(page, "tune-graph")
    assert "now (this profile)" in names
    _shot(page, "tune")
    page.click("#tune-links button >> text=plan #1")
    page.wait_for_url("**/compare?**", timeout=60_000)
    page.wait_for_selector("#compare-verdict", timeout=60_000)
    assert "%40tune" in page.url and quote(rel, safe="") in page.url.replace("/", "%2F")
    assert not (served / "tune-plans").exists()  # the plan is served from memory
    _drawn(page, "compare-time")
    _shot(page, "tune_to_compare")
    # again with a memory ceiling (a tiny budget): the smallest whole percent the profile's
    # fullest tile is under, so some plan fits; every fitting plan stays under it
    with popviz.open(served / rel) as profile:
        tm = profile.tile_memory
        fill = math.ceil(float((tm["total_bytes"] / tm["capacity_bytes"]).max()) * 100)
    assert fill < 100
    page.goto(f"{base_url}/tune?profile={quote(rel)}")
    page.wait_for_selector("#tune-fill", timeout=30_000)
    page.fill("#tune-fill", "0")  # outside 1..100: said so, and nothing runs
    page.click("#tune-run")
    page.wait_for_selector("#tune-results >> text=Nothing run: max tile fill", timeout=30_000)
    assert page.locator("#tune-plans").count() == 0
    page.fill("#tune-budget", "3")
    page.fill("#tune-fill", str(fill))
    page.click("#tune-run")
    page.wait_for_selector("#tune-ceiling", timeout=120_000)
    assert f"fits = every tile at most {fill}% full" in page.inner_text("#tune-ceiling")
    page.wait_for_selector("#tune-plans td[data-dash-column='fits']", timeout=30_000)
    rows = [r for r in page.eval_on_selector_all(
        "#tune-plans tr", "trs => trs.map(tr => Object.fromEntries("
        "[...tr.querySelectorAll('td[data-dash-column]')].map("
        "td => [td.dataset.dashColumn, td.innerText.trim()])))") if r]
    fitting = [r for r in rows if r["fits"] == "yes"]
    assert fitting, rows
    for r in fitting:  # shown to a tenth of a percent: never above a whole ceiling
        assert float(r["fullest_tile"].rstrip(" %")) <= fill, r
    assert all(r["fits"].endswith(f"> {fill}%)") for r in rows if r["fits"] != "yes")
    _drawn(page, "tune-graph")
    _shot(page, "tune_ceiling")
    page.click("#tune-links button >> text=plan #1")  # the plan of this run, not the 100 %
    page.wait_for_url(f"**/compare?**fill{fill}**", timeout=60_000)
    assert errors == []
    page.close()


def test_compare_says_when_runs_are_not_like_for_like(browser_context: Any, base_url: str,
                                                      served: Path) -> None:
    a, b = "rn50_pipeline/profile.h5", "tutorial_measured_2ranks/profile.h5"
    if not ((served / a).exists() and (served / b).exists()):
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    page, errors = _open(browser_context,
                         f"{base_url}/compare?profile={quote(a)}&other={quote(b)}")
    page.wait_for_selector("#compare-terms", timeout=60_000)
    terms = page.inner_text("#compare-terms")
    assert "kind modelled vs measured" in terms and "micro-batch" in terms
    verdict = page.inner_text("#compare-verdict")
    assert "no winner" in verdict and "x faster" not in verdict
    assert "✓ better" not in page.inner_text("#page")
    cards = page.inner_text("#compare-side-B").lower()
    assert "time per sample" in cards
    # the measured ranks' bars add up to their step: the untraced host time is drawn
    _drawn(page, "compare-ipu-time")
    names = _trace_names(page, "compare-ipu-time")
    assert "untraced (no event)" in names
    _shot(page, "compare_unequal")
    assert errors == []
    page.close()


def test_trace_legend_clear_of_the_title_at_1024px(browser_context: Any, base_url: str,
                                                   served: Path) -> None:
    rel = _modelled_with_ops(served)
    page, errors = _open(browser_context, f"{base_url}/trace?profile={quote(rel)}")
    page.set_viewport_size({"width": 1024, "height": 800})
    page.wait_for_timeout(1500)  # the graph resizes to the new width
    title = page.locator("#trace-graph .gtitle").bounding_box()
    legend = page.locator("#trace-graph .legend").bounding_box()
    assert title["y"] + title["height"] <= legend["y"] + 1, (title, legend)
    _shot(page, "trace_1024")
    page.set_viewport_size({"width": 1400, "height": 900})
    assert errors == []
    page.close()
