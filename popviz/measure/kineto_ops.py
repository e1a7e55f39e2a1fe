"""The ops table of an imported trace: every host op (aten::*, autograd nodes, c10d calls)
with the GPU time of the kernels it launched (same `External id`), its input shapes and
FLOPs where the trace recorded them."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from popviz.measure import tables as tbl
from popviz.measure.kineto_events import COMM_OP, GPU_CATS, Labeller, top_level

try:
    import orjson

    def _text(value: object) -> str:
        return orjson.dumps(value).decode()
except ImportError:  # pragma: no cover
    def _text(value: object) -> str:
        return json.dumps(value, separators=(",", ":"))

PHASE = {"F": "forward", "B": "backward", "WU": "optimiser"}
EXTRA_COLUMNS = ["gpu_ns", "kernels", "shapes", "flops", "top_level"]


def ops_table(spans: pd.DataFrame, rank: int, lab: Labeller) -> pd.DataFrame:
    """One row per host op of one rank, in OPS_COLUMNS plus EXTRA_COLUMNS."""
    ops = spans[spans["cat"] == "cpu_op"]
    gpu = spans[spans["cat"].isin(GPU_CATS)]
    per_ext = (gpu["end"] - gpu["start"]).groupby(gpu["ext"].to_numpy()).agg(["sum", "size"])
    found = per_ext.reindex(ops["ext"].to_numpy())
    name = ops["name"].astype(str)
    comm = name.str.match(COMM_OP.pattern).to_numpy()
    stage, ps, mb = lab.label(ops["start"].to_numpy())
    phase = np.array([PHASE.get(p, "other") for p in ps], dtype=object)
    phase[comm] = "exchange"
    start, end = ops["start"].to_numpy(), ops["end"].to_numpy()
    return pd.DataFrame({
        "op_id": 0, "op": name.to_numpy(), "phase": phase, "ipu": rank, "stage": stage,
        "microbatch": mb, "pass": ps, "step": 0, "start": start, "end": end,
        "host_ns": end - start, "bytes": 0, "peer": -1, "waiting_ns": 0, "transfer_ns": 0,
        "gpu_ns": found["sum"].fillna(0).to_numpy(np.int64),
        "kernels": found["size"].fillna(0).to_numpy(np.int64),
        "shapes": [_text(d) if d else "" for d in ops["dims"]],
        "flops": ops["flops"].to_numpy(), "top_level": top_level(ops)},
    )[[*tbl.OPS_COLUMNS, *EXTRA_COLUMNS]]
