"""Figures of a comparison carry the comparison's own numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from popviz.analysis.compare import Comparison
from popviz.api import compare
from popviz.figures import compare as cf
from popviz.figures.style import KiB, MiB
from tests.test_compare import pipeline_profile, recompute_profile


@pytest.fixture(scope="module")
def comp(tmp_path_factory: pytest.TempPathFactory) -> Comparison:
    d = tmp_path_factory.mktemp("cmpfig")
    return compare(pipeline_profile(d / "pipe", oom=True), recompute_profile(d / "rec"))


def test_liveness_overlay_has_every_curve(comp: Comparison) -> None:
    fig = cf.liveness_compare_figure(comp)
    lines = [t for t in fig.data if t.type == "scatter"]
    assert len(lines) == comp.liveness.groupby(["side", "ipu"]).ngroups == 3
    peak = max(max(t.y) for t in lines)
    assert peak == pytest.approx(comp.liveness["total_bytes"].max() / MiB)
    assert all(0 <= x <= 1 for t in lines for x in t.x)
    vlines = [s for s in fig.layout.shapes if s.x0 == s.x1]
    assert sorted(s.x0 for s in vlines) == pytest.approx(sorted(comp.phase_x.values()))


def test_ipu_bars_side_by_side(comp: Comparison) -> None:
    fig = cf.ipu_time_compare_figure(comp)
    compute = next(t for t in fig.data if t.name == "compute")
    assert list(zip(*compute.x, strict=True)) == [("A", "IPU0"), ("A", "IPU1"), ("B", "IPU0")]
    want = comp.ipus[comp.ipus["metric"] == "compute_ms"]
    samples = comp.metrics.set_index("metric").loc["samples_per_step", ["a", "b"]]
    # the two steps hold different numbers of samples: µs per sample, not ms per step
    assert samples["a"] != samples["b"]
    assert list(compute.y) == pytest.approx(
        [*(want["a"].dropna() * 1e3 / samples["a"]), *(want["b"].dropna() * 1e3
                                                     / samples["b"])])
    assert "per sample" in fig.layout.title.text and "µs" in fig.layout.yaxis.title.text
    mem = cf.ipu_memory_compare_figure(comp)
    assert "1 OOM tiles" in mem.data[0].text


def test_tile_distribution_and_time(comp: Comparison) -> None:
    fig = cf.tile_distribution_figure(comp)
    curves = [t for t in fig.data if "capacity" not in t.name]
    assert len(curves) == 3 and sum(len(t.y) for t in curves) == len(comp.tiles)  # 4 tiles each
    for t in curves:
        assert list(t.y) == sorted(t.y, reverse=True) and t.x[0] == 0 and t.x[-1] == 1
    assert max(max(t.y) for t in curves) == pytest.approx(comp.tiles["total_bytes"].max() / KiB)
    caps = {t.name: t.y[0] for t in fig.data if "capacity" in t.name}
    assert caps == {"A tile capacity": 10_000 / KiB, "B tile capacity": 20_000 / KiB}
    tfig = cf.time_per_sample_figure(comp)
    totals = np.sum([t.x for t in tfig.data], axis=0)  # [B, A]
    per_ipu = comp.metrics.set_index("metric").loc["throughput_per_ipu"]
    assert totals == pytest.approx([1e6 / per_ipu["b"], 1e6 / per_ipu["a"]])


def test_empty_comparison_says_why(tmp_path: Path) -> None:
    c = compare(pipeline_profile(tmp_path / "a"), pipeline_profile(tmp_path / "b"))
    c.liveness = c.liveness.iloc[0:0]
    fig = cf.liveness_compare_figure(c)
    assert fig.layout.annotations and "liveness" in fig.layout.annotations[0].text
