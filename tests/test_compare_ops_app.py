"""The op-by-op part of /compare (app/pages/compare_ops.py), its callbacks called directly."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

import popviz
from popviz.analysis.compare import compare
from popviz.analysis.compare.ops import compare_ops
from tests.test_compare import pipeline_profile, recompute_profile

PAIR = "?profile=pipe/profile.h5&other=rec/profile.h5"


@pytest.fixture(scope="module")
def app_and_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    from popviz_app import create_app

    root = tmp_path_factory.mktemp("served")
    pipeline_profile(root / "pipe", oom=True)
    recompute_profile(root / "rec")
    return create_app(root), root


@pytest.mark.parametrize("by", ["op", "class", "module", "pass"])
def test_regroup_shows_the_analysis(app_and_root: tuple[Any, Path], by: str) -> None:
    app, root = app_and_root
    table, fig = app.popviz_callbacks["compare.regroup"](by, 2, "step", PAIR)
    with popviz.open(root / "pipe") as a, popviz.open(root / "rec") as b:
        want = compare_ops(a, b, compare(a, b), by=by, depth=2, per="step").table
    assert [r[table.columns[0]["id"]] for r in table.data] == want["group"].tolist()
    assert table.sort_action == "native"
    ms = [r["A ms per step"] for r in table.data]
    assert ms == pytest.approx((want["a_seconds"] * 1e3).round(4).tolist(), nan_ok=True)
    assert list(fig.data[0].y) == want["group"].head(20).tolist()


def test_overlay_modes_and_bad_choices(app_and_root: tuple[Any, Path]) -> None:
    app = app_and_root[0]
    device = app.popviz_callbacks["compare.overlay"]("device", PAIR)
    peak = app.popviz_callbacks["compare.overlay"]("peak", PAIR)
    assert len(peak.data) == 2 and len(device.data) >= 2  # one peak curve per side
    assert {t.line.dash for t in peak.data} == {"solid", "dash"}
    box, _ = app.popviz_callbacks["compare.regroup"](
        "op", 1, "step", "?profile=nope.h5&other=rec/profile.h5")
    assert box.children == "no profile 'nope.h5' in the served directory"


def test_a_modelled_and_a_measured_run_open_grouped_by_class() -> None:
    from popviz_app.pages.compare_ops import default_by

    sides = pd.DataFrame({"kind": ["measured", "modelled"]})
    assert default_by(SimpleNamespace(sides=sides)) == "class"
    assert default_by(SimpleNamespace(sides=sides.iloc[[1, 1]])) == "op"
