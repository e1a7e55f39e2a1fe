"""The trace zoomed out to the whole run of a long profile, through `popviz serve`
(waitress, 1 MiB request bodies): the statistics follow the window and a wide Box Select
gives its range, with no callback request refused (issue 21: the statistics callback sent
the whole figure, 3 MB, and waitress answered 413)."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

import popviz
from popviz.analysis.range_stats import range_statistics
from popviz.analysis.trace_detail import pass_ops

from .conftest import SCREENSHOTS
from .test_app_browser import _SETTLED, _open, _profile_with_most, box_select_trace

pytestmark = pytest.mark.browser

LONG_RUN = "rn50_pipeline/profile.h5"  # 27,731 events: its figure is ~3 MB zoomed out
MAX_CALLBACK_BODY = 64 * 1024  # callback requests carry ids and ranges, never figures
_HEAD = re.compile(r"^(.+?): ([\d,.]+) to ([\d,.]+) (\w+) \(([\d,.]+) \w+\), "
                   r"([\d,]+) (?:device|trace) events\.$")


def _head(page: Any) -> tuple[str, float, float, int]:
    """(how, lo, hi, events) of the statistics panel's first line."""
    text = page.inner_text("#trace-stats-head")
    match = _HEAD.match(text)
    assert match, text
    how, lo, hi, _, _, events = match.groups()
    return how, float(lo.replace(",", "")), float(hi.replace(",", "")), int(events.replace(",", ""))


def _kind_times(page: Any) -> dict[str, int]:
    kinds = page.locator("#trace-stats-kind td[data-dash-column='kind']").all_inner_texts()
    times = page.locator("#trace-stats-kind td[data-dash-column='time']").all_inner_texts()
    return {k: int(t.replace(",", "")) for k, t in zip(kinds, times, strict=True)}


def _expected(profile: Any, lo: float, hi: float) -> tuple[int, dict[str, int]]:
    stats = range_statistics(profile.trace, pass_ops(profile.ops), lo, hi)
    return stats.events, {str(k): round(t) for k, t in
                          zip(stats.by_kind["kind"], stats.by_kind["time"], strict=True)}


def test_whole_run_and_a_wide_selection_through_waitress(browser_context: Any, base_url: str,
                                                         served: Path) -> None:
    rel = LONG_RUN if (served / LONG_RUN).exists() else \
        _profile_with_most(served, lambda p: len(p.trace))
    page, errors = _open(browser_context, f"{base_url}/trace?profile={quote(rel)}")
    failed: list[str] = []

    def check(response: Any) -> None:
        request = response.request
        size = len(request.post_data_buffer or b"")
        if response.status >= 400 or size > MAX_CALLBACK_BODY:
            failed.append(f"{response.status} {request.method} {response.url} ({size:,} B)")

    page.on("response", check)
    page.on("requestfailed", lambda r: failed.append(f"failed {r.url}: {r.failure}"))
    with popviz.open(served / rel) as profile:
        start, end = float(profile.trace["start"].min()), float(profile.trace["end"].max())
        how, lo, hi, _ = _head(page)
        assert how == "Shown window" and hi - lo < end - start  # opens on the ramp-up
        # zoom out to the whole run as a user does: double-click the trace (again on a
        # timeout: on a loaded machine the page may still be drawing its first figure)
        for _ in range(5):
            box = page.locator("#trace-graph .nsewdrag").first.bounding_box()
            page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            with contextlib.suppress(PlaywrightTimeout):
                page.wait_for_function(
                    "() => (document.querySelector('#trace-status') || {}).innerText"
                    ".includes('zoom in for single events')", timeout=6_000)
                page.wait_for_function(
                    "e => (document.querySelector('#trace-stats-head') || {}).innerText"
                    ".includes(' to ' + e + ' ')", arg=f"{end:,.0f}", timeout=20_000)
                break
        how, lo, hi, events = _head(page)
        assert (how, lo, hi) == ("Shown window", start, end), failed
        want_events, want_kinds = _expected(profile, start, end)
        assert events == want_events == len(profile.trace)
        assert _kind_times(page) == want_kinds
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "trace_whole_run_stats.png"), full_page=True)
        # a Box Select over a fifth of the run (issue 21: anything over ~0.5% failed)
        box_select_trace(page, 0.3, 0.2)
        x0, x1 = page.evaluate("""() => { const s = document.querySelector(
            '#trace-graph .js-plotly-plot').layout.selections[0]; return [s.x0, s.x1]; }""")
        sel_lo, sel_hi = min(x0, x1), max(x0, x1)
        assert 0.15 < (sel_hi - sel_lo) / (end - start) < 0.25
        how, lo, hi, events = _head(page)
        assert (how, lo, hi) == ("Selected range", round(sel_lo), round(sel_hi))
        want_events, want_kinds = _expected(profile, sel_lo, sel_hi)
        assert events == want_events
        assert _kind_times(page) == want_kinds
    page.screenshot(path=str(SCREENSHOTS / "trace_whole_run_selected.png"), full_page=True)
    assert page.locator("#callback-error .message").count() == 0
    assert page.locator("#request-error").is_hidden()
    assert failed == [] and errors == [], (failed, errors)
    page.close()


def test_a_refused_update_is_said_on_the_page(browser_context: Any, base_url: str,
                                              served: Path) -> None:
    """A callback request waitress refuses (over 1 MiB: 413) gets a visible line, not
    silence. The request is a real one to the real server, only made too big."""
    rel = _profile_with_most(served, lambda p: len(p.trace))
    page, errors = _open(browser_context, f"{base_url}/trace?profile={quote(rel)}")
    assert page.locator("#request-error").is_hidden()
    status = page.evaluate("""() => fetch('/_dash-update-component', {method: 'POST',
        headers: {'Content-Type': 'application/json'},
        body: JSON.stringify({pad: 'x'.repeat(2 * 1024 * 1024)})}).then(r => r.status)""")
    assert status == 413
    line = page.locator("#request-error")
    line.wait_for(state="visible", timeout=5_000)
    assert "refused an update (HTTP 413, request too large)" in line.inner_text()
    assert [e for e in errors if "413" not in e] == []  # the 413 itself is expected here
    page.close()


def test_one_double_click_or_the_button_shows_the_whole_run(browser_context: Any,
                                                           base_url: str,
                                                           served: Path) -> None:
    """Issue 31: a double-click "to see all of it" did nothing (Plotly sent autorange, then
    autosize, and the second replaced the first). One double-click, and the "Whole run"
    button after a zoom, each show the whole run."""
    rel = LONG_RUN if (served / LONG_RUN).exists() else \
        _profile_with_most(served, lambda p: len(p.trace))
    page, errors = _open(browser_context, f"{base_url}/trace?profile={quote(rel)}")
    with popviz.open(served / rel) as profile:
        start, end = float(profile.trace["start"].min()), float(profile.trace["end"].max())
    whole = ("e => (document.querySelector('#trace-stats-head') || {}).innerText"
             ".includes(' to ' + e + ' ')")
    try:
        assert _head(page)[2] < end  # opens on a window, not the whole run
        page.wait_for_function(_SETTLED, timeout=30_000)  # its first figure drawn
        # a double-click autoranges: one relayout, nothing after it to replace it
        assert page.evaluate("() => document.querySelector('#trace-graph .js-plotly-plot')"
                             "._context.doubleClick") == "autosize"
        for _ in range(3):  # a loaded machine may see the two clicks as two single ones
            box = page.locator("#trace-graph .nsewdrag").first.bounding_box()
            page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            with contextlib.suppress(PlaywrightTimeout):
                page.wait_for_function(whole, arg=f"{end:,.0f}", timeout=15_000)
                break
        assert _head(page)[1:3] == (start, end)
        # a double-click on the whole run keeps it exactly (it padded the axis 5% each side)
        box = page.locator("#trace-graph .nsewdrag").first.bounding_box()
        page.mouse.dblclick(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_timeout(1_000)
        page.wait_for_function(_SETTLED, timeout=30_000)
        assert page.evaluate("() => document.querySelector('#trace-graph .js-plotly-plot')"
                             "._fullLayout.xaxis.range") == [start, end]
        # zoom into a tenth, then the button
        page.evaluate(f"""() => Plotly.relayout(document.querySelector(
            '#trace-graph .js-plotly-plot'), {{'xaxis.range[0]': {start},
            'xaxis.range[1]': {start + (end - start) / 10}}})""")
        page.wait_for_function(f"() => !(document.querySelector('#trace-stats-head') || "
                               f"{{}}).innerText.includes(' to {end:,.0f} ')",
                               timeout=30_000)
        page.click("#trace-whole")
        page.wait_for_function(whole, arg=f"{end:,.0f}", timeout=30_000)
        assert _head(page)[1:3] == (start, end)
        assert errors == [], errors
    finally:
        page.close()
