"""/tune in a real browser, through `popviz serve`: the table of what each AMP step trades
on each IPU (the profile's conv / matmul ops re-planned per AMP), read from the page, and
its figure drawn with one line per IPU. Screenshot: test-artifacts/screenshots/tune_amp.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from .conftest import SCREENSHOTS

pytestmark = pytest.mark.browser

PROFILE = "rn50_pipeline/profile.h5"  # a recorded ResNet-50, 4-IPU pipeline, AMP 0.15


def test_tune_page_reads_the_amp_steps(browser_context: Any, base_url: str,
                                       served: Path) -> None:
    if not (served / PROFILE).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{base_url}/tune?profile={quote(PROFILE)}")
        page.wait_for_selector("#tune-amp-table td[data-dash-column='Mcycles']",
                               timeout=60_000)
        page.wait_for_function("document.querySelector('#tune-amp-graph .main-svg') !== null",
                               timeout=60_000)
        rows = page.eval_on_selector_all(
            "#tune-amp-table tr", "trs => trs.map(tr => Object.fromEntries("
            "[...tr.querySelectorAll('td[data-dash-column]')].map("
            "td => [td.dataset.dashColumn, td.innerText.trim()])))")
        rows = [r for r in rows if r]
        lines = page.eval_on_selector(
            "#tune-amp-graph .js-plotly-plot", "el => (el.data || []).map(t => t.name)")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.locator("#tune-amp").screenshot(path=str(SCREENSHOTS / "tune_amp.png"))
    finally:
        page.close()
    assert not errors, errors
    ipus = sorted({r["ipu"] for r in rows})
    assert ipus == ["0", "1", "2", "3"] and lines == [f"IPU{i}" for i in ipus]
    number = {k: (lambda s: float(s.replace(",", ""))) for k in ("Mcycles", "temp_KiB")}
    changed = 0
    for ipu in ipus:
        mine = {r["amp"]: r for r in rows if r["ipu"] == ipu}
        assert {"0.1", "0.15", "0.2", "0.3", "0.4", "0.6"} <= set(mine)
        assert [r["in_force"] for r in mine.values()].count("in force") == 1
        low, high = mine["0.1"], mine["0.6"]
        # lowering AMP never plans faster nor fatter
        assert number["Mcycles"](low["Mcycles"]) >= number["Mcycles"](high["Mcycles"])
        assert number["temp_KiB"](low["temp_KiB"]) <= number["temp_KiB"](high["temp_KiB"])
        changed += number["temp_KiB"](low["temp_KiB"]) < number["temp_KiB"](high["temp_KiB"])
    assert changed >= 1  # AMP changes some IPU's plans, visibly
