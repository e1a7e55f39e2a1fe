"""Tables that fit (issue 31): the wide tables open on the columns a user reads first; every
other column is one tick away under "Toggle Columns", and comes back with its values; what
is hidden is still in the CSV. Through the real `popviz serve`; screenshot
tables_toggle.png (the column menu open over /operations)."""

from __future__ import annotations

import csv
import io
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import popviz

from .conftest import SCREENSHOTS
from .test_compare_page import _open

pytestmark = pytest.mark.browser
PROFILE = "rn50_pipeline/profile.h5"


def _headers(page: Any, table: str) -> list[str]:
    return page.eval_on_selector_all(f"#{table} th.dash-header",
                                     "els => els.map(e => e.dataset.dashColumn)")


def _show(page: Any, table: str, label: str) -> None:
    """Tick one column in the table's Toggle Columns menu, then close the menu."""
    page.click(f"#{table} .show-hide")
    item = page.locator(f"#{table} .show-hide-menu-item",
                        has=page.locator("label", has_text=label))
    item.locator("input[type=checkbox]").first.check()
    page.click(f"#{table} .show-hide")


def test_operations_opens_on_its_reading_columns_and_shows_the_rest_on_demand(
        browser: Any, base_url: str, served: Path) -> None:
    with popviz.open(served / PROFILE) as profile:
        ops = profile.table("ops")
    page, errors = _open(browser, f"{base_url}/operations?profile={quote(PROFILE)}")
    page.wait_for_selector("#ops-table td.dash-cell", timeout=90_000)
    shown = _headers(page, "ops-table")
    assert shown[:4] == ["op_id", "op", "op_class", "module"] and "cycles" in shown
    assert "tiles_used" not in shown and "host_ns" not in shown and "inputs" not in shown
    assert len(shown) < len(ops.columns) - 10, shown
    _show(page, "ops-table", "tiles used")
    page.wait_for_selector('#ops-table td[data-dash-column="tiles_used"]', timeout=10_000)
    assert "tiles_used" in _headers(page, "ops-table")
    first = page.eval_on_selector_all('#ops-table td[data-dash-column="tiles_used"]',
                                      "els => els.map(e => e.innerText.trim())")
    assert [int(t.replace(",", "")) for t in first] == ops["tiles_used"].head(len(first)).tolist()
    page.click("#ops-table .show-hide")
    page.screenshot(path=str(SCREENSHOTS / "tables_toggle.png"))
    # the download keeps every column, hidden or not
    href = page.get_attribute("#ops-csv", "href")
    with urllib.request.urlopen(base_url + href, timeout=60) as answer:
        header = next(csv.reader(io.StringIO(answer.read().decode())))
    assert {"host_ns", "inputs", "tiles_used", "cycles"} <= set(header)
    assert errors == []
    page.close()


def test_stages_keeps_the_split_points_in_view_and_hides_the_per_micro_batch_split(
        browser: Any, base_url: str) -> None:
    page, errors = _open(browser, f"{base_url}/stages?profile={quote(PROFILE)}")
    page.wait_for_selector("#stages-table td.dash-cell", timeout=90_000)
    shown = _headers(page, "stages-table")
    assert {"stage", "ipu", "forward_cycles", "first_layer", "last_layer"} <= set(shown)
    assert "forward_cycles_per_microbatch" not in shown and "num_ops" not in shown
    _show(page, "stages-table", "num ops")
    page.wait_for_selector('#stages-table td[data-dash-column="num_ops"]', timeout=10_000)
    counts = page.eval_on_selector_all('#stages-table td[data-dash-column="num_ops"]',
                                       "els => els.map(e => Number(e.innerText.replace(/,/g, '')))")
    assert len(counts) == 4 and all(c > 0 for c in counts)
    # long headers wrap rather than widen their column
    wrap = page.eval_on_selector("#stages-table th.dash-header",
                                 "e => getComputedStyle(e).whiteSpace")
    assert wrap == "normal"
    assert errors == []
    page.close()
