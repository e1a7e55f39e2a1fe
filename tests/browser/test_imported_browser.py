"""An imported H100 trace in a real browser: its trace opens zoomed out (buckets), and Box
Select still gives the range's statistics by op class, host op and kernel."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import popviz
from tests.import_fixtures import RESNET

from .test_app_browser import _open, box_select_trace

pytestmark = pytest.mark.browser


def test_box_select_on_a_zoomed_out_import(browser_context: Any, base_url: str,
                                           served: Path) -> None:
    folder = served / "imported_rn"  # served only for this test: others count profiles
    popviz.import_trace([RESNET], folder)
    try:
        page, errors = _open(browser_context,
                             f"{base_url}/trace?profile=imported_rn/profile.h5")
        # the zoomed-out view: short slices and kernels merged per pixel
        assert "merged per pixel" in page.inner_text("#trace-status")
        box_select_trace(page, 0.45, 0.1)
        heads = page.locator("#trace-stats h3").all_inner_texts()
        assert "Compute by op class (measured GPU time)" in heads
        assert "Top kernels (measured GPU time)" in heads
        ops = page.locator("#trace-stats-top td[data-dash-column='op']").all_inner_texts()
        assert ops and all(op.startswith("aten::") for op in ops)
        assert errors == []
        page.close()
    finally:
        shutil.rmtree(folder)


def test_a_tall_trace_keeps_its_title_above_the_legend(browser_context: Any, base_url: str,
                                                       served: Path) -> None:
    """A job of 12 ranks draws about 90 lanes: its title stays at the figure's top, clear
    of the legend above the plot (at 0.98 of the height it fell under the legend)."""
    from tests.bench_util import load_bench

    folder = served / "imported_job"
    paths = load_bench("bench_import").write_traces(served / "job_traces", 12, 300)
    popviz.import_trace(paths, folder)
    try:
        page, errors = _open(browser_context,
                             f"{base_url}/trace?profile=imported_job/profile.h5")
        boxes = page.evaluate("""() => {
            const g = document.querySelector('#trace-graph .js-plotly-plot');
            const box = e => { const r = e.getBoundingClientRect();
                               return [r.top, r.bottom, r.height]; };
            return {title: box(g.querySelector('.gtitle')),
                    legend: box(g.querySelector('.legend')),
                    height: g.getBoundingClientRect().height}; }""")
        assert boxes["height"] > 1200, boxes  # a tall figure
        assert boxes["title"][1] <= boxes["legend"][0] + 1, boxes
        assert errors == []
        page.close()
    finally:
        shutil.rmtree(folder)
        shutil.rmtree(served / "job_traces")
