"""/compare's op-by-op table and merged liveness overlay in Chromium, through the real
`popviz serve` (waitress): changing the group-by selector regroups the table as the
analysis does, a column sorts, the overlay switches to the whole-device peak. Screenshot
saved to test-artifacts/screenshots/compare_ops.png (table and bars) and
compare_overlay.png (every device of both sides)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import popviz
from popviz.analysis.compare import compare
from popviz.analysis.compare.ops import GROUP_BY, compare_ops, time_unit

from .conftest import SCREENSHOTS
from .test_compare_page import _open, _pair

pytestmark = pytest.mark.browser
ROWS = 15  # the table's page size


def _column(page: Any, name: str) -> list[str]:
    return page.eval_on_selector_all(
        f'#compare-ops-table td[data-dash-column="{name}"]', "els => els.map(e => "
        "e.innerText.trim())")


def _wait_header(page: Any, name: str, timeout: int = 60_000) -> None:
    page.wait_for_selector(f'#compare-ops-table th[data-dash-column="{name}"]',
                           timeout=timeout)


def test_group_by_regroups_the_table(browser: Any, base_url: str, served: Path) -> None:
    a, b = _pair(served)
    with popviz.open(served / a) as pa, popviz.open(served / b) as pb:
        comp = compare(pa, pb)
        want = {by: compare_ops(pa, pb, comp, by=by) for by in ("op", "class", "pass")}
    page, errors = _open(browser, f"{base_url}/compare?profile={quote(a)}&other={quote(b)}")
    _wait_header(page, GROUP_BY["op"], 150_000)  # a cold server vets, opens and compares
    assert _column(page, GROUP_BY["op"]) == want["op"].table["group"].head(ROWS).tolist()
    for by in ("class", "pass"):
        page.click("#compare-ops-by")
        page.locator("[role=option]", has_text=GROUP_BY[by]).first.click()
        _wait_header(page, GROUP_BY[by])
        page.wait_for_load_state("networkidle")
        assert _column(page, GROUP_BY[by]) == want[by].table["group"].head(ROWS).tolist()
    # the bars follow the selector: the pass groups, largest difference first
    bars = page.eval_on_selector("#compare-ops-diff .js-plotly-plot",
                                 "e => Array.from(e.data[0].y)")
    assert bars == want["pass"].table["group"].tolist()
    # a number column sorts as numbers (Dash's native sort, ascending first)
    _, unit = time_unit(want["pass"].per)
    col = f"A {unit}"
    page.click(f'#compare-ops-table th[data-dash-column="{col}"] .column-header--sort')
    page.wait_for_timeout(300)
    shown = [float(v.replace(",", "")) for v in _column(page, col) if v]
    assert shown == sorted(shown) and len(shown) >= 2
    # the overlay: every device of both sides, then one whole-device peak curve each
    ipus = int(comp.liveness.groupby("side")["ipu"].nunique().sum())
    count = "document.querySelector('#compare-overlay .js-plotly-plot').data.length"
    assert page.evaluate(count) == ipus
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#compare-overlay").screenshot(path=str(SCREENSHOTS / "compare_overlay.png"))
    page.locator("#compare-overlay-mode label", has_text="whole-device peak").click()
    page.wait_for_function(f"{count} === 2", timeout=60_000)
    dashes = page.evaluate("Array.from(document.querySelector('#compare-overlay "
                           ".js-plotly-plot').data, t => t.line.dash)")
    assert dashes == ["solid", "dash"]
    assert page.locator(".message.error").count() == 0
    page.evaluate("document.getElementById('compare-ops-by').scrollIntoView()")
    page.evaluate("window.scrollBy(0, -120)")  # below the sticky menu bar
    page.screenshot(path=str(SCREENSHOTS / "compare_ops.png"))
    assert errors == []
    page.close()
