"""`popviz.import_trace` / `popviz import`: torch.profiler (Kineto) traces of one or many
ranks, and optionally CUDA memory snapshots, into one measured profile.

Clocks (`clocks`): every rank's times are ns since its `baseTimeNanoseconds` plus the
event's `ts`, less the rank's clock offset where a live run measured one; t = 0 is the
earliest event over all ranks. Sends and recvs pair in `p2p` and split into waiting and
transfer in `waits`. `popviz.measure` feeds its ranks through `import_parts` below. See
docs/import.md.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from popviz.errors import ProfileError
from popviz.format import bounds, tempfiles
from popviz.format.stream import ProfileStream
from popviz.format.writer import MEASURED_WORDS
from popviz.ingest import tables as tbl
from popviz.ingest.import_checks import check_meta, check_rows, check_tables, clean_text
from popviz.ingest.import_merge import (
    FinishedRank,
    JobPlan,
    MemorySink,
    RankArgs,
    finished_here,
    merge_ranks,
)
from popviz.ingest.import_rank import DATA_ERRORS, RankPart, data_error, rank_parts, use_snapshot
from popviz.ingest.import_schedule import micro_batch_size, schedule_seen
from popviz.ingest.part_store import PartStore
from popviz.vocab import MEASURED_KIND

PathLike = str | os.PathLike[str]


def check_ranks(parts: list[RankPart]) -> list[RankPart]:
    """The parsed ranks (light or whole) sorted by rank; a file without a rank among
    several, one without events, a rank given twice or missing from the world the traces
    name is refused."""
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


def _snapshots(memory_snapshot: Any, n: int) -> list[Path | None]:
    if memory_snapshot is None:
        return [None] * n
    items = [memory_snapshot] if isinstance(memory_snapshot, (str, os.PathLike)) \
        else list(memory_snapshot)
    if len(items) > n:
        raise ProfileError(f"{len(items)} memory snapshots for {n} rank trace(s): give at "
                           "most one per rank, in rank order")
    return [Path(p) for p in items] + [None] * (n - len(items))


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
                snapshots: list[Path | None], microbatches: int = 0, steps: int = 1
                ) -> dict[str, Any]:
    """The profile's meta; `microbatches` (numbered in the trace) and `steps` come from
    the trace once it is merged (`TraceFacts`), and only change counts in options."""
    first = traces[0]
    props = first.meta.get("deviceProperties")
    device = props[0].get("name") if isinstance(props, list) and props \
        and isinstance(props[0], dict) else None
    device = device[:200] if isinstance(device, str) and device else None
    backend = first.backend or ("cuda" if device else "cpu")
    name = device or ("cpu" if backend == "cpu" else f"cpu-{backend}")
    ranks = [t.rank for t in traces]
    mbs = microbatches
    stages = sorted({i["stage"] for i in info})
    options: dict[str, Any] = {"strategy": "pipelined" if len(stages) > 1 else "single",
               "schedule": schedule_seen(traces), "gradient_accumulation": max(1, mbs),
               "device_iterations": 1, "replication_factor": 1,
               "available_memory_proportion": None, "precision": None,
               "recomputation": False, "splits": [], "microbatches": max(1, mbs),
               "micro_batch_size": micro_batch_size(traces),
               "stages_per_rank": max(1, len(stages) // len(ranks)),
               "steps": max(1, steps)}
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
                 on_progress: Callable[[int, int, RankPart], None] | None = None,
                 on_written: Callable[[int, int, int], None] | None = None) -> Path:
    """Import torch.profiler traces (one file per rank) into a measured profile at `to`
    (a .h5 path or a directory to hold profile.h5); returns its path. With `workers` > 1
    (0: one per CPU) the ranks are parsed in that many worker processes; with `scheduler`
    ("local", or a Dask scheduler's address) on a Dask cluster (`import_dask`), which also
    finishes each rank. `on_progress(done, total, part)` is called as each rank is parsed
    (here or on the cluster), `on_written(done, total, rank)` as each is written into the
    profile. `on_warning` is called with each one-line warning (also kept in meta.warnings). The
    profile is written rank by rank (import_merge, format/stream.py): memory holds a few
    ranks' tables, not the job's."""
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not paths:
        raise ProfileError("no trace file given")
    snapshots = _snapshots(memory_snapshot, len(paths))
    label = ", ".join(str(p) for p in paths[:4]) + (", ..." if len(paths) > 4 else "")
    # millions of short-lived dicts and lists, none in a cycle: the cyclic collector would
    # rescan them all again and again (4x the parse time on a 300k-event trace). On a Dask
    # cluster the parse runs on the workers, and the client's Dask objects do make cycles
    # (left uncollected: 512 ranks' client peak 190 instead of 174 MiB)
    collecting = gc.isenabled()
    if scheduler is None:
        gc.disable()
    try:
        with contextlib.ExitStack() as stack:
            if scheduler is None:
                store = stack.enter_context(PartStore())
                lights = []
                for part in rank_parts(paths, workers):
                    lights.append(store.put(part))
                    if on_progress is not None:
                        on_progress(len(lights), len(paths), part)
            else:
                from popviz.ingest.import_dask import dask_ranks

                job = stack.enter_context(dask_ranks(paths, scheduler, workers))
                lights = job.parse(on_progress)
            given = {id(t): i for i, t in enumerate(lights)}  # each rank's file
            traces = check_ranks(lights)
            for k, snap in enumerate(snapshots):  # in rank order
                if snap is not None and k < len(traces):
                    i = given.pop(id(traces[k]))
                    traces[k] = store.update(traces[k], functools.partial(
                        use_snapshot, snapshot=snap)) if scheduler is None \
                        else job.update(i, use_snapshot, snap, given=str(snap))
                    given[id(traces[k])] = i
            order = [given[id(t)] for t in traces]

            def finisher(plan: JobPlan, args: list[RankArgs], between: Callable[[], None]
                         ) -> Iterator[FinishedRank]:
                ranks = finished_here(plan, store, args, between) if scheduler is None \
                    else _checked(job.finished(order, args, plan.p2p), between)
                for k, done in enumerate(ranks, 1):
                    yield done  # written when the merge asks for the next one
                    if on_written is not None:
                        on_written(k, len(traces), traces[k - 1].rank)

            path, meta = _write_job(traces, finisher, to, label, snapshots,
                                    command_line or " ".join(sys.argv))
    finally:
        if collecting:
            gc.enable()
    if on_warning is not None:
        for warning in meta["warnings"]:
            on_warning(warning)
    return path


Finisher = Callable[[JobPlan, list[RankArgs], Callable[[], None]], Iterable[FinishedRank]]


def _checked(ranks: Iterable[FinishedRank], between: Callable[[], None]
             ) -> Iterator[FinishedRank]:
    """`ranks`, with `between` (an interrupt check) before each."""
    for done in ranks:
        between()
        yield done


def _write_job(traces: list[RankPart], finisher: Finisher, to: PathLike, label: str,
               snapshots: list[Path | None], command_line: str
               ) -> tuple[Path, dict[str, Any]]:
    """Plan what spans the ranks, stream each finished rank into the profile, then the
    tables that span them, meta and summary."""
    try:  # across the ranks: what the data makes go wrong names every input
        plan = JobPlan.of(traces)
        meta = import_meta(traces, plan.info, plan.origin, snapshots)
        args = plan.rank_args(meta, label)
    except DATA_ERRORS as exc:
        raise data_error(label, exc) from None
    stream = ProfileStream(to, kind=MEASURED_KIND, **MEASURED_WORDS)
    with stream, tempfiles.deferred_interrupt() as check:
        try:
            small, facts, written = merge_ranks(plan, finisher(plan, args, check), stream)
            meta = import_meta(traces, plan.info, plan.origin, snapshots,
                               len(facts.microbatches), facts.steps)
            summary = tbl.summary_of(facts, small, meta)
        except DATA_ERRORS as exc:
            raise data_error(label, exc) from None
        rows = {**written.rows, **{name: len(frame) for name, frame in small.items()}}
        dims = bounds.dimensions(meta, "rank", rows, {})
        for name, frame in small.items():
            check_rows(name, frame, dims, label)
        written.check(small, meta, label)  # the ranks' rows against the exact counts
        check_meta(meta, label)
        path = stream.finish(meta=meta, summary=summary, tables=small,
                             command_line=command_line)
    return path, meta


def import_parts(traces: list[RankPart], label: str,
                 snapshots: list[Path | None] | None = None, *,
                 offsets: dict[int, int] | None = None,
                 adjust: Callable[[dict[str, pd.DataFrame], dict[str, Any]], None] | None
                 = None) -> tuple[dict[str, pd.DataFrame], dict[str, Any], dict[str, Any]]:
    """Every rank's parsed trace (rank order) -> tables, meta and summary in memory,
    checked as the reader would (a ProfileError naming `label` otherwise). `offsets`:
    each rank's clock minus rank 0's, where a live run measured them (`clocks`).
    `adjust(tables, meta)` may add what a live run knows beyond the traces (layers,
    losses) before the summary."""
    snapshots = snapshots if snapshots is not None else [None] * len(traces)
    with PartStore(memory_bytes=1 << 62) as store:  # a live run's few ranks: in memory
        lights = [store.put(t) for t in traces]
        try:  # across the ranks: what the data makes go wrong names every input
            plan = JobPlan.of(lights, offsets)
            meta = import_meta(lights, plan.info, plan.origin, snapshots)
            sink = MemorySink()
            small, facts, _ = merge_ranks(plan, finished_here(plan, store, plan.rank_args(
                meta, label)), sink)
            result = {**sink.tables(), **small}
            meta = import_meta(lights, plan.info, plan.origin, snapshots,
                               len(facts.microbatches), facts.steps)
            if adjust is not None:
                adjust(result, meta)
            clean_text(result)  # before the summary, which quotes op names
            summary = tbl.summary_of(facts, result, meta)
        except DATA_ERRORS as exc:
            raise data_error(label, exc) from None
    check_tables(result, meta, label)
    return result, meta, summary
