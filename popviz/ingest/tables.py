"""The tables every measured profile shares, live (`popviz.measure`) or imported: their
columns, the stages table and the summary, from the metrics core.

Times are ns on the common clock (`clocks`). The `*_cycles` columns of `stages` hold ns
(meta.target.clock_hz = 1e9), as a mean per recorded training step. See docs/measure.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from popviz.metrics import fit_verdict, idle_fractions, peak_liveness, stage_table_times
from popviz.metrics.timeline import TimelineTally
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


@dataclass
class TraceFacts:
    """What the stages table, the summary and the meta take from the trace and the
    liveness, gathered one rank's rows at a time (`add`: a job's import never holds its
    whole trace) or from whole tables (`of`); the same figures either way."""

    timeline: TimelineTally = field(default_factory=TimelineTally)
    peaks: dict[int, int] = field(default_factory=dict)  # peak liveness per device
    ranks: set[int] = field(default_factory=set)  # devices with trace events
    trace_steps: set[int] = field(default_factory=set)
    liveness_steps: set[int] = field(default_factory=set)
    microbatches: set[int] = field(default_factory=set)  # numbered ones in the trace
    forward: dict[int, set[int]] = field(default_factory=dict)  # stage: micro-batches

    @classmethod
    def of(cls, trace: pd.DataFrame, liveness: pd.DataFrame) -> TraceFacts:
        facts = cls()
        facts.add(trace, liveness)
        return facts

    def add(self, trace: pd.DataFrame, liveness: pd.DataFrame) -> None:
        """Rows of devices not added before (each device's rows whole)."""
        self.timeline.add(trace)
        for ipu, peak in peak_liveness(liveness).items():
            self.peaks[int(ipu)] = max(int(peak), self.peaks.get(int(ipu), 0))  # type: ignore[call-overload]  # pandas-stubs: a label is Hashable
        if len(liveness):
            self.liveness_steps.update(pd.unique(liveness["step"]).tolist())
        if not len(trace):
            return
        self.ranks.update(int(r) for r in pd.unique(trace["ipu"]))
        self.trace_steps.update(pd.unique(trace["step"]).tolist())
        mb = trace["microbatch"].to_numpy()
        self.microbatches.update(pd.unique(mb[mb >= 0]).tolist())
        forward = trace[(trace["kind"].astype(str) == "compute").to_numpy()
                        & (trace["pass"].astype(str) == "F").to_numpy()]
        pairs = forward[["stage", "microbatch"]].drop_duplicates().to_numpy(np.int64)
        for stage, mb in pairs.tolist():
            self.forward.setdefault(stage, set()).add(mb)

    def merge(self, other: TraceFacts) -> None:
        """Add another slice's facts (devices not in this one): as `add` of its rows."""
        self.timeline.merge(other.timeline)
        for ipu, peak in other.peaks.items():
            self.peaks[ipu] = max(peak, self.peaks.get(ipu, 0))
        self.ranks |= other.ranks
        self.trace_steps |= other.trace_steps
        self.liveness_steps |= other.liveness_steps
        self.microbatches |= other.microbatches
        for stage, mbs in other.forward.items():
            self.forward.setdefault(stage, set()).update(mbs)

    @property
    def steps(self) -> int:
        return max(1, len(self.trace_steps))

    def peak_series(self) -> pd.Series:
        """Peak liveness by device, as `metrics.peak_liveness` gives it."""
        ipus = sorted(self.peaks)
        return pd.Series([self.peaks[i] for i in ipus], dtype="int64",
                         index=pd.Index(ipus, name="ipu"))


def stages_table(facts: TraceFacts, stage_info: list[dict], steps: int) -> pd.DataFrame:
    """Per stage: mean ns per recorded step of forward, backward, transfer, waiting and
    the rest of the rank's step, from the metrics core (popviz.metrics.stage_table_times:
    each instant of a rank counted once, a rank's columns adding up to the step time)."""
    steps = max(1, steps)
    pairs = pd.DataFrame({"stage": [int(i["stage"]) for i in stage_info],
                          "ipu": [int(i["ipu"]) for i in stage_info]})
    times = stage_table_times(facts.timeline, pairs, steps)
    rows = []
    for k, info in enumerate(stage_info):
        s, rank = info["stage"], info["ipu"]
        t = times.iloc[k]
        microbatches = max(1, len(facts.forward.get(int(s), ())))
        rows.append({
            "stage": s, "ipu": rank, "forward_cycles": t["forward_cycles"],
            "backward_cycles": t["backward_cycles"],
            "recompute_cycles": t["recompute_cycles"],
            "exchange_cycles": t["exchange_cycles"], "idle_cycles": t["idle_cycles"],
            "stash_bytes": int(info.get("stash_bytes", 0)),
            "peak_bytes": int(facts.peaks.get(int(rank), 0)),
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
    """Headline figures of a measured profile (rank file or merged) from its tables."""
    facts = TraceFacts.of(tables["trace"], tables["liveness"])
    return summary_of(facts, tables, meta)


def summary_of(facts: TraceFacts, tables: dict[str, pd.DataFrame], meta: dict[str, Any]
               ) -> dict[str, Any]:
    """Headline figures of a measured profile, from the metrics core: step time, idle,
    peaks and fit (a rank has no tiles: an imported GPU's peak against its device
    memory, else unknown). `tables` need hold only stages and exchange (and tile_memory
    where there is one): the trace and liveness are `facts`."""
    stages = tables["stages"]
    opts = meta.get("options", {})
    times = facts.timeline.rank_time()
    step_ns = float(times["step_time"].iloc[0]) if len(times) else 0.0
    # an imported trace may not tell its micro-batch size (None): then no sample count
    micro_batch = opts.get("micro_batch_size", 1)
    samples = int(micro_batch) * int(opts.get("microbatches", 1)) if micro_batch else None
    work = stages["forward_cycles"] + stages["backward_cycles"]
    peaks = facts.peak_series()
    return {
        "kind": MEASURED_KIND,
        "fits": fit_verdict(tables.get("tile_memory", empty_tile_memory()), peaks, meta),
        "oom_tiles": 0, "oom_ipus": [],
        "num_ipus": len(facts.ranks), "ranks": sorted(facts.ranks), "replicas": 1,
        "total_ipus": len(facts.ranks),
        "step_cycles": step_ns, "step_ns": step_ns, "step_seconds": step_ns / 1e9,
        "step_ms": step_ns / 1e6, "samples_per_step": samples,
        "throughput": samples / (step_ns / 1e9) if samples and step_ns > 0 else None,
        "latency_ms": None, "training": True,
        "idle_fraction": idle_fractions(times)[1],
        "bottleneck_stage": int(stages.loc[work.idxmax(), "stage"]) if len(stages) else None,  # type: ignore[call-overload, index]  # pandas-stubs: a cell is any scalar
        "peak_liveness_bytes": {str(int(k)): int(v) for k, v in peaks.items()},  # type: ignore[call-overload]  # pandas-stubs: a label is Hashable
        "schedule": opts.get("schedule"), "strategy": "pipelined",
        "micro_batch_size": int(micro_batch) if micro_batch else None,
        "microbatches": int(opts.get("microbatches", 1)),
        "recorded_steps": facts.steps if facts.ranks else 1,
        "liveness_steps": len(facts.liveness_steps),
        "exchange_bytes": int(tables["exchange"]["bytes"].sum()),
        "stages": stages.to_dict(orient="records"),
    }


def empty_tile_memory() -> pd.DataFrame:
    """A measured run has no tiles: the table exists (the reader requires it) with no rows,
    so `fits` is None (unknown: there is no capacity to hold the run against)."""
    return pd.DataFrame({c: pd.Series([], dtype="int64") for c in TILE_COLUMNS})
