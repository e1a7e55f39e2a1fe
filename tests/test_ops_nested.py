"""/operations of a measured run: each nested op's own host time and its GPU time with its
descendants' kernels (conv2d -> convolution -> _convolution -> cudnn_convolution used to be
four rows with 0 ns for the three parents), checked against containment counted op by op
on the H100 ResNet-50 recording."""

from __future__ import annotations

from typing import Any

import numpy as np
from popviz_app.pages.operations import ordered

import popviz


def test_every_op_holds_the_gpu_time_of_the_ops_inside_it(resnet: Any) -> None:
    ops = resnet.ops
    table = ordered(ops, gpu=True, measured=True).set_index("op_id")
    start, end = ops["start"].to_numpy(), ops["end"].to_numpy()
    own = ops["cycles"].to_numpy(np.int64)
    ipu = ops["ipu"].to_numpy()
    checked = 0
    for i, op_id in enumerate(ops["op_id"]):
        inside = (ipu == ipu[i]) & (start >= start[i]) & (end <= end[i])
        spans_equal = inside & (start == start[i]) & (end == end[i])
        if spans_equal.sum() > 1:  # two ops over one span: which holds which is moot
            continue
        assert table.loc[op_id, "gpu_inclusive_ns"] == own[inside].sum(), ops.iloc[i]["op"]
        checked += 1
    assert checked > 0.95 * len(ops)
    first = table.loc[ops["op_id"][ops["op"] == "aten::conv2d"].iloc[0]]
    assert first["cycles"] == 0 and first["gpu_inclusive_ns"] > 0
    assert 0 < first["host_self_ns"] < first["host_ns"]


def test_a_modelled_profile_gets_no_measured_columns() -> None:
    from pathlib import Path

    with popviz.open(Path(__file__).resolve().parents[1] / "profiles" / "rn50_pipeline") as p:
        table = ordered(p.ops)
    assert "host_self_ns" not in table and "gpu_inclusive_ns" not in table


def test_flops_a_trace_did_not_record_read_unknown_not_zero(resnet: Any) -> None:
    """The H100 recording has no FLOPs (torch.profiler without with_flops): /operations
    holds them as missing, shown as "unknown", and a FLOPs filter keeps none of them; a
    modelled profile keeps its numbers."""
    from pathlib import Path

    from popviz_app.common import table_columns

    from popviz.analysis import filter_table

    assert not (resnet.ops["flops"] > 0).any()  # the recording has none
    table = ordered(resnet.ops, gpu=True, measured=True)
    assert table["flops"].isna().all()
    column = next(c for c in table_columns(table) if c["id"] == "flops")
    assert column["type"] == "numeric" and column["format"]["nully"] == "unknown"
    assert filter_table(table, "{flops} > 0", {}, errors=[]).empty
    with popviz.open(Path(__file__).resolve().parents[1] / "profiles" / "rn50_pipeline") as p:
        modelled = ordered(p.ops)
    assert (modelled["flops"] > 0).any() and not modelled["flops"].isna().any()


def test_a_flops_filter_on_a_run_without_flops_says_why_nothing_is_left(
        tmp_path: Any) -> None:
    """`> 0` on unknown FLOPs leaves an empty table: the page says the run recorded none,
    not only "0 of N ops"."""
    from popviz_app import ProfileCache
    from popviz_app.common import AppContext
    from popviz_app.pages.operations import page

    from tests.import_fixtures import RESNET

    popviz.import_trace([RESNET], tmp_path / "run")
    rel = next(tmp_path.rglob("*.h5")).relative_to(tmp_path).as_posix()
    entry = AppContext(root=tmp_path, cache=ProfileCache(tmp_path)).cache.get(rel)
    rows, _, note = page(entry, "{flops} > 0", None, 0)
    assert rows == [] and "recorded no FLOPs" in note
    rows, _, note = page(entry, "{op} contains conv", None, 0)
    assert rows and "FLOPs" not in note
