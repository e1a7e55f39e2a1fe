"""The analyser's callbacks called directly on the bundled profiles: range statistics of a
selection, a program-tree click, the ops table opened filtered to a module, a tune plan
opened on /compare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dash
import pytest
from popviz_app import create_app

from tests.dash_util import component_text

ROOT = Path(__file__).resolve().parents[1] / "profiles"
REL = "rn50_recompute/profile.h5"


@pytest.fixture(scope="module")
def app() -> Any:
    if not (ROOT / REL).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    return create_app(ROOT)


def test_selected_range_statistics(app: Any) -> None:
    stats = app.popviz_callbacks["trace.stats"]
    panel = stats([1e6, 3e6], None, f"?profile={REL}")
    text = " ".join(component_text(c) for c in panel)
    assert "Selected range: 1,000,000 to 3,000,000 cycles (2,000,000 cycles)" in text
    assert "Compute by op class" in text and "Top ops" in text


def test_tree_click_lists_the_module_ops(app: Any) -> None:
    pick = app.popviz_callbacks["tree.pick"]
    panel, figure, level = pick({"points": [{"id": "layer2"}]}, "model", f"?profile={REL}")
    text = " ".join(component_text(c) for c in panel)
    assert text.startswith("layer2: ") and "ops of layer2 in Operations" in text
    # the icicle now holds the window below layer2 (and the path back up), viewed from it
    icicle = figure.data[0]
    ids = list(icicle.ids)
    assert level == icicle.level == "layer2" and {"model", "layer2"} <= set(ids)
    assert all(i in ("model", "layer2") or i.startswith(("layer2.", "layer2/")) for i in ids)
    child = next(i for i in ids if i.startswith("layer2.") and "/" not in i)
    # an op (a leaf) lists its ops and leaves the view where it is
    leaf = next(i for i in ids if "/" in i and i.startswith("layer2."))
    panel, figure, level = pick({"points": [{"id": leaf}]}, "layer2", f"?profile={REL}")
    assert figure is dash.no_update and level == "layer2"
    assert component_text(panel[0]).startswith(leaf)
    # the viewed node's own box goes up to its parent, as Plotly does
    _, figure, level = pick({"points": [{"id": child}]}, child, f"?profile={REL}")
    assert level == "layer2" == figure.data[0].level
    # a box of the path bar (an ancestor) goes to it
    _, figure, level = pick({"points": [{"id": "model"}]}, child, f"?profile={REL}")
    assert level == "model" and figure.data[0].level is None
    assert {"layer1", "layer3"} <= set(figure.data[0].ids)  # layer2's siblings are back


def test_operations_open_filtered_to_a_module(app: Any) -> None:
    cb = app.popviz_callbacks
    query = cb["operations.from_url"](None, f"?profile={REL}&module=layer2.1")
    rows, _, note = cb["operations.refresh"](0, 500, [], query, f"?profile={REL}")
    assert rows and all(r["module"] == "layer2.1" or r["module"].startswith("layer2.1.")
                        for r in rows)
    assert not note.startswith("Filter not understood")
