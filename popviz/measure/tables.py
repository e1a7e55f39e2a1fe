"""From a rank's probe records to the contract tables of a measured profile.

Times are ns on the common clock (0 = the clock sync before the recorded steps). A P2P op's
blocking wait [wait_start, wait_end] splits at the peer's matching post: before it the rank
waits for a peer that is not ready (trace kind `idle`), after it the data moves (kind
`exchange`). gloo sends rendezvous with the receiver, so the same split holds for sends.
The `*_cycles` columns of `stages` hold ns (meta.target.clock_hz = 1e9), as a mean per
recorded training step. See docs/measure.md.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pandas as pd

from popviz.metrics import (
    fit_verdict,
    idle_fraction,
    peak_liveness,
    stage_table_times,
    step_time,
)
from popviz.vocab import MEASURED_KIND, rank_label

TRACE_COLUMNS = ["ipu", "start", "end", "kind", "stage", "microbatch", "pass", "op", "step",
                 "bytes", "peer"]
EXCHANGE_COLUMNS = ["src", "dst", "bytes", "start", "end", "kind", "stage", "microbatch",
                    "step", "waiting_ns", "transfer_ns"]
P2P_COLUMNS = ["rank", "peer", "direction", "kind", "stage", "microbatch", "step", "seq",
               "bytes", "post", "post_end", "wait_start", "wait_end", "peer_post", "waiting_ns",
               "transfer_ns", "matched", "batch", "works"]
LIVENESS_COLUMNS = ["ipu", "step", "phase", "always_live_bytes", "not_always_live_bytes",
                    "label", "microbatch", "stage", "pass", "training_step",
                    "stashed_microbatches"]
VARIABLE_COLUMNS = ["ipu", "name", "category", "bytes", "first_step", "last_step", "stage",
                    "microbatch", "training_step"]
TILE_COLUMNS = ["ipu", "tile", "capacity_bytes", "total_bytes"]
OPS_COLUMNS = ["op_id", "op", "phase", "ipu", "stage", "microbatch", "pass", "step",
               "start", "end", "host_ns", "bytes", "peer", "waiting_ns", "transfer_ns"]
STAGE_COLUMNS = ["stage", "ipu", "forward_cycles", "backward_cycles", "recompute_cycles",
                 "exchange_cycles", "idle_cycles", "stash_bytes", "peak_bytes",
                 "optimiser_cycles", "other_cycles", "sync_cycles", "first_layer",
                 "last_layer", "steps", "forward_cycles_per_microbatch",
                 "backward_cycles_per_microbatch", "stash_depth", "boundary_bytes"]


def to_common(records: list[dict[str, Any]], origin: int,
              keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """Copies of `records` with the `keys` times moved to the common clock (-1 stays)."""
    out = []
    for rec in records:
        rec = dict(rec)
        for key in keys:
            if rec.get(key, -1) >= 0:
                rec[key] = int(rec[key] - origin)
        out.append(rec)
    return out


def match_p2p(mine: list[dict[str, Any]], everyone: list[dict[str, Any]]) -> pd.DataFrame:
    """My P2P ops with their peer's post time and the waiting / transfer split.

    The k-th send from a to b meets the k-th recv at b from a (gloo matches in order on one
    tag), so ops pair on (src, dst, seq); the pairing is checked on micro-batch and kind."""
    index = {(r["rank"], r["peer"], r["direction"], r["seq"]): r for r in everyone}
    rows = []
    for rec in mine:
        other = "recv" if rec["direction"] == "send" else "send"
        peer = index.get((rec["peer"], rec["rank"], other, rec["seq"]))
        matched = peer is not None and peer["microbatch"] == rec["microbatch"] \
            and peer["kind"] == rec["kind"] and peer["bytes"] == rec["bytes"]
        ws, we = rec["wait_start"], rec["wait_end"]
        if ws < 0:  # never waited on: count it as done when posted
            ws = we = rec["post"]
        peer_post = peer["post"] if peer is not None else rec["post"]
        split = min(max(peer_post, ws), we)
        rows.append({**rec, "wait_start": ws, "wait_end": we, "peer_post": peer_post,
                     "waiting_ns": split - ws, "transfer_ns": we - split,
                     "matched": bool(matched)})
    frame = pd.DataFrame(rows, columns=P2P_COLUMNS)
    return frame.astype({c: "int64" for c in P2P_COLUMNS
                         if c not in ("direction", "kind", "matched")})


def _p2p_label(row: Any) -> str:
    way = "to" if row.direction == "send" else "from"
    return f"{row.direction} {row.kind} mb{row.microbatch} {way} {rank_label(row.peer)}"


def trace_table(compute: list[dict[str, Any]], p2p: pd.DataFrame) -> pd.DataFrame:
    """Compute events, and for each P2P op an idle (waiting) and an exchange event."""
    rows = [{"ipu": c["rank"], "start": c["start"], "end": c["end"], "kind": "compute",
             "stage": c["stage"], "microbatch": c["microbatch"], "pass": c["pass"],
             "op": c["op"], "step": c["step"], "bytes": 0, "peer": -1} for c in compute]
    for row in p2p.itertuples(index=False):
        pass_ = "F" if row.kind == "activation" else "B"
        label = _p2p_label(row)
        common = {"ipu": row.rank, "stage": row.stage, "microbatch": row.microbatch,
                  "pass": pass_, "step": row.step, "peer": row.peer}
        split = row.wait_start + row.waiting_ns  # type: ignore[operator]  # pandas-stubs: a cell is any scalar
        if row.waiting_ns > 0:  # type: ignore[arg-type, operator]  # pandas-stubs: a cell is any scalar
            rows.append({**common, "start": row.wait_start, "end": split, "kind": "idle",
                         "op": f"wait: {label}", "bytes": 0})
        rows.append({**common, "start": split, "end": row.wait_end, "kind": "exchange",
                     "op": label, "bytes": row.bytes})
    rows.extend(_post_events(p2p))
    frame = pd.DataFrame(rows, columns=TRACE_COLUMNS)
    frame = frame.astype({c: "int64" for c in ("ipu", "start", "end", "stage", "microbatch",
                                              "step", "bytes", "peer")})
    return frame.sort_values(["ipu", "start", "end"], kind="stable").reset_index(drop=True)


def _post_events(p2p: pd.DataFrame) -> list[dict[str, Any]]:
    """One exchange event per posting call (`_batch_p2p`): time the rank spent inside
    isend / irecv / batch_isend_irecv before it could go on (bytes 0: the op's own
    exchange event carries them)."""
    rows = []
    for key, batch in p2p.groupby(["rank", "post", "post_end"], sort=True):
        rank, post, post_end = cast(tuple[int, int, int], key)
        if post_end <= post:
            continue
        first = batch.iloc[0]
        rows.append({"ipu": rank, "start": post, "end": post_end, "kind": "exchange",
                     "stage": first["stage"], "microbatch": first["microbatch"],
                     "pass": "F" if first["kind"] == "activation" else "B",
                     "op": "post: " + " + ".join(_p2p_label(r) for r in
                                                 batch.itertuples(index=False)),
                     "step": first["step"], "bytes": 0, "peer": first["peer"]})
    return rows


def exchange_table(p2p: pd.DataFrame) -> pd.DataFrame:
    """One row per transfer this rank received: from the later of the two posts (data can
    only move once both sides are posted) to the receiver's completion."""
    recv = p2p[p2p["direction"] == "recv"]
    start = np.maximum(recv["post"], recv["peer_post"])
    frame = pd.DataFrame({
        "src": recv["peer"].astype(object), "dst": recv["rank"].astype(object),
        "bytes": recv["bytes"], "start": start,
        "end": np.maximum(start, recv["wait_end"]), "kind": recv["kind"],
        "stage": recv["stage"], "microbatch": recv["microbatch"], "step": recv["step"],
        "waiting_ns": recv["waiting_ns"], "transfer_ns": recv["transfer_ns"],
    }, columns=EXCHANGE_COLUMNS)
    return frame.reset_index(drop=True)


def ops_table(trace: pd.DataFrame, p2p: pd.DataFrame) -> pd.DataFrame:
    """One row per action: compute actions from the trace, P2P ops from `p2p`."""
    comp = trace[trace["kind"] == "compute"]
    phase = comp["pass"].map({"F": "forward", "B": "backward", "WU": "optimiser"})
    rows = pd.DataFrame({
        "op": comp["op"], "phase": phase, "ipu": comp["ipu"], "stage": comp["stage"],
        "microbatch": comp["microbatch"], "pass": comp["pass"], "step": comp["step"],
        "start": comp["start"], "end": comp["end"], "host_ns": comp["end"] - comp["start"],
        "bytes": 0, "peer": -1, "waiting_ns": 0, "transfer_ns": 0})
    comm = pd.DataFrame({
        "op": [_p2p_label(r) for r in p2p.itertuples(index=False)],
        "phase": "exchange", "ipu": p2p["rank"], "stage": p2p["stage"],
        "microbatch": p2p["microbatch"],
        "pass": np.where(p2p["kind"] == "activation", "F", "B"), "step": p2p["step"],
        "start": p2p["post"], "end": p2p["wait_end"],
        "host_ns": p2p["wait_end"] - p2p["wait_start"], "bytes": p2p["bytes"],
        "peer": p2p["peer"], "waiting_ns": p2p["waiting_ns"],
        "transfer_ns": p2p["transfer_ns"]})
    frames = [f for f in (rows, comm) if len(f)]
    ops = pd.concat(frames, ignore_index=True) if frames else rows
    return renumber_ops(ops)


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
    rows = []
    for k, info in enumerate(stage_info):
        s, rank = info["stage"], info["ipu"]
        comp = trace[(trace["stage"] == s) & (trace["kind"] == "compute")]
        t = times.iloc[k]
        microbatches = max(1, comp.loc[comp["pass"] == "F", "microbatch"].nunique())
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
