"""One rank's share of `popviz import`: parse its trace and build its tables, in a worker
process when there are several ranks (each rank's parse is independent CPU work, and the
raw events then never reach the main process: it receives only the rank's tables).

Times are on the rank's own clock (ns since its `baseTimeNanoseconds`) until the importer
knows every rank's first event; `RankPart.shift` then moves them onto the common one.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from popviz.errors import ProfileError
from popviz.ingest import kineto_events as kev
from popviz.ingest import kineto_lanes, memsnap, memsnap_blocks
from popviz.ingest.import_limits import MAX_MEMORY_BYTES, LimitError
from popviz.ingest.kineto import read_trace
from popviz.ingest.kineto_launch import launch_table
from popviz.ingest.kineto_ops import op_classes, ops_table

PathLike = str | os.PathLike[str]


@dataclass
class RankPart:
    """What the importer keeps of one rank: the file's fields and the rank's tables."""

    path: Path
    meta: dict[str, Any]
    rank: int
    world_size: int
    backend: str
    base_ns: int
    first_ns: int | None  # first event on the rank's clock; None: no usable event
    on_gpu: bool = False
    stages: list[int] = field(default_factory=list)
    events: pd.DataFrame = field(default_factory=pd.DataFrame)
    calls: pd.DataFrame = field(default_factory=pd.DataFrame)
    liveness: pd.DataFrame = field(default_factory=pd.DataFrame)
    ops: pd.DataFrame = field(default_factory=pd.DataFrame)
    slices: pd.DataFrame = field(default_factory=pd.DataFrame)  # host spans by thread, depth
    kernels: pd.DataFrame = field(default_factory=pd.DataFrame)  # kernels' launch fields
    actions: list[str] = field(default_factory=list)  # pipelining's labels, in order
    first_ops: dict[int, tuple[str, str]] = field(default_factory=dict)  # see first_ops
    labeller: kev.Labeller | None = None
    window: tuple[int, int] = (0, 0)  # first start, last end (rank clock)
    warnings: list[str] = field(default_factory=list)  # said by `popviz import`, kept in meta
    device_memory: int | None = None  # the GPU's memory (bytes) when the trace says it
    # where each of torch.profiler's steps (`ProfilerStep#N`) starts, rank clock, in order
    step_starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def step_of(self, time: Any) -> np.ndarray:
        """The recorded step (0, 1, ... in order) holding each time; 0 without steps or
        before the first."""
        t = np.asarray(time, dtype=np.int64)
        if len(self.step_starts) < 2:
            return np.zeros(len(t), dtype=np.int64)
        return np.maximum(np.searchsorted(self.step_starts, t, "right") - 1, 0)
    allocations: dict[str, pd.DataFrame] = field(default_factory=dict)  # snapshot_allocations
    # the rows its tables add to each profile table (trace: before its p2p waits), kept
    # when the tables are set apart (`light_of`)
    row_counts: dict[str, int] = field(default_factory=dict)

    def shift(self, origin: int) -> None:
        """Move every time from the rank's clock onto the common one (0 = `origin`)."""
        by = self.base_ns - origin
        self.step_starts = self.step_starts + by
        _shift(((self.calls, ("start", "end")),), by)
        self.shift_tables(by)

    def shift_tables(self, by: int) -> None:
        """Move the rank's tables (not its calls or steps) by `by` ns: `shift` of a part
        whose tables were kept apart while the rest was shifted (part_store)."""
        _shift(((self.events, ("start", "end")), (self.ops, ("start", "end")),
                (self.slices, ("start", "end")), (self.liveness, ("time",)),
                *((f, ("start", "end")) for f in self.allocations.values())), by)


HEAVY = ("events", "liveness", "ops", "slices", "kernels", "allocations", "labeller")


def light_of(part: RankPart) -> RankPart:
    """`part` without its tables (what spans the ranks reads only the rest: calls, stages,
    steps, meta), with the rows they hold in `row_counts`."""
    counts = {"trace": len(part.events), "ops": len(part.ops),
              "liveness": len(part.liveness), "host_slices": len(part.slices),
              "kernels": len(part.kernels),
              **{name: len(f) for name, f in part.allocations.items()}}
    return replace(part, events=pd.DataFrame(), liveness=pd.DataFrame(), ops=pd.DataFrame(),
                   slices=pd.DataFrame(), kernels=pd.DataFrame(), allocations={},
                   labeller=None, row_counts=counts)


def _shift(frames: Any, by: int) -> None:
    for frame, cols in frames:
        for c in cols:
            if c in frame.columns and len(frame):
                frame[c] = frame[c].astype("int64") + by


def liveness_of(part: RankPart, time: np.ndarray, allocated: np.ndarray) -> pd.DataFrame:
    """The rank's liveness table from allocated bytes over time (rank clock), each sample
    labelled with the stage, pass and micro-batch running then."""
    time, allocated = memsnap.thin(time, allocated)
    assert part.labeller is not None, "liveness_of before the rank's trace was read"
    stage, ps, mb = part.labeller.label(time)
    lo, hi = part.window  # a snapshot may come from another run: no phase outside the trace
    outside = (time < lo) | (time > hi)
    ps[outside], mb[outside] = "", -1
    return memsnap.liveness_rows(part.rank, time, allocated, (stage, ps, mb))


def use_snapshot(part: RankPart, snapshot: Path) -> None:
    """Replace the rank's liveness (before `shift`) with a CUDA memory snapshot's. A
    snapshot none of whose events falls inside the trace's window was taken in another run:
    when the trace has memory events of its own they stay (and headline the run), with a
    warning; without them the snapshot's curve is kept, with a warning."""
    try:
        _use_snapshot(part, snapshot)
    except DATA_ERRORS as exc:
        raise data_error(str(snapshot), exc) from None


def snapshot_allocations(part: RankPart, snap: dict[str, Any], device: int
                         ) -> dict[str, pd.DataFrame]:
    """The snapshot's blocks, segments and stacks (`memsnap_blocks`) on the rank's clock:
    kept even from another run (the allocation view is the snapshot's own story). Blocks
    it cannot read leave the view out, with a warning: the liveness curve still stands."""
    try:
        tables = memsnap_blocks.allocation_tables(snap, device, part.rank)
    except DATA_ERRORS as exc:
        part.warnings.append(f"memory snapshot (rank {part.rank}): its blocks cannot be "
                             f"read ({type(exc).__name__}: {' '.join(str(exc).split())[:80]})"
                             "; no allocation view")
        return {}
    for name in ("alloc_blocks", "alloc_segments"):
        for c in ("start", "end"):
            tables[name][c] = tables[name][c] - part.base_ns
    return tables


def _use_snapshot(part: RankPart, snapshot: Path) -> None:
    snap = memsnap.read_snapshot(snapshot)
    time, allocated, device = memsnap.snapshot_series(snap, snapshot)
    part.allocations = snapshot_allocations(part, snap, device)
    del snap
    time = time - part.base_ns  # snapshot: epoch ns
    own = part.liveness is not None and len(part.liveness) > 0
    keep_own = own and memsnap.disjoint(time, part.window)
    warning = memsnap.mismatch(snapshot, time, part.window, part.rank, used=not keep_own)
    if warning:
        part.warnings.append(warning)
    if keep_own:  # another run's memory must not stand for this one's
        return
    part.liveness = liveness_of(part, time, allocated)
    part.device_memory = device_memory(part.meta, device)


# what hostile data can make pandas, numpy or the parse raise: each becomes one line
DATA_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError,
               ZeroDivisionError, RecursionError, MemoryError, UnicodeError)


def data_error(where: str, exc: BaseException) -> ProfileError:
    """A one-line ProfileError for an exception raised by a file's data."""
    if isinstance(exc, MemoryError):
        return ProfileError(f"{where}: too large to import in the memory available")
    text = " ".join(str(exc).split())[:160]
    return ProfileError(f"{where}: cannot import it ({type(exc).__name__}: {text})")


def rank_part(path: PathLike) -> RankPart:
    """Parse one rank's trace and build its tables (rank clock); whatever its data makes
    go wrong is a ProfileError naming it."""
    try:
        return _rank_part(path)
    except LimitError as exc:  # a bound of import_limits: name the file
        raise ProfileError(f"{path}: {exc}") from None
    except DATA_ERRORS as exc:
        raise data_error(str(path), exc) from None


def _rank_part(path: PathLike) -> RankPart:
    t = read_trace(path)
    spans = t.spans
    time, allocated, device = memsnap.trace_series(t.memory)  # time sorted
    # the rank's first event, its memory events included: one recorded before the first
    # span sat before time 0 (an interleaved run's memory axis began at -234,832 ns)
    first = int(spans["start"].min()) if len(spans) else None
    if first is not None and len(time):
        first = min(first, int(time[0]))
    part = RankPart(path=t.path, meta=t.meta, rank=t.rank, world_size=t.world_size,
                    backend=t.backend, base_ns=t.base_ns, first_ns=first,
                    warnings=list(t.warnings))
    if spans.empty:
        return part
    lab = part.labeller = kev.Labeller(spans, t.rank, t.world_size)
    part.window = (int(spans["start"].min()), int(spans["end"].max()))
    part.on_gpu = bool(spans["cat"].isin(kev.GPU_CATS).any())
    part.events = (kev.gpu_events(spans, t.rank, lab) if part.on_gpu
                   else kev.cpu_events(spans, t.rank, lab))
    # the launching op's class, as the ops table gives it: op-level range statistics
    launched = part.events["host_op"].to_numpy() != ""
    part.events["op_class"] = np.where(launched, op_classes(part.events["host_op"]), "")
    part.step_starts = profiler_steps(spans)
    part.calls = kev.p2p_calls(spans, t.rank, lab, part.step_of).assign(on_gpu=part.on_gpu)
    part.liveness = liveness_of(part, time, allocated)
    if device is not None:  # a GPU's memory events: its capacity holds them
        part.device_memory = device_memory(t.meta, device)
    part.ops = ops_table(spans, t.rank, lab)
    part.slices = kineto_lanes.host_slices(spans, t.rank)
    part.kernels = launch_table(spans, t.rank)
    part.stages = [int(s) for s in lab.stages]
    for frame in (part.events, part.ops):
        frame["step"] = part.step_of(frame["start"]) if len(frame) else 0
    act = lab.ann[lab.ann["pass"].isin(["F", "B"]) & (lab.ann["microbatch"] >= 0)]
    part.actions = act.sort_values("start", kind="stable")["label"].astype(str).tolist()
    part.first_ops = first_ops(part.ops, annotated=bool(part.actions))
    return part


def profiler_steps(spans: pd.DataFrame) -> np.ndarray:
    """Start times of torch.profiler's `ProfilerStep#N` annotations (one per
    `prof.step()`), in order; empty when the run marked no steps."""
    marks = spans[kev.name_test(spans["name"], lambda n: n.str.match(r"^ProfilerStep#\d+$"))]
    return np.sort(marks["start"].to_numpy(np.int64))


def device_memory(meta: dict[str, Any], device_id: int | None) -> int | None:
    """The GPU's memory in bytes (`totalGlobalMem` of the trace's deviceProperties): the
    device the memory events name, else the size every listed device shares; None when
    the trace does not say (a CPU run, an older torch)."""
    sizes: dict[int, int] = {}
    for props in meta.get("deviceProperties") or []:
        try:
            size = int(props["totalGlobalMem"])
            sizes[int(props.get("id", -1))] = size if size <= MAX_MEMORY_BYTES else 0
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError):
            continue
    if device_id in sizes:
        return sizes[device_id] if sizes[device_id] > 0 else None
    distinct = set(sizes.values())
    return distinct.pop() if len(distinct) == 1 and min(distinct) > 0 else None


def first_ops(ops: pd.DataFrame, annotated: bool) -> dict[int, tuple[str, str]]:
    """Per stage: (name, input shapes) of its first top-level forward op with shapes,
    inside a numbered micro-batch when the schedule annotated them (before the schedule
    runs, the whole batch is split: those ops see the batch, not a micro-batch)."""
    if ops.empty or "shapes" not in ops.columns:
        return {}
    fwd = ops[(ops["pass"] == "F") & (ops["stage"] >= 0) & ops["top_level"].astype(bool)
              & (ops["shapes"].astype(str).str.len() > 2)]
    if annotated:
        fwd = fwd[fwd["microbatch"] >= 0]
    fwd = fwd.sort_values("start", kind="stable").drop_duplicates("stage")
    return {int(s): (str(o), str(d)) for s, o, d in zip(fwd["stage"], fwd["op"],
                                                          fwd["shapes"])}


def rank_parts(paths: list[PathLike], workers: int = 1) -> Iterator[RankPart]:
    """`rank_part` of every file, in order, each as it is ready: in this process
    (workers=1, the default), else in up to `workers` worker processes (0: one per CPU),
    at most one per file. Workers cut the wall time on idle cores but each holds a parse's
    temporaries at once, so the process tree's peak memory grows with their number
    (docs/import.md)."""
    workers = min(len(paths), workers if workers > 0 else os.cpu_count() or 1)
    if workers < 2:
        yield from (rank_part(p) for p in paths)
        return
    # fork: the workers start without importing popviz again (Linux); spawn elsewhere
    method = "fork" if sys.platform == "linux" else None
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context(method)) as pool:
        yield from pool.map(rank_part, paths)
