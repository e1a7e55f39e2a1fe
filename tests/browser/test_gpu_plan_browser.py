"""A GPU plan's pages in Chromium through the real `popviz serve`: each page loads without a
console or HTTP error and speaks of GPUs (no IPUs, no AMP, no tiles, no cycles), and its
trace shows its kernels inside each pass once zoomed in. Screenshots go to
test-artifacts/screenshots/ (gpu_plan_*.png)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from popviz.compiler import compile
from popviz.format.writer import write_report
from popviz.options import Options
from tooling.gpu_programs import gpu_program

from .conftest import SCREENSHOTS, serving
from .test_app_browser import _open, click_liveness_point
from .test_lanes_browser import _zoom

pytestmark = pytest.mark.browser
REL = "rn50_h100/profile.h5"
ZB_REL = "mlp_zb1p/profile.h5"
PAGES = ("/summary", "/trace", "/liveness", "/memory", "/stages", "/exchange", "/operations",
         "/tree")
# a GPU has none of these; the two sentences that say so are allowed
IPU_WORDS = re.compile(r"\b(IPU\d*|IPUs|AMP|availableMemoryProportion|tiles?|cycles)\b")
SAYS_SO = ("A GPU has no tiles", "availableMemoryProportion is an IPU compiler option")


@pytest.fixture(scope="module")
def gpu_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A served folder holding two plans: ResNet-50 at batch 16 on an H100 (plan mode), and
    a two-stage MLP pipelined over two H100s with Zero Bubble's ZB1P."""
    served = tmp_path_factory.mktemp("gpu_served")
    report = compile(gpu_program("resnet", 50, 16, "sgd"), Options(target="h100"))
    write_report(report, served / REL)
    zb = compile(gpu_program("pipe", 256, 32), Options(
        target="h100", splits=["stage1"], num_ipus=2, schedule="ZB1P",
        gradient_accumulation=6))
    write_report(zb, served / ZB_REL)
    yield from serving(served, tmp_path_factory)


def _ipu_words(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if not any(s in line for s in SAYS_SO)]
    return sorted({m.group(0) for line in lines for m in IPU_WORDS.finditer(line)})


@pytest.mark.parametrize("path", PAGES)
def test_every_page_of_a_gpu_plan_speaks_of_gpus(browser_context: Any, gpu_url: str,
                                                 path: str) -> None:
    page, errors = _open(browser_context, f"{gpu_url}{path}?profile={REL}")
    try:
        # a page's tables may fill a moment after its figures settle (/operations' rows and
        # headers, on a loaded machine): wait for the device's name before reading
        page.wait_for_function("() => /\\bgpu\\b/i.test(document.querySelector('#page')"
                               ".innerText)", timeout=30_000)
        text = page.inner_text("#page")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"gpu_plan_{path.strip('/')}.png"),
                        full_page=True)
        assert not errors, errors
        assert re.search(r"\bgpu\b", text, re.IGNORECASE)
        assert _ipu_words(text) == [], (path, _ipu_words(text))
    finally:
        page.close()


def test_the_trace_of_a_gpu_plan_shows_kernels_when_zoomed(browser_context: Any,
                                                           gpu_url: str) -> None:
    """Zoomed into the forward pass, the op lanes hold the plan's kernels (conv, norm)."""
    page, errors = _open(browser_context, f"{gpu_url}/trace?profile={REL}")
    try:
        # the forward pass of a one-GPU plan starts after the input's host copy: its first
        # two milliseconds hold the stem's kernels
        _zoom(page, 0, 2e6)
        page.wait_for_function("""() => {
            const g = document.querySelector('#trace-graph .js-plotly-plot');
            return g && g.data && g.data.some(t => (t.name || '').startsWith('op: '));
        }""", timeout=20_000)
        names = page.evaluate("""() => document.querySelector('#trace-graph .js-plotly-plot')
            .data.map(t => t.name || '')""")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "gpu_plan_trace_zoomed.png"))
        assert {"op: conv", "op: norm"} <= set(names), names
        assert not errors, errors
    finally:
        page.close()



def test_a_zero_bubble_plan_shows_its_deferred_weight_gradients(browser_context: Any,
                                                                gpu_url: str) -> None:
    """ZB1P's W actions are drawn apart from B (their own legend entry, labelled W), and
    zoomed into one of them the op lanes hold the weight-gradient matmuls."""
    page, errors = _open(browser_context, f"{gpu_url}/trace?profile={ZB_REL}")
    try:
        graph = "document.querySelector('#trace-graph .js-plotly-plot')"
        page.wait_for_function(f"() => {graph} && {graph}.data", timeout=20_000)
        # _fullData: the arrays as Plotly decoded them (data may hold them base64-typed)
        bars = page.evaluate(f"""() => {graph}._fullData
            .filter(t => (t.name || '').includes('weight gradients (W)'))
            .map(t => ({{base: Array.from(t.base), x: Array.from(t.x),
                        text: Array.from(t.text || [])}}))""")
        assert len(bars) == 1 and len(bars[0]["base"]) == 2 * 6, bars
        assert all(label.startswith("W") for label in bars[0]["text"])
        # the lanes are the GPU's streams: its sends on the NCCL stream, no "exchange"
        lanes = page.evaluate(f"() => Array.from({graph}.layout.yaxis.ticktext)")
        assert {"GPU 0 · compute stream", "GPU 1 · compute stream",
                "NCCL stream"} <= set(lanes), lanes
        assert "exchange" not in lanes and "sync" not in lanes, lanes
        # the last W of the second stage: zoom onto it alone
        widest = max(range(len(bars[0]["x"])), key=lambda i: bars[0]["base"][i])
        lo = bars[0]["base"][widest]
        _zoom(page, lo, lo + bars[0]["x"][widest])
        page.wait_for_function(f"""() => {graph}.data.some(
            t => (t.name || '').startsWith('op: '))""", timeout=20_000)
        names = page.evaluate(f"() => {graph}.data.map(t => t.name || '')")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "gpu_plan_zero_bubble_w.png"))
        assert "op: matmul" in names, names
        assert not errors, errors
    finally:
        page.close()


def test_a_click_on_a_gpu_plans_liveness_lists_its_tensors(browser_context: Any,
                                                           gpu_url: str) -> None:
    """A GPU plan has no tile heat map, so no IPU picker: a click on its curve (away from
    the peak the page opens on) lists the tensors live there, with no Dash error about the
    missing picker."""
    page, errors = _open(browser_context, f"{gpu_url}/liveness?profile={REL}")
    try:
        graph = "#live-graph .js-plotly-plot"
        star = f"""() => {{ const g = document.querySelector('{graph}');
            const i = g.data.findIndex(d => d.name.startsWith('activations'));
            const c = g.calcdata[i], p = c[Math.floor(c.length / 4)];
            const L = g._fullLayout, b = g.getBoundingClientRect();
            return [b.left + L.xaxis._offset + L.xaxis.l2p(p.x),
                    b.top + L.yaxis._offset + L.yaxis.l2p(p.y)]; }}"""
        click_liveness_point(page, star)
        assert page.inner_text("#live-vars-head").startswith("GPU 0, step")
        assert page.locator("#live-vars-box td").count() > 0
        assert page.locator("#live-ipu").count() == 0
        page.wait_for_timeout(500)  # a Dash error would reach the console after the update
        assert not errors, errors
    finally:
        page.close()
