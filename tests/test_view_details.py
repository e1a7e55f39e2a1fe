"""Issue 21's smaller view fixes: the memory-per-IPU legend beside (not over) its title,
top ops that tell forward from recompute, kernel hovers without micro-batch -1 and with
their launching op, and `op: norm` not in the weight update's green."""

from __future__ import annotations

import pandas as pd

from popviz.analysis.range_stats import range_statistics
from popviz.analysis.trace_detail import pass_ops
from popviz.figures.memory import ipu_totals_figure
from popviz.figures.style import CATEGORY_COLOURS
from popviz.figures.trace_bars import OP_CLASS_COLOURS, event_where


def test_memory_per_ipu_legend_is_beside_the_plot() -> None:
    totals = pd.DataFrame({"ipu": [0, 1], "code": [10, 20], "always_live": [5, 5],
                           "total_bytes": [15, 25], "capacity_bytes": [100, 100],
                           "utilisation": [0.15, 0.25], "oom_tiles": [0, 0]})
    fig = ipu_totals_figure(totals)
    assert fig.layout.legend.orientation == "v" and fig.layout.legend.x > 1


def test_kernel_hover_says_only_what_the_event_has() -> None:
    ev = pd.DataFrame({"stage": [0, 1], "microbatch": [-1, 3], "pass": ["F", "R"],
                       "host_op": ["aten::cudnn_convolution", ""]})
    assert event_where(ev).tolist() == [
        "stage 0 · pass F · launched by aten::cudnn_convolution",
        "stage 1 · micro-batch 3 · pass R"]


def test_norm_is_not_the_weight_updates_green() -> None:
    green = CATEGORY_COLOURS["WU"]
    assert OP_CLASS_COLOURS["norm"] != green
    greens = {c for c, v in OP_CLASS_COLOURS.items()
              if int(v[3:5], 16) > int(v[1:3], 16) + 40 and int(v[3:5], 16) > int(v[5:7], 16)}
    assert greens <= {"optimiser"}, greens


def test_top_ops_tell_forward_from_recompute() -> None:
    ops = pd.DataFrame({"op_id": [0, 1, 2], "op": ["conv", "conv", "conv_bw"],
                        "op_class": "conv", "module": "l1", "stage": 0, "ipu": 0,
                        "pass": ["F", "R", "B"], "cycles": [10, 10, 20]})
    trace = pd.DataFrame({"ipu": 0, "start": [0, 10, 20], "end": [10, 20, 40],
                          "kind": "compute", "stage": 0, "microbatch": 0,
                          "pass": ["F", "R", "B"]})
    top = range_statistics(trace, pass_ops(ops), 0, 40).top_ops
    assert {"pass", "module"} <= set(top.columns)
    assert sorted(top["pass"]) == ["B", "F", "R"]
