"""Every page of every profile bundled in profiles/ (what `make serve` shows a new user)
renders with data and no error, and each compares with the next; without a browser, so
all nine stay covered where the browser test visits one of each kind."""

from __future__ import annotations

from pathlib import Path

import pytest
from dash import html
from popviz_app import create_app, render
from popviz_app.pages import PAGES
from popviz_app.pages.compare import body as compare_body

import popviz
from tests.dash_util import component_text, find_components

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = sorted(p.relative_to(ROOT / "profiles").as_posix()
                 for p in (ROOT / "profiles").rglob("*.h5"))


@pytest.fixture(scope="module")
def context() -> object:
    return create_app(ROOT / "profiles", vetter=False).popviz_context


def test_the_bundled_set_is_there() -> None:
    assert len(BUNDLED) >= 9, BUNDLED  # make serve's example profiles ship in the repo


@pytest.mark.parametrize("rel", BUNDLED)
def test_every_page_of_a_bundled_profile_has_data(context: object, rel: str) -> None:
    with popviz.open(ROOT / "profiles" / rel) as profile:
        has_tiles = not profile.tile_memory.empty
    for page in [p for p in PAGES if p.NEEDS_PROFILE]:
        where = f"{page.PATH} of {rel}"
        _, body = render(context, page.PATH, f"?profile={rel}")
        errors = [d for d in find_components(body, "Div")
                  if "error" in str(getattr(d, "className", "")).split()]
        assert not errors, f"{where}: {component_text(errors[0])}"
        assert "No data" not in component_text(body), where
        graphs = find_components(body, "Graph")
        if page.FIGURES and (has_tiles or page.PATH not in ("/summary", "/memory")):
            assert graphs, where
        for graph in graphs:
            assert len(graph.figure.data) > 0, f"{where}: {graph.id} is empty"
    other = BUNDLED[(BUNDLED.index(rel) + 1) % len(BUNDLED)]
    shown = html.Div(compare_body(context, rel, other))
    divs = find_components(shown, "Div")
    assert "compare-verdict" in {getattr(d, "id", None) for d in divs}, other
    assert not [d for d in divs if "error" in str(getattr(d, "className", ""))], other
    for graph in find_components(shown, "Graph"):
        assert len(graph.figure.data) > 0, f"/compare of {rel} and {other}: {graph.id}"
