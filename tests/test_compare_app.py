"""The /compare page's builders and callback, called directly (no browser)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dash import dcc

from popviz.api import compare
from tests.test_compare import pipeline_profile, recompute_profile


@pytest.fixture(scope="module")
def app_and_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    from popviz_app import create_app

    root = tmp_path_factory.mktemp("served")
    pipeline_profile(root / "pipe", oom=True)
    recompute_profile(root / "rec")
    (root / "junk.h5").write_bytes(b"not hdf5")
    return create_app(root), root


def _walk(node: Any) -> list[Any]:
    out = [node]
    children = getattr(node, "children", None)
    for child in children if isinstance(children, list) else [children]:
        if child is not None and not isinstance(child, str):
            out += _walk(child)
    return out


def _text(node: Any) -> str:
    return " ".join(str(n.children) for n in _walk(node)
                    if isinstance(getattr(n, "children", None), str))


def test_page_shows_verdict_cards_and_figures(app_and_root: tuple[Any, Path]) -> None:
    from popviz_app.pages import compare as page

    app, root = app_and_root
    ctx = app.popviz_context
    ctx.cache.listing()  # every file vetted (a cold page lists those being checked too)
    div = page.page(ctx, "?profile=pipe/profile.h5&other=rec/profile.h5")
    nodes = _walk(div)
    ids = {getattr(n, "id", None) for n in nodes}
    assert {"compare-verdict", "compare-side-A", "compare-side-B", "compare-liveness",
            "compare-tiles", "compare-metrics", "compare-ipus"} <= ids
    want = compare(root / "pipe" / "profile.h5", root / "rec" / "profile.h5").verdict
    text = _text(div)
    assert want["headline"] in text and "Only B (rec) fits" in text
    graphs = [n for n in nodes if isinstance(n, dcc.Graph)]
    assert len(graphs) == 7 and all(len(g.figure.data) > 0 for g in graphs)  # + op by op
    pickers = {n.id: n for n in nodes if isinstance(n, dcc.Dropdown)}
    assert pickers["compare-a"].value == "pipe/profile.h5"
    assert [o["value"] for o in pickers["compare-b"].options] == ["pipe/profile.h5",
                                                                  "rec/profile.h5"]  # no junk


def test_page_messages(app_and_root: tuple[Any, Path]) -> None:
    from popviz_app.pages import compare as page

    ctx = app_and_root[0].popviz_context
    assert "Pick two profiles" in _text(page.page(ctx, "?profile=pipe/profile.h5"))
    refused = _text(page.page(ctx, "?profile=pipe/profile.h5&other=../../etc/passwd"))
    assert "outside the served directory" in refused
    broken = _text(page.page(ctx, "?profile=pipe/profile.h5&other=junk.h5"))
    assert "junk.h5" in broken and "not an HDF5 file" in broken
    assert "Pick two" in _text(page.layout(ctx, None))  # outside a callback: no pair


def test_pickers_write_the_url() -> None:
    from popviz_app.pages.compare_pair import judge_of, pair_of, pair_query

    q = pair_query("a dir/p.h5", "b.h5")
    assert pair_of(q) == ("a dir/p.h5", "b.h5")
    assert pair_query("a.h5", "") == "?profile=a.h5"
    # the question the verdict answers travels in the URL; an unknown one is ignored
    asked = pair_query("a.h5", "b.h5", "per-device")
    assert judge_of(asked) == "per-device" and pair_of(asked) == ("a.h5", "b.h5")
    assert judge_of(q) is None and judge_of("?profile=a&judge=fastest") is None
