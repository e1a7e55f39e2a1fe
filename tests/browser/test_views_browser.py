"""Issue 21's interactions through `popviz serve` (waitress): the ops table's filters
(a cell it cannot read is named and skipped; the CSV is what is shown), its grouped view,
the program tree in program order, /memory's clicked tile, /liveness's IPU-linked heat
map. Screenshots go to test-artifacts/screenshots/views_*.png."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from .conftest import SCREENSHOTS
from .test_analyser_browser import _modelled_with_ops
from .test_app_browser import _open, click_liveness_point

pytestmark = pytest.mark.browser


def _shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"views_{name}.png"), full_page=True)


def _filter(page: Any, column: str, typed: str) -> str:
    """Type `typed` in `column`'s filter cell; the note once the table has answered."""
    before = page.inner_text("#ops-note")
    cell = page.locator(f'th.dash-filter[data-dash-column="{column}"] input').first
    cell.click()
    cell.fill(typed)
    cell.press("Enter")
    page.wait_for_function("b => document.querySelector('#ops-note').innerText != b",
                           arg=before, timeout=20_000)
    return page.inner_text("#ops-note")


def _cycles(page: Any) -> list[float]:
    shown = page.locator('#ops-table td[data-dash-column="cycles"]').all_inner_texts()
    return [float(s.replace(",", "")) for s in shown]


def _count(note: str) -> int:
    found = re.match(r"^([\d,]+) of ([\d,]+) ops", note)
    assert found, note
    return int(found[1].replace(",", ""))


def test_ops_filters_survive_a_cell_they_cannot_read(browser_context: Any, base_url: str,
                                                     served: Path) -> None:
    rel = _modelled_with_ops(served)
    page, errors = _open(browser_context, f"{base_url}/operations?profile={quote(rel)}")
    page.wait_for_selector("#ops-table .dash-spreadsheet")
    # two bounds in one cell are understood
    note = _filter(page, "cycles", ">1e5 and <2e5")
    assert "not understood" not in note, note
    values = _cycles(page)
    assert values and all(1e5 < v < 2e5 for v in values), values[:5]
    # syntax it cannot read: one line naming it, the rows stay (no cycles filter)
    note = _filter(page, "cycles", ">1e5 or <2e5")
    assert "not understood" in note and "or <2e5" in note, note
    everything = _count(note)
    assert everything > 0 and len(_cycles(page)) > 0
    _shot(page, "ops_bad_filter")
    # a later filter in another column still applies
    note = _filter(page, "op", "conv")
    assert "not understood" in note and 0 < _count(note) < everything, note
    ops = page.locator('#ops-table td[data-dash-column="op"]').all_inner_texts()
    assert ops and all("conv" in o.lower() for o in ops), ops[:5]
    # the CSV is the filtered rows, sorted as shown
    page.locator('#ops-table th.dash-header[data-dash-column="cycles"] .column-header--sort')\
        .first.click()
    page.wait_for_function("() => decodeURIComponent(document.querySelector('#ops-csv')"
                           ".href).includes('sort=')", timeout=20_000)
    href = page.get_attribute("#ops-csv", "href")
    got = page.request.get(base_url + href)
    assert got.status == 200
    rows = list(csv.DictReader(io.StringIO(got.text())))
    assert len(rows) == _count(page.inner_text("#ops-note"))
    assert all("conv" in r["op"].lower() for r in rows)
    cycles = [float(r["cycles"]) for r in rows]
    assert cycles == sorted(cycles) or cycles == sorted(cycles, reverse=True)
    assert errors == []
    page.close()


def test_ops_grouped_by_op_class(browser_context: Any, base_url: str, served: Path) -> None:
    rel = _modelled_with_ops(served)
    page, errors = _open(browser_context, f"{base_url}/operations?profile={quote(rel)}")
    page.wait_for_selector("#ops-table .dash-spreadsheet")
    page.click("#ops-group-by")
    page.locator("[role=option]", has_text="class").first.click()  # a portal
    page.wait_for_selector("#ops-groups-table .dash-spreadsheet", timeout=20_000)
    shares = page.locator('#ops-groups-table td[data-dash-column="share"]').all_inner_texts()
    counts = page.locator('#ops-groups-table td[data-dash-column="count"]').all_inner_texts()
    assert shares and all(s.endswith("%") for s in shares)
    assert sum(int(c.replace(",", "")) for c in counts) == _count(page.inner_text("#ops-note"))
    _shot(page, "ops_grouped")
    assert errors == []
    page.close()


def test_program_tree_in_program_order_with_split_names(browser_context: Any, base_url: str,
                                                        served: Path) -> None:
    rel = "effnet_b4_pipeline/profile.h5"
    if not (served / rel).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    page, errors = _open(browser_context, f"{base_url}/tree?profile={quote(rel)}")
    page.wait_for_selector("#tree-graph g.slice")
    boxes = page.evaluate("""() => [...document.querySelectorAll('#tree-graph g.slice')]
        .map(s => { const t = s.querySelector('text'); const r = s.getBoundingClientRect();
                    return [t ? (t.querySelector('tspan') || t).textContent : '', r.y]; })""")
    where = {label: y for label, y in boxes}
    numbered = sorted((int(label.split(" ")[0]), y) for label, y in boxes
                      if re.match(r"^\d+ · block", label))
    assert len(numbered) >= 12, boxes[:20]
    ys = [y for _, y in numbered]
    assert ys == sorted(ys), numbered  # 0, 1, 2, ... 10 down the page, not 0, 1, 10, 11
    assert "3 · block2b" in where
    heads = [y for label, y in boxes if label.startswith("head")]
    blocks = [y for label, y in boxes if label.startswith("blocks")]
    assert heads and blocks and heads[0] > blocks[0]  # the head after the blocks
    slice_ = page.locator("#tree-graph g.slice", has_text="3 · block2b").first
    slice_.hover()
    page.wait_for_selector("#tree-graph .hovertext", timeout=10_000)
    hover = page.eval_on_selector("#tree-graph .hovertext", "e => e.textContent")
    assert "of the step's compute (40 micro-batches" in hover, hover
    assert "split names block2b" in hover and "stage 0 starts at" in hover, hover
    _shot(page, "tree_program_order")
    assert errors == []
    page.close()


def test_clicking_any_tile_lists_what_is_on_it(browser_context: Any, base_url: str,
                                               served: Path) -> None:
    rel = "rn50_pipeline/profile.h5"
    if not (served / rel).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    page, errors = _open(browser_context, f"{base_url}/memory?profile={quote(rel)}")
    page.wait_for_selector("#mem-map .g-ytitle", timeout=30_000)  # drawn, not just settled
    ticks = page.eval_on_selector_all("#mem-map .ytick text", "e => e.map(t => t.textContent)")
    title = page.eval_on_selector("#mem-map .g-ytitle", "e => e.textContent")
    assert "first tile of the row" in title and ticks[:2] == ["0", str(int(ticks[1]))]
    assert int(ticks[1]) % 64 == 0  # tile numbers, as the title says
    assert "colours from" in page.eval_on_selector("#mem-map .gtitle", "e => e.textContent")
    before = page.inner_text("#mem-tile-head")
    area = page.locator("#mem-map .nsewdrag").first
    area.scroll_into_view_if_needed()
    box = area.bounding_box()
    spot = {"x": box["width"] * 0.3, "y": box["height"] * 0.6}
    area.hover(position=spot)
    area.click(position=spot)
    page.wait_for_function("b => document.querySelector('#mem-tile-head').innerText != b",
                           arg=before, timeout=20_000)
    head = page.inner_text("#mem-tile-head")
    assert re.match(r"IPU0 tile \d+: not-always-live peak [\d.,]+ \w+ at step \d+", head), head
    assert "What is on it" in page.inner_text("#mem-breakdown")
    names = page.locator("#mem-tile-vars td[data-dash-column='name']").all_inner_texts()
    assert names, "no variables listed for a tile that fits"
    # the tile's own bytes of each variable (format 1.3), never a whole-IPU size
    note = page.inner_text("#mem-breakdown")
    assert re.search(r"What is on it at step \d+: [\d,]+ variables, [\d.,]+ \w+ on this tile",
                     note), note
    here = [int(b.replace(",", "")) for b in page.locator(
        "#mem-tile-vars td[data-dash-column='bytes']").all_inner_texts()]
    assert here and max(here) <= 638_976, here  # one Mk2 tile
    assert page.locator("#mem-tile-vars td[data-dash-column='of']").count() == len(here)
    _shot(page, "memory_tile")
    assert errors == []
    page.close()


def test_liveness_per_ipu_axes_and_a_heat_map_that_follows(browser_context: Any,
                                                           base_url: str, served: Path) -> None:
    rel = "rn50_pipeline/profile.h5"
    if not (served / rel).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    page, errors = _open(browser_context, f"{base_url}/liveness?profile={quote(rel)}")
    graph = "#live-graph .js-plotly-plot"
    # the fold note is drawn inside the figure
    inside = page.evaluate(f"""() => {{ const g = document.querySelector('{graph}');
        const n = [...g.querySelectorAll('.annotation')].find(a =>
            a.textContent.includes('folded'));
        if (!n) return null; const r = n.getBoundingClientRect(),
            f = g.getBoundingClientRect(); return r.bottom <= f.bottom && r.top >= f.top; }}""")
    assert inside is True
    axes = page.evaluate(f"() => Object.keys(document.querySelector('{graph}')._fullLayout)"
                         ".filter(k => /^xaxis\\d*$/.test(k)).length")
    assert axes >= 4  # one x-axis per IPU
    assert page.evaluate(f"() => document.querySelector('{graph}').data"
                         ".filter(d => d.name === 'peak').length") >= 4
    text = page.inner_text("#live-stash")
    assert "IPU0 7 micro-batches x" in text
    # click IPU2's curve: its variables, and the heat map switches to IPU2
    before = page.text_content("#tile-live-graph .gtitle")
    # a real click on IPU2's peak star (its pixel from the axes)
    star = f"""() => {{ const g = document.querySelector('{graph}');
        const i = g.data.findIndex(d => d.name === 'peak' && d.xaxis === 'x3');
        const p = g.calcdata[i][0], L = g._fullLayout, b = g.getBoundingClientRect();
        return [b.left + L.xaxis3._offset + L.xaxis3.l2p(p.x),
                b.top + L.yaxis3._offset + L.yaxis3.l2p(p.y)]; }}"""
    click_liveness_point(page, star)
    page.wait_for_function("b => document.querySelector('#tile-live-graph .gtitle')"
                           ".textContent != b", arg=before, timeout=20_000)
    assert page.text_content("#tile-live-graph .gtitle").endswith("IPU2")
    assert page.inner_text("#live-vars-head").startswith("IPU2, step")
    names = page.locator("#live-vars-box td[data-dash-column='name']").all_inner_texts()
    assert len(names) == len(set(names)), "duplicate rows in the variables list"
    # zoom IPU2's panel: the heat map's steps follow
    page.evaluate(f"""() => Plotly.relayout(document.querySelector('{graph}'),
        {{'xaxis3.range[0]': 40, 'xaxis3.range[1]': 90}})""")
    page.wait_for_function("""() => { const g = document.querySelector(
        '#tile-live-graph .js-plotly-plot'); const r = g && g._fullLayout.yaxis.range;
        return r && Math.min(...r) >= 35 && Math.max(...r) <= 95; }""", timeout=20_000)
    _shot(page, "liveness_ipu2")
    assert errors == []
    page.close()
