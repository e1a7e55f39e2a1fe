"""The allocation view of /memory in a real browser, through `popviz serve`: the real H100
ResNet-50 snapshot imported with its trace; a click on a block's band shows its stack."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import popviz
from tests.import_fixtures import RESNET, SNAPSHOT

from .conftest import SCREENSHOTS
from .test_app_browser import _open

pytestmark = pytest.mark.browser

# the page position of a drawn band's hover point (the middle one in block order), from
# Plotly's own axes: the point carries the block id a click sends
BAND_POINT = """() => {
    const gd = document.querySelector('#alloc-blocks .js-plotly-plot');
    const tr = gd._fullData[gd._fullData.length - 1];
    const L = gd._fullLayout, box = gd.getBoundingClientRect();
    const ids = [];
    for (let i = 0; i < tr.x.length; i++) { if (tr.customdata[i] >= 0) ids.push(i); }
    const i = ids[Math.floor(ids.length / 2)];
    return {x: box.left + L._size.l + L.xaxis.l2p(tr.x[i]),
            y: box.top + L._size.t + L.yaxis.l2p(tr.y[i]), block: tr.customdata[i]};
}"""


def test_allocation_view_click_shows_a_block_stack(browser_context: Any, base_url: str,
                                                    served: Path) -> None:
    folder = served / "alloc_rn"  # served only for this test: others count profiles
    popviz.import_trace([RESNET], folder, memory_snapshot=[SNAPSHOT])
    try:
        page, errors = _open(browser_context,
                             f"{base_url}/memory?profile=alloc_rn/profile.h5")
        page.wait_for_selector("#alloc-blocks .js-plotly-plot", timeout=30_000)
        assert "Peak allocated" in page.inner_text("#alloc-summary")
        assert "largest blocks drawn" in page.inner_text("#alloc-status")
        page.screenshot(path=str(SCREENSHOTS / "alloc_memory.png"), full_page=True)
        point = page.evaluate(BAND_POINT)
        page.mouse.move(point["x"], point["y"])
        page.mouse.click(point["x"], point["y"])
        page.wait_for_selector("#alloc-block-head", timeout=20_000)
        head = page.inner_text("#alloc-block-head")
        assert head.startswith(f"Block {point['block']}: ")
        # this snapshot is of another run: its blocks are not on the trace's clock
        assert page.locator("#alloc-trace-link").count() == 0
        if page.locator("#alloc-frames").count():
            assert ".py:" in page.inner_text("#alloc-frames")
        page.locator("#alloc-block").screenshot(path=str(SCREENSHOTS / "alloc_block.png"))
        page.screenshot(path=str(SCREENSHOTS / "alloc_memory_clicked.png"), full_page=True)
        assert errors == []
        page.close()
    finally:
        shutil.rmtree(folder)
