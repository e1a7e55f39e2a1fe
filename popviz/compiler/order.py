"""Each IPU's program for one micro-batch: the order of its ops, i.e. its program steps.

F (forward and host I/O ops in recorded order), then the backward region where each
recomputation section's recompute ops run right before that section's first backward op
(RecomputeAndBackpropagateInterleaved; a selective recompute's ops, `recompute_anchor`
"module", right before their own module's first backward op), then WU (optimiser ops).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PASS_OF_PHASE = {"forward": "F", "host_io": "F", "backward": "B", "recompute": "R",
                 "optimiser": "WU"}


def program_order(ops: pd.DataFrame) -> pd.DataFrame:
    """Ops sorted by (ipu, program step) with `pass` and `step` columns added."""
    ops = ops.copy()
    phase = ops["phase"].to_numpy(str)
    ops["pass"] = [PASS_OF_PHASE.get(p, "F") for p in phase]
    op_id = ops["op_id"].to_numpy(np.int64)
    src = ops["source_op"].to_numpy(np.int64)
    ipu = ops["ipu"].to_numpy(np.int64)
    section = ops["section"].to_numpy(np.int64)

    rank = np.select([phase == "optimiser", (phase == "backward") | (phase == "recompute")],
                     [2, 1], default=0)
    key = op_id * 2 + 1
    sub = np.zeros(len(ops), dtype=np.int64)
    is_rec = phase == "recompute"
    if is_rec.any():
        bwd = ops[phase == "backward"]
        first_b = bwd.groupby([bwd["ipu"], bwd["section"]])["op_id"].min()
        lookup = first_b.to_dict()
        synth = is_rec & (src >= 0)
        anchors = np.array([lookup.get((int(i), int(s)), -1)
                            for i, s in zip(ipu[synth], section[synth], strict=True)],
                           dtype=np.int64)
        if "recompute_anchor" in ops:  # selective: each module's right before its own
            own = synth & (ops["recompute_anchor"].astype(str) == "module").to_numpy()
            by_module = bwd.groupby([bwd["ipu"], bwd["module"].astype(str)])["op_id"].min()
            near = by_module.to_dict()
            mods = ops["module"].astype(str).to_numpy()
            mine = np.array([near.get((int(i), m), -1)
                             for i, m in zip(ipu[synth], mods[synth], strict=True)],
                            dtype=np.int64)
            anchors = np.where(own[synth] & (mine >= 0), mine, anchors)
        # a section with no backward op on this IPU recomputes right before the WU
        key[synth] = np.where(anchors >= 0, anchors * 2, np.iinfo(np.int64).max // 4)
        sub[synth] = src[synth]
    order = np.lexsort((sub, key, rank, ipu))
    ops = ops.iloc[order].reset_index(drop=True)
    ops["step"] = ops.groupby("ipu").cumcount().astype(np.int64)
    return ops
