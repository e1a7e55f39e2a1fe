"""No callback sends a figure (or another big browser-side payload) to the server: `popviz
serve` refuses request bodies over 1 MiB, and a zoomed-out trace alone is 3 MB (issue 21).
Walks the callbacks the browser is told about (`/_dash-dependencies`), every page's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from popviz_app import create_app

ROOT = Path(__file__).resolve().parents[1] / "profiles"
# props whose value grows with the data shown: a whole figure, every selected point with
# its hover data, a table's rows, an uploaded file
BIG_PROPS = {"figure", "selectedData", "data", "derived_virtual_data",
             "derived_viewport_data", "contents", "extendData", "prependData"}
# dcc.Stores of a range (per IPU for live-ranges), a clicked bar's IPU and end time, a
# clicked allocator block's id, the (budget, fill) of the tune job a press started, the
# home list's page number and digest, or the node the program tree shows: a few bytes
SMALL_STORES = {"trace-window", "trace-selection", "live-ranges", "trace-bsp-pick",
                "alloc-pick", "tune-job", "home-page", "home-digest", "tree-level"}


def _server_side(root: Path) -> list[dict[str, Any]]:
    app = create_app(root, vetter=False)
    deps = app.server.test_client().get("/_dash-dependencies").get_json()
    return [d for d in deps if not d.get("clientside_function")]  # run in the browser


def _big(dep: dict[str, Any]) -> list[str]:
    return [f"{s['id']}.{s['property']}" for s in dep["inputs"] + dep["state"]
            if s["property"] in BIG_PROPS
            and not (s["property"] == "data" and s["id"] in SMALL_STORES)]


@pytest.fixture(scope="module")
def deps(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = ROOT if ROOT.is_dir() else tmp_path_factory.mktemp("empty")
    return _server_side(root)


def test_no_server_callback_takes_a_figure_or_other_big_payload(
        deps: list[dict[str, Any]]) -> None:
    outputs = " ".join(d["output"] for d in deps)
    for page_output in ("trace-stats.children", "trace-graph.figure", "live-graph.figure",
                        "mem-breakdown.children", "tree-node.children"):
        assert page_output in outputs  # every page's callbacks were walked
    offenders = {d["output"]: _big(d) for d in deps if _big(d)}
    assert offenders == {}


def test_the_check_sees_a_figure_input() -> None:
    """The old statistics callback (Input trace-graph.figure) is caught."""
    old = {"output": "trace-stats.children", "state": [{"id": "url", "property": "search"}],
           "inputs": [{"id": "trace-graph", "property": "selectedData"},
                      {"id": "trace-graph", "property": "figure"}]}
    assert _big(old) == ["trace-graph.selectedData", "trace-graph.figure"]
    store = {"inputs": [{"id": "trace-window", "property": "data"}], "state": []}
    assert _big(store) == []
