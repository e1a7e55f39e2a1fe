"""Links between views in a real browser, through `popviz serve` (issue 21): a liveness
step, a program-tree box and an operations row open /trace at that point, and a range
selected on /trace opens /operations and /liveness on it. Screenshots: links_*.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlparse

import pytest

import popviz
from popviz.analysis import links
from popviz.analysis.program_tree import program_tree
from popviz.analysis.trace_detail import pass_ops

from .conftest import SCREENSHOTS
from .test_analyser_browser import _click_slice
from .test_app_browser import _open, box_select_trace

pytestmark = pytest.mark.browser
REL = "rn50_pipeline/profile.h5"


@pytest.fixture
def rel(served: Path) -> str:
    if not (served / REL).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    return REL


def _shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"links_{name}.png"), full_page=True)


def _follow_to_trace(page: Any, link: str) -> dict[str, str]:
    """Click `link`; wait for /trace to draw the linked range; the link's query."""
    page.wait_for_selector(link, timeout=20_000)
    query = {k: v[0] for k, v in parse_qs(urlparse(
        page.get_attribute(link, "href")).query).items()}
    page.click(link)
    page.wait_for_function("() => ((document.querySelector('#trace-stats-head') || {})"
                           ".innerText || '').startsWith('Linked range')", timeout=60_000)
    return query


def _shown_range(page: Any) -> list[float]:
    """The trace's drawn x range, once the graph is drawn: the statistics head can say
    'Linked range' while the figure is still being replaced (seen under load)."""
    handle = page.wait_for_function(
        "() => { const g = document.querySelector('#trace-graph .js-plotly-plot');"
        " return g && g._fullLayout && g._fullLayout.xaxis && g._fullLayout.xaxis.range; }",
        timeout=60_000)
    return handle.json_value()


def _on_the_op(page: Any, span: tuple[float, float], end: float) -> None:
    """The trace shows the op itself, centred (issue 31: a link opened its whole pass, 5.8 M
    cycles), and outlined in the op lane."""
    lo, hi = _shown_range(page)
    assert lo <= span[0] + 1 and hi >= span[1] - 1
    assert abs((lo + hi) / 2 - (span[0] + span[1]) / 2) <= 0.05 * (hi - lo)
    assert hi - lo <= 25 * max(span[1] - span[0], 1) or hi - lo <= 1e-4 * end
    names = page.evaluate("() => document.querySelector('#trace-graph .js-plotly-plot')"
                          ".data.map(t => t.name || '')")
    assert any(n.endswith("(selected op)") for n in names), names


def test_liveness_step_opens_the_trace_there(browser_context: Any, base_url: str,
                                             served: Path, rel: str) -> None:
    page, errors = _open(browser_context, f"{base_url}/liveness?profile={quote(rel)}")
    graph = "#live-graph .js-plotly-plot"
    page.wait_for_selector(graph, timeout=180_000)  # after the first vetting
    # a real click on IPU1's peak star (its pixel from the axes)
    star = f"""() => {{ const g = document.querySelector('{graph}');
        const i = g.data.findIndex(d => d.name === 'peak' && d.xaxis === 'x2');
        const p = g.calcdata[i][0], L = g._fullLayout, b = g.getBoundingClientRect();
        return [b.left + L.xaxis2._offset + L.xaxis2.l2p(p.x),
                b.top + L.yaxis2._offset + L.yaxis2.l2p(p.y), p.x]; }}"""
    page.evaluate(f"() => window.scrollBy(0, ({star})()[1] - 450)")
    page.wait_for_timeout(300)
    x, y, step = page.evaluate(star)
    page.mouse.move(x, y)
    page.mouse.click(x, y)
    page.wait_for_selector("#live-trace-link", timeout=20_000)
    _shot(page, "liveness_step")
    q = _follow_to_trace(page, "#live-trace-link")
    with popviz.open(served / rel) as p:
        span = links.step_span(p.liveness, p.trace, 1, round(step))
    lo, hi = _shown_range(page)
    assert q["ipu"] == "1" and lo <= span[0] + 1 and hi >= span[1] - 1
    assert page.inner_text("#trace-stats-head").startswith("Linked range on IPU")
    _shot(page, "liveness_to_trace")
    assert errors == []
    page.close()


def test_tree_box_opens_the_trace_at_its_first_pass(browser_context: Any, base_url: str,
                                                    served: Path, rel: str) -> None:
    page, errors = _open(browser_context, f"{base_url}/tree?profile={quote(rel)}")
    page.wait_for_selector("#tree-graph g.slice", timeout=180_000)
    with popviz.open(served / rel) as p:
        tree = program_tree(p.ops)
        top = tree[(tree["parent"] == "model") & (tree["kind"] == "module")]
        label = str(top.sort_values("cycles").iloc[-1]["id"])
        ipu, span = links.module_span(p.ops, p.trace, label)
    _click_slice(page, label)
    q = _follow_to_trace(page, "#tree-to-trace")
    assert q["module"] == label and q["ipu"] == str(ipu)
    lo, hi = _shown_range(page)
    assert lo <= span[0] + 1 and hi >= span[1] - 1
    _shot(page, "tree_to_trace")
    assert errors == []
    page.close()


def test_operations_row_opens_the_trace_at_the_op(browser_context: Any, base_url: str,
                                                  served: Path, rel: str) -> None:
    page, errors = _open(browser_context, f"{base_url}/operations?profile={quote(rel)}")
    page.wait_for_selector("#ops-table .dash-spreadsheet", timeout=180_000)
    cell = page.locator("#ops-table td[data-dash-column='op']").nth(4)
    op_id = int(page.locator("#ops-table td[data-dash-column='op_id']").nth(4).inner_text()
                .replace(",", ""))
    cell.click()
    page.wait_for_selector("#ops-trace-link", timeout=20_000)
    _shot(page, "operations_row")
    q = _follow_to_trace(page, "#ops-trace-link")
    with popviz.open(served / rel) as p:
        ipu, span = links.op_span(p.ops, p.trace, op_id, pass_ops(p.ops))
    assert q["ipu"] == str(ipu) and q["op"] == str(op_id)
    _on_the_op(page, span, float(p.trace["end"].max()))
    _shot(page, "operations_to_trace")
    assert errors == []
    page.close()


def test_trace_selection_drives_operations_and_liveness(browser_context: Any, base_url: str,
                                                        served: Path, rel: str) -> None:
    page, errors = _open(browser_context, f"{base_url}/trace?profile={quote(rel)}")
    page.wait_for_selector("#trace-graph .js-plotly-plot", timeout=180_000)
    box_select_trace(page, 0.3, 0.1)
    page.wait_for_function("() => ((document.querySelector('#trace-links') || {})"
                           ".innerText || '').includes('selected range')", timeout=20_000)
    _shot(page, "trace_selection")
    href = page.get_attribute("#trace-to-ops", "href")
    q = {k: v[0] for k, v in parse_qs(urlparse(href).query).items()}
    live_href = page.get_attribute("#trace-to-liveness", "href")
    assert urlparse(live_href).query == urlparse(href).query  # the same range
    t0, t1 = float(q["t0"]), float(q["t1"])
    with popviz.open(served / rel) as p:
        want = int(links.ops_in_range(p.ops, p.trace, t0, t1).sum())
        steps = links.steps_in_range(p.liveness, p.trace, t0, t1)
    page.click("#trace-to-ops")
    page.wait_for_function("() => ((document.querySelector('#ops-note') || {}).innerText"
                           " || '').includes('linked from the trace')", timeout=60_000)
    assert page.inner_text("#ops-note").startswith(f"{want:,} of ")
    _shot(page, "trace_to_operations")
    page.goto(f"{base_url}{live_href}")  # the liveness link of the same selection
    page.wait_for_function("() => ((document.querySelector('#live-linked') || {})"
                           ".innerText || '').includes('linked from the trace')",
                           timeout=60_000)
    ipu, (first, last) = min(steps.items())
    graph = "#live-graph .js-plotly-plot"
    page.wait_for_function(f"() => {{ const g = document.querySelector('{graph}');"
                           " return g && g._fullLayout && g._fullLayout.xaxis; }",
                           timeout=30_000)
    shown = page.evaluate(f"() => document.querySelector('{graph}')._fullLayout.xaxis.range")
    if ipu == 0:
        assert shown[0] <= first and shown[1] >= last
        assert shown[1] - shown[0] <= (last - first) * 1.5 + 10
    _shot(page, "trace_to_liveness")
    assert errors == []
    page.close()


def test_the_find_box_lists_ops_and_opens_one_centred_and_outlined(
        browser_context: Any, base_url: str, served: Path, rel: str) -> None:
    """Typing a module in /trace's search box lists its ops (as many as the ops table
    holds); the first link opens the trace on that op, centred and outlined."""
    page, errors = _open(browser_context, f"{base_url}/trace?profile={quote(rel)}")
    page.wait_for_selector("#trace-graph .js-plotly-plot", timeout=180_000)
    page.fill("#trace-find", "layer2.1.conv2 pass:F")
    page.press("#trace-find", "Enter")
    page.wait_for_selector("#trace-found li a", timeout=30_000)
    _shot(page, "trace_find")
    with popviz.open(served / rel) as p:
        ops = p.ops
        want = [int(r["op_id"]) for r in ops.to_dict("records")
                if r["phase"] == "forward" and ("layer2.1.conv2" in str(r["module"]).lower()
                                                or "layer2.1.conv2" in str(r["op"]).lower())]
        first = page.get_attribute("#trace-found li a", "href")
        op_id = int(parse_qs(urlparse(first).query)["op"][0])
        ipu, span = links.op_span(p.ops, p.trace, op_id, pass_ops(p.ops))
    head = page.inner_text("#trace-found")
    assert want and f"{len(want):,} op(s) match" in head, (head, len(want))
    assert op_id == min(want)  # program order: the conv's forward op first
    q = _follow_to_trace(page, "#trace-found li a")
    assert q["op"] == str(op_id) and q["ipu"] == str(ipu)
    _on_the_op(page, span, float(p.trace["end"].max()))
    _shot(page, "trace_find_opened")
    assert errors == []
    page.close()


MEASURED = "tutorial_measured_2ranks/profile.h5"


def test_measured_operations_row_opens_the_trace_at_the_op(browser_context: Any,
                                                           base_url: str,
                                                           served: Path) -> None:
    """A CPU-measured run (ranks, ns from its first recorded step, thread lanes): the
    first op's link keeps inside the run (it asked for t0=-310,990) and /trace outlines the
    op's host slice (it outlined nothing)."""
    if not (served / MEASURED).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    page, errors = _open(browser_context, f"{base_url}/operations?profile={quote(MEASURED)}")
    page.wait_for_selector("#ops-table .dash-spreadsheet", timeout=180_000)
    op_id = int(page.locator("#ops-table td[data-dash-column='op_id']").first.inner_text()
                .replace(",", ""))
    page.locator("#ops-table td[data-dash-column='op']").first.click()
    q = _follow_to_trace(page, "#ops-trace-link")
    with popviz.open(served / MEASURED) as p:
        op = p.ops[p.ops["op_id"] == op_id].iloc[0]
    assert q["op"] == str(op_id) and q["ipu"] == str(op["ipu"]) and float(q["t0"]) >= 0
    lo, hi = _shown_range(page)
    assert lo == float(q["t0"]) and lo <= float(op["start"]) <= float(op["end"]) <= hi
    # each outlined bar's drawn start and end (calcdata: Plotly's own, decoded)
    lit = page.wait_for_function(
        "() => { const g = document.querySelector('#trace-graph .js-plotly-plot');"
        " return g.data.flatMap((t, i) => String(t.name).endsWith('(selected op)') ?"
        " g.calcdata[i].map(b => [b.s0, b.s1]) : []); }", timeout=30_000).json_value()
    assert lit == [[float(op["start"]), float(op["end"])]]
    assert page.locator("#trace-bsp").is_hidden()  # no BSP words for a measured run
    _shot(page, "measured_operations_to_trace")
    assert errors == []
    page.close()
