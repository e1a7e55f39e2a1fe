"""`popviz.import_trace` / `popviz import`: torch.profiler (Kineto) traces of one or many
ranks, and optionally CUDA memory snapshots, into one measured profile.

Clocks (`clocks`): every rank's times are ns since its `baseTimeNanoseconds` plus the
event's `ts`, less the rank's clock offset where a live run measured one; t = 0 is the
earliest event over all ranks. Sends and recvs pair in `p2p` and split into waiting and
transfer in `waits`. `popviz.measure` feeds its ranks through `import_parts` below. See
docs/import.md.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from popviz.errors import ProfileError
from popviz.ingest import kineto_events as kev
from popviz.ingest import kineto_lanes, waits
from popviz.ingest import tables as tbl
from popviz.ingest.clocks import align
from popviz.ingest.import_checks import check_tables, clean_text
from popviz.ingest.import_rank import DATA_ERRORS, RankPart, data_error, rank_parts, use_snapshot
from popviz.ingest.import_schedule import micro_batch_size, schedule_seen
from popviz.ingest.p2p import match_p2p

PathLike = str | os.PathLike[str]


def read_ranks(paths: list[PathLike], workers: int = 1, scheduler: str | None = None,
               progress: Callable[[int, int, RankPart], None] | None = None
               ) -> list[RankPart]:
    """Every file parsed into its rank's tables (a missing or unreadable one is named in a
    ProfileError), sorted by rank; a rank given twice or missing from the world the traces
    name is refused. `scheduler`: parse them on that Dask cluster (`import_dask`)."""
    if not paths:
        raise ProfileError("no trace file given")
    if scheduler is not None:
        from popviz.ingest.import_dask import dask_rank_parts

        parts = dask_rank_parts(paths, scheduler, workers, progress)
    else:
        parts = rank_parts(paths, workers)
    if len(parts) > 1 and not all(t.meta.get("distributedInfo") for t in parts):
        bare = next(t for t in parts if not t.meta.get("distributedInfo"))
        raise ProfileError(f"{bare.path}: no distributedInfo (rank); several traces must "
                           "each come from one rank of a torch.distributed run")
    empty = next((t for t in parts if t.first_ns is None), None)
    if empty is not None:
        raise ProfileError(f"{empty.path}: no events popviz can use (host ops, kernels, "
                           "annotations): was torch.profiler running?")
    seen: dict[int, Path] = {}
    for t in parts:
        if t.rank in seen:
            raise ProfileError(f"rank {t.rank} given twice: {seen[t.rank]} and {t.path}")
        seen[t.rank] = t.path
    world = max(t.world_size for t in parts)  # at most import_limits.MAX_WORLD
    missing = [r for r in range(world) if r not in seen] if len(parts) > 1 else []
    if missing:
        named = ", ".join(map(str, missing[:10])) + (f", ... ({len(missing):,} in all)"
                                                      if len(missing) > 10 else "")
        raise ProfileError(f"rank(s) {named} of {world} missing: give every rank's trace")
    return sorted(parts, key=lambda t: t.rank)


def exchange_rows(p2p: pd.DataFrame, trace: pd.DataFrame) -> pd.DataFrame:
    """Transfers: each p2p once (its recv), collectives (NCCL kernels with bytes), and
    device copies ('host' for host <-> device)."""
    parts = [waits.transfers(p2p)] if len(p2p) else []
    dev = trace[(trace["kind"].isin(["exchange", "host_io"]))
                & ~trace["op"].astype(str).str.startswith(("wait:", "send ", "recv "))]
    dev = dev[dev["op"].astype(str).str.contains("nccl|Memcpy", case=False, regex=True)]
    if len(dev):
        op = dev["op"].astype(str)
        h2d, d2h = op.str.contains("HtoD").to_numpy(), op.str.contains("DtoH").to_numpy()
        rank = dev["ipu"].astype(object).to_numpy()
        parts.append(pd.DataFrame({
            "src": np.where(h2d, "host", rank), "dst": np.where(d2h, "host", rank),
            "bytes": dev["bytes"].to_numpy(), "start": dev["start"].to_numpy(),
            "end": dev["end"].to_numpy(),
            # an NCCL send / recv kernel moves a p2p transfer (counted above, by its call),
            # not a collective
            "kind": np.where(h2d | d2h, "host", np.where(
                op.str.contains(r"nccl\w*?(?:SendRecv|Send|Recv)\b|nccl\w*_(?:Send|Recv)",
                                case=False, regex=True), "p2p_kernel",
                np.where(op.str.contains("nccl", case=False), "collective", "internal"))),
            "stage": dev["stage"].to_numpy(), "microbatch": dev["microbatch"].to_numpy(),
            "step": dev["step"].to_numpy(), "waiting_ns": 0,
            "transfer_ns": (dev["end"] - dev["start"]).to_numpy()}))
    if not parts:
        return pd.DataFrame({c: pd.Series([], dtype="int64" if c not in ("src", "dst", "kind")
                                          else object) for c in tbl.EXCHANGE_COLUMNS})
    frame = pd.concat(parts, ignore_index=True)[tbl.EXCHANGE_COLUMNS]
    return frame.sort_values("start", kind="stable").reset_index(drop=True)


def number_by_transfers(trace: pd.DataFrame, p2p: pd.DataFrame) -> None:
    """Micro-batch of compute no annotation numbered (Schedule1F1B writes none): on a rank
    with one stage, a forward (backward) belongs to the micro-batch of the next activation
    (gradient) it sends, or on the stage that sends none, of the last one it received."""
    if p2p.empty:
        return
    for (rank, ps), rows in trace[(trace["kind"] == "compute") & (trace["microbatch"] < 0)
                                  & trace["pass"].isin(["F", "B"])].groupby(["ipu", "pass"]):
        mine = p2p[(p2p["rank"] == rank) & (p2p["pass"] == ps)]
        sends = mine[mine["direction"] == "send"].sort_values("start")
        recvs = mine[mine["direction"] == "recv"].sort_values("end")
        if len(sends):
            at = np.searchsorted(sends["start"].to_numpy(), rows["end"].to_numpy(), "left")
            mb = np.append(sends["microbatch"].to_numpy(), -1)[at]
        elif len(recvs):
            at = np.searchsorted(recvs["end"].to_numpy(), rows["start"].to_numpy(),
                                 "right") - 1
            mb = np.where(at >= 0, recvs["microbatch"].to_numpy()[np.maximum(at, 0)], -1)
        else:
            continue
        trace.loc[rows.index, "microbatch"] = mb


def boundary_bytes(info: list[dict[str, Any]], p2p: pd.DataFrame) -> None:
    """Each stage's activation bytes sent per micro-batch (what a split point costs)."""
    if p2p.empty:
        return
    sent = p2p[(p2p["direction"] == "send") & (p2p["pass"] == "F")]
    for i in info:
        mine = sent[sent["stage"] == i["stage"]]
        count = len(mine[["step", "microbatch"]].drop_duplicates())
        i["boundary_bytes"] = int(mine["bytes"].sum() // count) if count else 0


def renumber(ops: pd.DataFrame) -> pd.DataFrame:
    """op_id in (rank, start) order; keeps the import's extra columns (gpu_ns, shapes...)."""
    ops = ops.sort_values(["ipu", "start", "end"], kind="stable").reset_index(drop=True)
    ops["op_id"] = np.arange(len(ops), dtype=np.int64)
    return ops


def _snapshots(memory_snapshot: Any, n: int) -> list[Path | None]:
    if memory_snapshot is None:
        return [None] * n
    items = [memory_snapshot] if isinstance(memory_snapshot, (str, os.PathLike)) \
        else list(memory_snapshot)
    if len(items) > n:
        raise ProfileError(f"{len(items)} memory snapshots for {n} rank trace(s): give at "
                           "most one per rank, in rank order")
    return [Path(p) for p in items] + [None] * (n - len(items))


def import_tables(parts: list[RankPart]) -> tuple[dict[str, pd.DataFrame],
                                                  list[dict[str, Any]]]:
    events = [t.events for t in parts]
    info = [{"stage": s, "ipu": t.rank} for t in parts for s in t.stages]
    p2p = match_p2p([t.calls for t in parts])
    if len(p2p):
        events.append(waits.p2p_events(p2p[~p2p["on_gpu"].astype(bool)], kev.EVENT_COLUMNS))
    trace = pd.concat([e for e in events if len(e)] or events[:1], ignore_index=True)
    trace = trace.astype({c: "int64" for c in ("ipu", "start", "end", "stage", "microbatch",
                                              "step", "bytes", "peer")})
    trace["op_class"] = trace["op_class"].fillna("") if "op_class" in trace else ""
    trace = kineto_lanes.fill_links(trace)
    trace = trace.sort_values(["ipu", "start", "end"], kind="stable").reset_index(drop=True)
    number_by_transfers(trace, p2p)
    liveness = pd.concat([t.liveness for t in parts], ignore_index=True)
    steps = max(1, int(trace["step"].nunique())) if len(trace) else 1
    boundary_bytes(info, p2p)
    result = {
        "trace": trace, "liveness": liveness, "p2p": waits.p2p_table(p2p),
        "stages": tbl.stages_table(trace, liveness, info, steps),
        "exchange": exchange_rows(p2p, trace),
        "ops": renumber(pd.concat([t.ops for t in parts], ignore_index=True)),
        "tile_memory": tbl.empty_tile_memory(),
        "host_slices": pd.concat([t.slices for t in parts], ignore_index=True),
    }
    result.update(allocation_tables(parts))
    kernels = [t.kernels for t in parts if len(t.kernels)]
    if kernels:  # CUPTI's launch fields (format 1.4); absent: no kernel carried any
        result["kernels"] = pd.concat(kernels, ignore_index=True)
    del events
    for t in parts:  # held once, in the tables, from here on (the peak is still ahead)
        t.events = t.calls = t.liveness = t.ops = t.slices = t.kernels = pd.DataFrame()
        t.labeller, t.allocations = None, {}
    return result, info


def allocation_tables(parts: list[RankPart]) -> dict[str, pd.DataFrame]:
    """Every rank's snapshot blocks, segments and stacks as one table each ({} when no
    rank had a snapshot: the tables stay absent, as in a profile of format 1.1)."""
    have = [t.allocations for t in parts if t.allocations]
    return {name: pd.concat([a[name] for a in have], ignore_index=True)
            for name in ("alloc_blocks", "alloc_segments", "alloc_frames")} if have else {}


def run_name(paths: list[Path]) -> str:
    """The file's name without suffixes; for several ranks what their names share
    (without 'rank'), else their folder's name."""
    stems = [p.name.split(".")[0] for p in paths]
    if len(stems) == 1:
        return stems[0]
    shared = os.path.commonprefix(stems).rstrip("_-.")  # noqa: RUF071 - names, not paths
    shared = shared[:-4].rstrip("_-.") if shared.lower().endswith("rank") else shared
    return shared or paths[0].resolve().parent.name


def import_meta(traces: list[RankPart], info: list[dict[str, Any]], origin: int,
                snapshots: list[Path | None], trace: pd.DataFrame) -> dict[str, Any]:
    first = traces[0]
    props = first.meta.get("deviceProperties")
    device = props[0].get("name") if isinstance(props, list) and props \
        and isinstance(props[0], dict) else None
    device = device[:200] if isinstance(device, str) and device else None
    backend = first.backend or ("cuda" if device else "cpu")
    name = device or ("cpu" if backend == "cpu" else f"cpu-{backend}")
    ranks = [t.rank for t in traces]
    mbs = trace.loc[trace["microbatch"] >= 0, "microbatch"].nunique()
    stages = sorted({i["stage"] for i in info})
    options: dict[str, Any] = {"strategy": "pipelined" if len(stages) > 1 else "single",
               "schedule": schedule_seen(traces), "gradient_accumulation": max(1, mbs),
               "device_iterations": 1, "replication_factor": 1,
               "available_memory_proportion": None, "precision": None,
               "recomputation": False, "splits": [], "microbatches": max(1, mbs),
               "micro_batch_size": micro_batch_size(traces),
               "stages_per_rank": max(1, len(stages) // len(ranks)),
               "steps": max(1, int(trace["step"].nunique())) if len(trace) else 1}
    memory = {str(t.rank): t.device_memory for t in traces if t.device_memory}
    return {
        "kind": "measured",
        "target": {"name": name, "num_ipus": len(ranks), "tiles_per_ipu": 1,
                   "bytes_per_tile": 0, "clock_hz": 1e9},
        "options": options,
        "model": {"name": run_name([t.path for t in traces])},
        "ranks": ranks,
        "measure": {"imported": True, "ranks": ranks, "world_size": first.world_size,
                    "backend": backend, "stages": stages, "num_stages": len(stages),
                    "origin_ns": origin, "source": [str(t.path) for t in traces],
                    "memory_snapshots": [str(s) if s else None for s in snapshots],
                    "device": device, "device_memory_bytes": memory,
                    "clock": {str(t.rank): {"base_ns": t.base_ns} for t in traces}},
        "warnings": [w for t in traces for w in t.warnings],
    }


def import_trace(paths: PathLike | Iterable[PathLike], to: PathLike,
                 memory_snapshot: PathLike | Iterable[PathLike] | None = None, *,
                 command_line: str | None = None, workers: int = 1,
                 scheduler: str | None = None,
                 on_warning: Callable[[str], None] | None = None,
                 on_progress: Callable[[int, int, RankPart], None] | None = None) -> Path:
    """Import torch.profiler traces (one file per rank) into a measured profile at `to`
    (a .h5 path or a directory to hold profile.h5); returns its path. With `workers` > 1
    (0: one per CPU) the ranks are parsed in that many worker processes; with `scheduler`
    ("local", or a Dask scheduler's address) on a Dask cluster (`import_dask`), calling
    `on_progress(done, total, part)` as each arrives. `on_warning` is called with each
    one-line warning (also kept in meta.warnings)."""
    from popviz.format.writer import write_profile

    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    snapshots = _snapshots(memory_snapshot, len(paths))
    # millions of short-lived dicts and lists, none in a cycle: the cyclic collector would
    # rescan them all again and again (4x the parse time on a 300k-event trace)
    collecting = gc.isenabled()
    gc.disable()
    try:
        traces = read_ranks(paths, workers, scheduler, on_progress)
        for t, snap in zip(traces, snapshots):  # in rank order
            if snap is not None:
                use_snapshot(t, snap)
        label = ", ".join(str(p) for p in paths[:4]) + (", ..." if len(paths) > 4 else "")
        result, meta, summary = import_parts(traces, label, snapshots)
    finally:
        if collecting:
            gc.enable()
    if on_warning is not None:
        for warning in meta["warnings"]:
            on_warning(warning)
    return write_profile(to, meta=meta, tables=result, summary=summary,
                         kind="measured", command_line=command_line or " ".join(sys.argv))


def import_parts(traces: list[RankPart], label: str,
                 snapshots: list[Path | None] | None = None, *,
                 offsets: dict[int, int] | None = None,
                 adjust: Callable[[dict[str, pd.DataFrame], dict[str, Any]], None] | None
                 = None) -> tuple[dict[str, pd.DataFrame], dict[str, Any], dict[str, Any]]:
    """Every rank's parsed trace (rank order) -> tables, meta and summary, checked as the
    reader would (a ProfileError naming `label` otherwise). `offsets`: each rank's clock
    minus rank 0's, where a live run measured them (`clocks`). `adjust(tables, meta)` may
    add what a live run knows beyond the traces (layers, losses) before the summary."""
    snapshots = snapshots if snapshots is not None else [None] * len(traces)
    try:  # across the ranks: what the data makes go wrong names every input
        origin = align(traces, offsets)
        result, info = import_tables(traces)
        meta = import_meta(traces, info, origin, snapshots, result["trace"])
        if adjust is not None:
            adjust(result, meta)
        clean_text(result)  # before the summary, which quotes op names
        summary = tbl.summary(result, meta)
    except DATA_ERRORS as exc:
        raise data_error(label, exc) from None
    check_tables(result, meta, label)
    return result, meta, summary
