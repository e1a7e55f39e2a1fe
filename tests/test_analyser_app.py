"""The analyser's callbacks called directly on the bundled profiles: range statistics of a
selection, a program-tree click, the ops table opened filtered to a module, a tune plan
opened on /compare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    panel = pick({"points": [{"id": "layer2"}]}, f"?profile={REL}")
    text = " ".join(component_text(c) for c in panel)
    assert text.startswith("layer2: ") and "ops of layer2 in Operations" in text


def test_operations_open_filtered_to_a_module(app: Any) -> None:
    cb = app.popviz_callbacks
    query = cb["operations.from_url"](None, f"?profile={REL}&module=layer2.1")
    rows, _, note = cb["operations.refresh"](0, 500, [], query, f"?profile={REL}")
    assert rows and all(r["module"] == "layer2.1" or r["module"].startswith("layer2.1.")
                        for r in rows)
    assert not note.startswith("Filter not understood")
