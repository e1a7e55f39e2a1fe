"""The ops table grouped: counts, totals and shares; an import's nested host ops with self
vs inclusive time (host spans and the GPU time of the kernels each launched)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import popviz
from popviz.analysis.op_groups import group_ops, has_gpu_time, nesting, self_and_inclusive

ROOT = Path(__file__).resolve().parents[1]


def _nested() -> pd.DataFrame:
    # conv2d [0, 100] holds convolution [10, 90] which holds cudnn [20, 80] (kernel 50);
    # add_ [120, 140] (kernel 7) stands alone; rank 1 has its own conv2d
    return pd.DataFrame({
        "op": ["aten::conv2d", "aten::convolution", "aten::cudnn_convolution", "aten::add_",
               "aten::conv2d"],
        "ipu": [0, 0, 0, 0, 1], "start": [0, 10, 20, 120, 5], "end": [100, 90, 80, 140, 50],
        "cycles": [0, 0, 50, 7, 0], "gpu_ns": [0, 0, 50, 7, 0],
        "op_class": ["conv", "conv", "conv", "elementwise", "conv"]})


def test_nesting_finds_each_ops_innermost_parent_on_its_device() -> None:
    assert nesting(_nested()).tolist() == [-1, 0, 1, -1, -1]


def test_self_and_inclusive_times() -> None:
    t = self_and_inclusive(_nested())
    assert t["host_inclusive"].tolist() == [100, 80, 60, 20, 45]
    assert t["host_self"].tolist() == [20, 20, 60, 20, 45]
    assert t["gpu_self"].tolist() == [0, 0, 50, 7, 0]
    assert t["gpu_inclusive"].tolist() == [50, 50, 50, 7, 0]


def test_grouped_import_shares_are_of_gpu_self_time() -> None:
    g = group_ops(_nested(), "op_class", measured=True).set_index("op_class")
    assert g.loc["conv", "count"] == 4 and g.loc["elementwise", "count"] == 1
    assert g.loc["conv", "gpu_self"] == 50 and g.loc["conv", "host_self"] == 20 + 20 + 60 + 45
    assert g["share"].sum() == pytest.approx(1.0)
    assert g.loc["conv", "share"] == pytest.approx(50 / 57)
    # conv2d > convolution > cudnn in one class: one span, not three (100 + 80 + 60)
    assert g.loc["conv", "host_inclusive"] == 100 + 45
    assert g.loc["conv", "gpu_inclusive"] == 50
    by_op = group_ops(_nested(), "op", measured=True).set_index("op")
    assert by_op.loc["aten::convolution", "host_inclusive"] == 80  # other ops: own rows


def test_grouped_modelled_ops_by_cycles() -> None:
    ops = pd.DataFrame({"op": ["a", "b", "a"], "cycles": [10, 30, 20]})
    g = group_ops(ops, "op")
    # equal totals: the one with more ops first
    assert g["op"].tolist() == ["a", "b"] and g["cycles"].tolist() == [30, 30]
    assert g["count"].tolist() == [2, 1] and g["mean_cycles"].tolist() == [15, 30]
    assert g["share"].tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="no column 'module'"):
        group_ops(ops, "module")


def test_a_cpu_run_is_grouped_by_host_time_only() -> None:
    """The bundled gloo run's ops (CPU ranks) have no GPU time: no GPU columns, shares of
    the host self time; the same ops with kernel time would be grouped by it."""
    with popviz.open(ROOT / "profiles" / "tutorial_measured_2ranks") as p:
        ops = p.ops
    assert not has_gpu_time(ops)
    g = group_ops(ops, "op_class", measured=True)
    assert "gpu_self" not in g.columns and "gpu_inclusive" not in g.columns
    assert g["share"].sum() == pytest.approx(1.0)
    assert g["share"].iloc[0] == pytest.approx(g["host_self"].iloc[0] / g["host_self"].sum())
    assert has_gpu_time(_nested()) and "gpu_self" in group_ops(_nested(), "op", measured=True)
