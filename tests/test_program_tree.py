"""The program tree: every module's figures are the plain sums of the ops inside it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import popviz
from popviz.analysis.program_tree import node_ops, program_tree, tree_window
from popviz.figures.tree import program_tree_figure, stage_colour

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
PROFILE = PROFILES / "rn50_recompute"


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


def _walk_window(tree: pd.DataFrame, root: str, levels: int) -> set[str]:
    """The window by walking parent links: root's ancestors, and every node whose chain
    of parents reaches root within `levels` steps."""
    parent = dict(zip(tree["id"], tree["parent"], strict=True))
    keep, node = set(), root
    while node:
        keep.add(node)
        node = parent[node]
    for start in tree["id"]:
        node, steps = start, 0
        while node and node != root and steps <= levels:
            node, steps = parent[node], steps + 1
        if node == root and 0 < steps <= levels:
            keep.add(start)
    return keep


def test_a_window_holds_the_path_up_and_levels_below() -> None:
    tree = program_tree(popviz.open(PROFILE).ops)
    for root in ("model", "layer1", "layer2.0", "stem"):
        for levels in (1, 2, 4):
            got = set(tree_window(tree, root, levels)["id"])
            assert got == _walk_window(tree, root, levels), (root, levels)
    window = tree_window(tree, "layer2.0", 2)
    # parents still hold their (whole) totals: an icicle with branchvalues="total" draws it
    children = window.groupby("parent")["cycles"].sum()
    for node, total in children.items():
        if node:
            assert window.loc[window["id"] == node, "cycles"].item() >= total - 1e-6
    leaf = next(i for i in tree["id"] if i.startswith("layer2.0.") and "/" in i)
    assert set(tree_window(tree, leaf, 2)["id"]) == _walk_window(
        tree, leaf.split("/")[0], 2)  # a leaf is viewed from its module
    assert set(tree_window(tree, "no.such", 2)["id"]) == _walk_window(tree, "model", 2)


def test_every_parent_is_the_sum_of_its_children_on_a_profile() -> None:
    if not PROFILE.exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
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


EFFNET = Path(__file__).resolve().parents[1] / "profiles" / "effnet_b4_pipeline"


def test_tree_is_in_program_order_with_split_names_and_per_step_sums() -> None:
    """blocks.2 before blocks.10, the head after the blocks; each node names its split
    names (blocks.3 runs block2b); with the step's weights the model is the stage
    table's compute (issue 21)."""
    if not EFFNET.exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    from popviz.analysis.program_tree import step_weights

    with popviz.open(EFFNET) as p:
        weights = step_weights(p.meta, p.summary, False)
        tree = program_tree(p.ops, weights)
        compute = p.stages[["forward_cycles", "backward_cycles", "recompute_cycles",
                            "optimiser_cycles"]].to_numpy().sum()
        first_of = p.ops.reset_index(drop=True).groupby("module").apply(
            lambda g: g.index.min(), include_groups=False)
    top = tree[tree["parent"] == "model"]["id"].tolist()
    assert top.index("stem") < top.index("blocks") < top.index("head")
    blocks = tree[tree["parent"] == "blocks"]["id"].tolist()
    assert blocks == sorted(blocks, key=lambda b: int(b.split(".")[1]))
    # every sibling list follows the first op each holds (independently computed)
    for _, siblings in tree[tree["kind"] == "module"].groupby("parent", sort=False):
        firsts = [min(first_of[m] for m in first_of.index
                      if m == node or m.startswith(node + ".")) for node in siblings["id"]]
        assert firsts == sorted(firsts)
    by_id = tree.set_index("id")
    assert by_id.loc["blocks.3", "layers"] == "block2b"
    assert by_id.loc["model", "cycles"] == pytest.approx(compute)
    assert weights == {"F": p.summary["microbatches"], "B": p.summary["microbatches"],
                       "R": p.summary["microbatches"], "WU": 1.0}
    fig = program_tree_figure(tree, per_step="40 micro-batches and 1 weight update per step",
                              stage_starts={0: "stem", 1: "block2c"})
    icicle = fig.data[0]
    labels = dict(zip(icicle.ids, icicle.labels, strict=True))
    assert labels["blocks.3"] == "3 · block2b" and labels["head"] == "head · top"
    assert "of the step's compute (40 micro-batches" in icicle.hovertemplate
    unweighted = program_tree_figure(program_tree(p.ops))
    assert "of one micro-batch's compute" in unweighted.data[0].hovertemplate
    starts = dict(zip(icicle.ids, [c[9] for c in icicle.customdata], strict=True))
    assert starts["blocks.4"] == "stage 1 starts at block2c"


def _stages_by_hand(values: pd.Series) -> str:
    got = sorted({int(v) for v in values.dropna() if int(v) >= 0})
    if not got:
        return ""
    if got == list(range(got[0], got[-1] + 1)) and len(got) > 1:
        return f"{got[0]}-{got[-1]}"
    return ", ".join(str(g) for g in got)


def _layers_by_hand(values: pd.Series) -> str:
    got = [v for v in dict.fromkeys(values.astype(str)) if v]
    return "" if not got else got[0] if len(got) == 1 else f"{got[0]}…{got[-1]}"


def test_stage_and_layer_texts_equal_a_walk_over_each_node() -> None:
    """The vectorised texts against one group at a time, on a hand case (gaps, -1, names
    coming back) and on every bundled profile's modules and ops."""
    from popviz.analysis.program_tree import _layer_texts, _normalised, _stage_texts

    hand = pd.DataFrame({"module": ["a", "a", "a", "b", "b", "c", "c", "c"],
                         "stage": [0, 3, 0, -1, -1, 2, 1, 3], "ipu": [0, 0, 0, 1, 1, 1, 2, 3],
                         "layer": ["x", "y", "x", "", "", "p", "q", "p"], "pos": range(8)})
    frames = [(hand, "module")]
    for path in sorted(PROFILES.rglob("profile.h5")):
        with popviz.open(path) as profile:
            frame = _normalised(profile.ops)
        frames += [(frame, "module"), (frame, "op")]
    for frame, key in frames:
        g = frame.groupby(key, sort=False)
        index = g.size().index
        for col in ("stage", "ipu"):
            assert _stage_texts(frame, key, col, index).tolist() == \
                g[col].agg(_stages_by_hand).tolist()
        assert _layer_texts(frame, key, index).tolist() == \
            g["layer"].agg(_layers_by_hand).tolist()
    assert _stage_texts(hand, "module", "stage", pd.Index(["a", "b", "c"])).tolist() == \
        ["0, 3", "", "1-3"]
    assert _layer_texts(hand, "module", pd.Index(["a", "b", "c"])).tolist() == ["x…y", "", "p…q"]


def test_a_run_without_modules_lists_the_ops_of_a_clicked_box() -> None:
    # a measured run may record no module column: every op hangs under the model, and a
    # click on one of its boxes lists that op's rows (it raised KeyError: 'module')
    ops = _ops().drop(columns="module")
    tree = program_tree(ops)
    leaves = tree[tree["kind"] == "op"]
    assert set(leaves["parent"]) == {"model"}
    for leaf in leaves["id"]:
        picked = node_ops(ops, leaf)
        assert len(picked) == leaves.loc[leaves["id"] == leaf, "ops"].item() > 0
