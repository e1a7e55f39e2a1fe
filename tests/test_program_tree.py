"""The program tree: every module's figures are the plain sums of the ops inside it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import popviz
from popviz.analysis.program_tree import node_ops, program_tree
from popviz.figures.tree import program_tree_figure, stage_colour

PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "rn50_recompute"


def _ops() -> pd.DataFrame:
    return pd.DataFrame({
        "op": ["aten.convolution.default", "aten.relu.default", "aten.mm.default",
               "aten.add.Tensor", "aten.convolution_backward.default"],
        "module": ["enc.0.conv", "enc.0.act", "enc.1", "", "enc.0.conv"],
        "pass": ["F", "F", "F", "F", "B"], "stage": [0, 0, 1, 1, 0], "ipu": [0, 0, 1, 1, 0],
        "cycles": [100, 10, 50, 5, 200], "flops": [1000, 0, 500, 5, 2000],
        "bytes_written": [64, 64, 32, 8, 128], "temp_bytes": [7, 0, 3, 0, 9]})


def test_tree_of_a_hand_made_program() -> None:
    tree = program_tree(_ops()).set_index("id")
    assert tree.loc["model", "cycles"] == 365 and tree.loc["model", "ops"] == 5
    assert tree.loc["enc", "cycles"] == 360 and tree.loc["enc", "stages"] == "0-1"
    assert tree.loc["enc.0", "cycles"] == 310 and tree.loc["enc.0", "stages"] == "0"
    assert tree.loc["enc.0", "backward_cycles"] == 200
    assert tree.loc["enc.0.conv", "temp_bytes"] == 9 and tree.loc["enc.0.conv", "flops"] == 3000
    assert tree.loc["enc.0.conv/convolution (F)", "parent"] == "enc.0.conv"
    assert tree.loc["model/add (F)", "cycles"] == 5  # no module: under the model
    assert set(tree.loc[tree["kind"] == "op", "parent"]) <= set(tree.index)


def test_every_parent_is_the_sum_of_its_children_on_a_profile() -> None:
    if not PROFILE.exists():
        pytest.skip("profiles/ not built")
    ops = popviz.open(PROFILE).ops
    tree = program_tree(ops)
    assert tree.loc[tree["id"] == "model", "cycles"].item() == ops["cycles"].sum()
    children = tree.groupby("parent")["cycles"].sum()
    for node, total in children.items():
        if node:
            assert tree.loc[tree["id"] == node, "cycles"].item() == pytest.approx(total)
    # a module's figures are the sums over the ops inside it (independent filter)
    for module in ("layer1", "layer2.0", "stem"):
        inside = ops[ops["module"].str.fullmatch(rf"{module}(\..*)?")]
        row = tree[tree["id"] == module].iloc[0]
        assert row["cycles"] == inside["cycles"].sum()
        assert row["flops"] == inside["flops"].sum()
        assert row["ops"] == len(inside)
        assert node_ops(ops, module)["op_id"].sort_values().tolist() == \
            inside["op_id"].sort_values().tolist()


def test_icicle_sizes_boxes_by_cycles_and_colours_by_stage() -> None:
    tree = program_tree(_ops())
    fig = program_tree_figure(tree)
    icicle = fig.data[0]
    assert list(icicle.ids) == tree["id"].tolist() and icicle.branchvalues == "total"
    assert list(icicle.values) == tree["cycles"].tolist()
    colours = dict(zip(icicle.ids, icicle.marker.colors, strict=True))
    assert colours["enc.0"] == stage_colour("0") != colours["enc"] == stage_colour("0-1")
    empty = program_tree_figure(program_tree(_ops().assign(cycles=0)))
    assert "no program tree" in empty.layout.annotations[0].text
