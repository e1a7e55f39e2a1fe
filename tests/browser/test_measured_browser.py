"""A measured profile (the measure layer's example) in a real browser: the drawn SVG and the
page text say ranks and ns, never IPUs or cycles; /stages says nothing of AMP."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from .conftest import SCREENSHOTS
from .test_app_browser import _open

pytestmark = pytest.mark.browser
REL = "tutorial_measured_2ranks/profile.h5"


def _svg_text(page: Any, selector: str) -> list[str]:
    """Text of SVG nodes (ticks, titles) under `selector`: text_content, not inner_text."""
    return page.eval_on_selector_all(selector, "els => els.map(e => e.textContent)")


def _page(browser_context: Any, base_url: str, served: Path, path: str) -> tuple[Any, list]:
    assert (served / REL).exists(), f"{REL} is not in profiles/"  # committed: fail, not skip
    return _open(browser_context, f"{base_url}{path}?profile={quote(REL)}")


def _no_modelled_words(page: Any, allowed: str = "") -> None:
    words = page.inner_text("#page") + " ".join(_svg_text(page, ".main-svg text"))
    words = words.replace(allowed, "") if allowed else words
    assert "IPU" not in words and "cycles" not in words


def test_measured_trace_says_ranks_and_ns(browser_context: Any, base_url: str,
                                          served: Path) -> None:
    page, errors = _page(browser_context, base_url, served, "/trace")
    ticks = _svg_text(page, "#trace-graph .ytick text")  # lanes: "rank 0 · compute", "sync", ...
    assert [t.split(" · ")[0] for t in ticks if " · " in t] == ["rank 0", "rank 1"]
    assert _svg_text(page, "#trace-graph .xtitle") == ["time (ns)"]
    assert page.inner_text("#trace-status").split(":")[0].endswith(" ns")
    _no_modelled_words(page)
    assert errors == []
    page.close()


def test_measured_exchange_says_ranks_and_ns(browser_context: Any, base_url: str,
                                             served: Path) -> None:
    page, errors = _page(browser_context, base_url, served, "/exchange")
    assert _svg_text(page, "#exchange-matrix .xtick text") == ["rank 0", "rank 1"]
    assert sorted(_svg_text(page, "#exchange-matrix .ytick text")) == ["rank 0", "rank 1"]
    assert _svg_text(page, "#exchange-time .xtitle") == ["time (ns)"]
    headers = page.locator("#exchange-kinds th").all_inner_texts()
    assert "ns" in [h.strip() for h in headers]
    _no_modelled_words(page)
    assert errors == []
    page.close()


def test_measured_exchange_shows_what_crosses_each_stage_boundary(
        browser_context: Any, base_url: str, served: Path) -> None:
    import popviz
    from popviz.analysis.exchange import stage_links

    with popviz.open(served / REL) as profile:
        want = stage_links(profile.table("p2p"), profile.exchange)
    page, errors = _page(browser_context, base_url, served, "/exchange")
    page.wait_for_selector("#exchange-stages .xtick text", timeout=30_000)
    assert _svg_text(page, "#exchange-stages .xtick text") == ["stage 0", "stage 1"]
    hover = page.evaluate("() => document.querySelector('#exchange-stages .js-plotly-plot')"
                          ".data[0].customdata")
    assert "stage 0 → stage 1" in hover[0][1] and "receiver waited" in hover[0][1]
    kinds = page.locator("#exchange-stage-links td[data-dash-column='kind']").all_inner_texts()
    counts = page.locator("#exchange-stage-links td[data-dash-column='transfers']")
    assert kinds == want["kind"].tolist()
    assert [int(c) for c in counts.all_inner_texts()] == want["transfers"].tolist()
    page.screenshot(path=str(SCREENSHOTS / "measured_stage_links.png"), full_page=True)
    _no_modelled_words(page)
    assert errors == []
    page.close()


def test_measured_stages_has_no_amp_chart(browser_context: Any, base_url: str,
                                          served: Path) -> None:
    page, errors = _page(browser_context, base_url, served, "/stages")
    # a run has no compiler options: no AMP chart, nor a note about one
    assert page.locator("#stages-amp").count() == 0
    assert page.locator("#stages-amp-note").count() == 0
    page.wait_for_selector("#stages-time .xtick text", timeout=30_000)  # drawn, not settled
    assert _svg_text(page, "#stages-time .xtick text") == ["rank 0", "rank 1"]
    # host Python between ops is untraced, as on /trace and /compare, not other compute
    legend = _svg_text(page, "#stages-time .legendtext")
    assert "untraced (no event)" in legend and "other compute" not in legend
    _no_modelled_words(page)
    assert "availableMemoryProportion" not in page.inner_text("#page")
    # the ranks side by side: one heat map row per rank, the straggler verdict beside it
    page.wait_for_selector("#stages-ranks .main-svg", timeout=30_000)
    rows = _svg_text(page, "#stages-ranks .ytick text")
    assert sorted(rows) == ["rank 0 · stage 0", "rank 1 · stage 1"], rows
    assert "no rank has peers" in page.inner_text("#stages-stragglers")
    page.locator("#stages-ranks").screenshot(path=str(SCREENSHOTS / "measured_ranks.png"))
    assert errors == []
    page.close()


def test_compare_modelled_with_measured_names_each_side(browser_context: Any, base_url: str,
                                                        served: Path) -> None:
    modelled = "tutorial_pipelined/training/profile.h5"
    assert (served / REL).exists() and (served / modelled).exists(), "example profiles missing"
    page, errors = _open(browser_context, f"{base_url}/compare?profile={quote(modelled)}"
                         f"&other={quote(REL)}")
    page.wait_for_selector("#compare-verdict", timeout=60_000)
    a, b = page.inner_text("#compare-side-A"), page.inner_text("#compare-side-B")
    assert "4 IPUs x " in a and "2 ranks x " in b and "THROUGHPUT PER RANK" in b.upper()
    assert "rank" not in a and "IPU" not in b.replace("B: tutorial", "")
    ticks = _svg_text(page, "#compare-ipu-time .xtick text")
    assert "rank 1" in ticks and "IPU0" in ticks
    page.screenshot(path=str(SCREENSHOTS / "compare_measured.png"), full_page=True)
    assert errors == []
    page.close()


def test_measured_memory_without_a_snapshot_draws_the_traces_counters(
        browser_context: Any, base_url: str, served: Path) -> None:
    page, errors = _page(browser_context, base_url, served, "/memory")
    page.wait_for_selector("#mem-counters .main-svg", timeout=30_000)
    legend = _svg_text(page, "#mem-counters .legendtext")
    assert sorted(legend) == ["rank 0", "rank 1"], legend
    page.locator("#mem-counters").screenshot(path=str(SCREENSHOTS / "measured_counters.png"))
    _no_modelled_words(page)
    assert errors == []
    page.close()
