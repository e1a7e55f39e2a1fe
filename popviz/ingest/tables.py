"""The tables every measured profile shares, live (`popviz.measure`) or imported: their
columns, the stages table and the summary, from the metrics core.

Times are ns on the common clock (`clocks`). The `*_cycles` columns of `stages` hold ns
(meta.target.clock_hz = 1e9), as a mean per recorded training step. See docs/measure.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from popviz.metrics import (
    fit_verdict,
    idle_fraction,
    peak_liveness,
    stage_table_times,
    step_time,
)
from popviz.vocab import MEASURED_KIND

EXCHANGE_COLUMNS = ["src", "dst", "bytes", "start", "end", "kind", "stage", "microbatch",
                    "step", "waiting_ns", "transfer_ns"]
TILE_COLUMNS = ["ipu", "tile", "capacity_bytes", "total_bytes"]
OPS_COLUMNS = ["op_id", "op", "phase", "ipu", "stage", "microbatch", "pass", "step",
               "start", "end", "host_ns", "bytes", "peer", "waiting_ns", "transfer_ns"]
STAGE_COLUMNS = ["stage", "ipu", "forward_cycles", "backward_cycles", "recompute_cycles",
                 "exchange_cycles", "idle_cycles", "stash_bytes", "peak_bytes",
                 "optimiser_cycles", "other_cycles", "sync_cycles", "first_layer",
                 "last_layer", "steps", "forward_cycles_per_microbatch",
                 "backward_cycles_per_microbatch", "stash_depth", "boundary_bytes"]


def renumber_ops(ops: pd.DataFrame) -> pd.DataFrame:
    """op_id in (rank, start) order (merge renumbers the concatenated ranks)."""
    ops = ops.sort_values(["ipu", "start", "end"], kind="stable").reset_index(drop=True)
    ops["op_id"] = np.arange(len(ops), dtype=np.int64)
    return ops[OPS_COLUMNS]


def stages_table(trace: pd.DataFrame, liveness: pd.DataFrame, stage_info: list[dict],
                 steps: int) -> pd.DataFrame:
    """Per stage: mean ns per recorded step of forward, backward, transfer, waiting and
    the rest of the rank's step, from the metrics core (popviz.metrics.stage_table_times:
    each instant of a rank counted once, a rank's columns adding up to the step time)."""
    steps = max(1, steps)
    pairs = pd.DataFrame({"stage": [int(i["stage"]) for i in stage_info],
                          "ipu": [int(i["ipu"]) for i in stage_info]})
    times = stage_table_times(trace, pairs, steps)
    peaks = peak_liveness(liveness)
    # micro-batches each stage's forward saw, in one pass over the trace (a filter per
    # stage made 512 ranks cost 512 passes: 17 s of a 60 s import)
    forward = trace[(trace["kind"].astype(str) == "compute").to_numpy()
                    & (trace["pass"].astype(str) == "F").to_numpy()]
    seen = forward.groupby("stage")["microbatch"].nunique()
    rows = []
    for k, info in enumerate(stage_info):
        s, rank = info["stage"], info["ipu"]
        t = times.iloc[k]
        microbatches = max(1, int(seen.get(s, 0)))
        rows.append({
            "stage": s, "ipu": rank, "forward_cycles": t["forward_cycles"],
            "backward_cycles": t["backward_cycles"],
            "recompute_cycles": t["recompute_cycles"],
            "exchange_cycles": t["exchange_cycles"], "idle_cycles": t["idle_cycles"],
            "stash_bytes": int(info.get("stash_bytes", 0)),
            "peak_bytes": int(peaks.get(rank, 0)),
            "optimiser_cycles": t["optimiser_cycles"], "other_cycles": t["other_cycles"],
            "sync_cycles": t["sync_cycles"],
            "first_layer": info.get("first_layer", ""),
            "last_layer": info.get("last_layer", ""), "steps": steps,
            "forward_cycles_per_microbatch": t["forward_cycles"] / microbatches,
            "backward_cycles_per_microbatch": t["backward_cycles"] / microbatches,
            "stash_depth": int(info.get("stash_depth", 0)),
            "boundary_bytes": int(info.get("boundary_bytes", 0)),
        })
    frame = pd.DataFrame(rows, columns=STAGE_COLUMNS)
    return frame.sort_values("stage").reset_index(drop=True)


def summary(tables: dict[str, pd.DataFrame], meta: dict[str, Any]) -> dict[str, Any]:
    """Headline figures of a measured profile (rank file or merged), from the metrics
    core: step time, idle, peaks and fit (a rank has no tiles: an imported GPU's peak
    against its device memory, else unknown)."""
    trace, stages, live = tables["trace"], tables["stages"], tables["liveness"]
    opts = meta.get("options", {})
    step_ns = step_time(trace)
    # an imported trace may not tell its micro-batch size (None): then no sample count
    micro_batch = opts.get("micro_batch_size", 1)
    samples = int(micro_batch) * int(opts.get("microbatches", 1)) if micro_batch else None
    ranks = sorted(int(r) for r in trace["ipu"].unique()) if len(trace) else []
    steps = max(1, int(trace["step"].nunique())) if len(trace) else 1
    work = stages["forward_cycles"] + stages["backward_cycles"]
    peaks = peak_liveness(live)
    return {
        "kind": MEASURED_KIND,
        "fits": fit_verdict(tables.get("tile_memory", empty_tile_memory()), live, meta),
        "oom_tiles": 0, "oom_ipus": [],
        "num_ipus": len(ranks), "ranks": ranks, "replicas": 1, "total_ipus": len(ranks),
        "step_cycles": step_ns, "step_ns": step_ns, "step_seconds": step_ns / 1e9,
        "step_ms": step_ns / 1e6, "samples_per_step": samples,
        "throughput": samples / (step_ns / 1e9) if samples and step_ns > 0 else None,
        "latency_ms": None, "training": True,
        "idle_fraction": idle_fraction(trace),
        "bottleneck_stage": int(stages.loc[work.idxmax(), "stage"]) if len(stages) else None,  # type: ignore[call-overload, index]  # pandas-stubs: a cell is any scalar
        "peak_liveness_bytes": {str(int(k)): int(v) for k, v in peaks.items()},  # type: ignore[call-overload]  # pandas-stubs: a label is Hashable
        "schedule": opts.get("schedule"), "strategy": "pipelined",
        "micro_batch_size": int(micro_batch) if micro_batch else None,
        "microbatches": int(opts.get("microbatches", 1)), "recorded_steps": steps,
        "liveness_steps": int(live["step"].nunique()) if len(live) else 0,
        "exchange_bytes": int(tables["exchange"]["bytes"].sum()),
        "stages": stages.to_dict(orient="records"),
    }


def empty_tile_memory() -> pd.DataFrame:
    """A measured run has no tiles: the table exists (the reader requires it) with no rows,
    so `fits` is None (unknown: there is no capacity to hold the run against)."""
    return pd.DataFrame({c: pd.Series([], dtype="int64") for c in TILE_COLUMNS})
