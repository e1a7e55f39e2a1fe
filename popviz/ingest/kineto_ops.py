"""The ops table of an imported trace: every host op (aten::*, autograd nodes, c10d calls)
with the GPU time of the kernels it launched (same `External id`), its input shapes and
FLOPs where the trace recorded them."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from popviz.ingest import tables as tbl
from popviz.ingest.kineto_events import (
    COMM_OP,
    GPU_CATS,
    Labeller,
    compute_kernels,
    name_test,
    top_level,
)
from popviz.op_names import DATA_MOVEMENT, VIEWS

try:
    import orjson

    def _text(value: object) -> str:
        return orjson.dumps(value).decode()
except ImportError:  # pragma: no cover
    def _text(value: object) -> str:
        return json.dumps(value, separators=(",", ":"))

PHASE = {"F": "forward", "B": "backward", "WU": "optimiser"}
EXTRA_COLUMNS = ["cycles", "op_class", "gpu_ns", "kernels", "shapes", "flops", "top_level"]
# op classes of popviz.record, guessed from the aten name (first match wins)
OP_CLASSES = [
    ("conv", re.compile(r"conv")),
    # fused attention is matmul work, as popviz.record counts its FLOPs
    ("matmul", re.compile(r"::(?:mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|addmv|mv|"
                          r"_?scaled_dot_product_\w*attention\w*|_flash_attention\w*|"
                          r"_efficient_attention\w*)\b")),
    ("norm", re.compile(r"norm(?!al)")),  # not aten::normal_ (random init)
    ("reduction", re.compile(r"::(?:sum|mean|amax|max|min|softmax|_softmax|log_softmax|"
                             r"_log_softmax|nll_loss|cross_entropy|.*pool|var|std)")),
    # what the recorder calls data movement (popviz.op_names), by the name alone
    ("data_movement", re.compile(
        r"::(?:" + "|".join(sorted(DATA_MOVEMENT | VIEWS, key=lambda n: (-len(n), n)))
        + r")$")),
    ("elementwise", re.compile(r"^aten::")),
]


# an autograd node (alone, or as the engine's span around it): the backward of an aten op
AUTOGRAD_NODE = re.compile(r"(?:^|evaluate_function: )(?:torch::autograd::)?"
                           r"([A-Z][A-Za-z0-9]*?)Backward\d*$")


def forward_name(name: str) -> str:
    """The aten op whose backward an autograd node runs ('autograd::engine::
    evaluate_function: ConvolutionBackward0' -> 'aten::convolution', 'MaxPool2DWith
    IndicesBackward0' -> 'aten::max_pool2d_with_indices'); any other name unchanged. On a
    CPU rank the engine's span is the top-level op, so its class is the backward's."""
    found = AUTOGRAD_NODE.search(name)
    if found is None:
        return name
    camel = re.sub(r"(\d)D", r"\1d", found.group(1))
    return "aten::" + re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", camel).lower()


def op_class(names: pd.Series) -> np.ndarray:
    """popviz.record's op class of each op, from its name ("other" when none fits; an
    autograd node the class of the op it differentiates); classified once per distinct
    name."""
    codes, uniques = pd.factorize(names)
    out = np.full(len(uniques), "other", dtype=object)
    todo = np.ones(len(uniques), dtype=bool)
    texts = pd.Series([forward_name(str(u)) for u in uniques], dtype=object)
    for cls, pattern in OP_CLASSES:
        hit = todo & texts.str.contains(pattern).to_numpy()
        out[hit] = cls
        todo &= ~hit
    return out[codes] if len(codes) else np.zeros(0, dtype=object)


def op_classes(names: pd.Series) -> np.ndarray:
    """The ops table's class of each op name: `op_class`, communication calls (c10d,
    gloo, nccl) "exchange". Kernels take their launching op's class from here too."""
    cls = op_class(names)
    cls[name_test(names, lambda n: n.str.match(COMM_OP.pattern))] = "exchange"
    return cls


def _shapes(dims: pd.Series) -> list[str]:
    """Input dims as compact JSON text ("" when none): the vectorised reader gives the
    text already, the JSON decoder lists."""
    return [("" if d == "[]" else d) if isinstance(d, str) else _text(d) if d else ""
            for d in dims.tolist()]


def ops_table(spans: pd.DataFrame, rank: int, lab: Labeller) -> pd.DataFrame:
    """One row per host op of one rank, in OPS_COLUMNS plus EXTRA_COLUMNS."""
    ops = spans[spans["cat"] == "cpu_op"]
    gpu = spans[spans["cat"].isin(GPU_CATS)]
    per_ext = (gpu["end"] - gpu["start"]).groupby(gpu["ext"].to_numpy()).agg(["sum", "size"])
    found = per_ext.reindex(ops["ext"].to_numpy())
    # its compute: the kernels the trace counts as compute (not NCCL's, nor copies and
    # sets, which it counts as exchange), so an op's cycles add up to the stages' compute
    work = gpu[compute_kernels(gpu)]
    computed = (work["end"] - work["start"]).groupby(work["ext"].to_numpy()).agg(
        ["sum", "size"]).reindex(ops["ext"].to_numpy())
    comm = name_test(ops["name"], lambda n: n.str.match(COMM_OP.pattern))
    stage, ps, mb = lab.label(ops["start"].to_numpy())
    phase = np.array([PHASE.get(p, "other") for p in ps], dtype=object)
    phase[comm] = "exchange"
    start, end = ops["start"].to_numpy(), ops["end"].to_numpy()
    gpu_ns = found["sum"].fillna(0).to_numpy(np.int64)
    top = top_level(ops)
    # device time of an op, each instant once: its own compute kernels' GPU time (a kernel
    # belongs to the innermost op that launched it), or on a CPU run the host time of
    # top-level ops
    compute_ns = computed["sum"].fillna(0).to_numpy(np.int64)
    cycles = np.where(comm, 0, compute_ns if len(gpu) else np.where(top, end - start, 0))
    cls = op_classes(ops["name"])
    return pd.DataFrame({
        "op_id": 0, "op": ops["name"].to_numpy(), "phase": phase, "ipu": rank, "stage": stage,
        "microbatch": mb, "pass": ps, "step": 0, "start": start, "end": end,
        "host_ns": end - start, "bytes": 0, "peer": -1, "waiting_ns": 0, "transfer_ns": 0,
        "cycles": cycles, "op_class": cls, "gpu_ns": gpu_ns,
        "kernels": computed["size"].fillna(0).to_numpy(np.int64),
        "shapes": _shapes(ops["dims"]),
        "flops": ops["flops"].to_numpy(), "top_level": top},
    )[[*tbl.OPS_COLUMNS, *EXTRA_COLUMNS]]
