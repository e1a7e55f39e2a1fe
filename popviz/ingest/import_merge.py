"""The ranks of an import merged into one profile's tables, one rank at a time.

First what spans the ranks, from their light parts only (`light_of`): the common clock,
each send matched to its receive, the stages (`JobPlan`). Then each rank is finished
where its tables are (`finish_rank`: here from the part_store, or on the Dask worker that
parsed it): moved onto the common clock, its p2p waits added to its trace, micro-batches
numbered by its transfers, op ids continued from the rank before, checked as the reader
will check them. `merge_ranks` hands each finished rank, in rank order, to a sink (a
`ProfileStream` writing the file, or `MemorySink`) and forgets it; what the stages table,
summary and meta need stays in a `TraceFacts`. The small tables that span the ranks (p2p,
exchange, stages) are built last, whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from popviz.format import bounds
from popviz.format.encoded import EncodedFrame, encode_frame
from popviz.ingest import kineto_events as kev
from popviz.ingest import kineto_lanes, waits
from popviz.ingest import tables as tbl
from popviz.ingest.clocks import align
from popviz.ingest.import_checks import check_rows, clean_text
from popviz.ingest.import_rank import DATA_ERRORS, RankPart, data_error
from popviz.ingest.p2p import match_p2p
from popviz.ingest.part_store import PartStore

# the trace's integer columns (a rank's events and its p2p waits concatenated)
TRACE_INTS = ("ipu", "start", "end", "stage", "microbatch", "step", "bytes", "peer")
# tables with rows of every rank, streamed rank by rank
RANK_TABLES = ("trace", "ops", "liveness", "host_slices", "kernels", "alloc_blocks",
               "alloc_segments", "alloc_frames")


Slice = pd.DataFrame | EncodedFrame  # a rank's rows of a table, as finished


class TableSink(Protocol):
    def append(self, name: str, frame: Slice) -> None: ...


@dataclass
class MemorySink:
    """Each table's slices concatenated (`popviz.measure`'s few ranks, tests)."""

    frames: dict[str, list[pd.DataFrame]] = field(default_factory=dict)

    def append(self, name: str, frame: Slice) -> None:
        assert isinstance(frame, pd.DataFrame), "ranks finished here are frames"
        held = self.frames.setdefault(name, [])
        if len(frame) or not held:
            held.append(frame)

    def tables(self) -> dict[str, pd.DataFrame]:
        out = {}
        for name, frames in self.frames.items():
            full = [f for f in frames if len(f)]
            out[name] = pd.concat(full, ignore_index=True) if full else frames[0]
        return out


@dataclass
class JobPlan:
    """What spans the ranks, from their light parts (rank order)."""

    parts: list[RankPart]
    origin: int
    p2p: pd.DataFrame  # every call, matched
    waits: dict[int, pd.DataFrame]  # a CPU rank's p2p calls as trace events, by rank
    info: list[dict[str, Any]]  # stage, ipu (and boundary_bytes) per stage

    @classmethod
    def of(cls, parts: list[RankPart], offsets: dict[int, int] | None = None) -> JobPlan:
        origin = align(parts, offsets)
        info = [{"stage": s, "ipu": t.rank} for t in parts for s in t.stages]
        p2p = match_p2p([t.calls for t in parts])
        found: dict[int, pd.DataFrame] = {}
        if len(p2p):
            events = waits.p2p_events(p2p[~p2p["on_gpu"].astype(bool)], kev.EVENT_COLUMNS)
            ranks = events["ipu"].to_numpy(np.int64)
            found = {r: events[ranks == r] for r in np.unique(ranks).tolist()}
        boundary_bytes(info, p2p)
        return cls(parts, origin, p2p, found, info)

    def rows(self) -> dict[str, int]:
        """Every table's row count (the rank tables from the parts' counts): the reader's
        bounds depend on them. exchange is at most a row per p2p call and trace event."""
        rows: dict[str, int] = {}
        for part in self.parts:
            for name, n in part.row_counts.items():
                rows[name] = rows.get(name, 0) + n
        rows["trace"] = rows.get("trace", 0) + sum(len(w) for w in self.waits.values())
        rows["p2p"] = len(self.p2p)
        rows["stages"] = len(self.info)
        rows["exchange"] = rows["trace"] + len(self.p2p)
        return rows

    def rank_args(self, meta: dict[str, Any], label: str) -> list[RankArgs]:
        """What finishing each rank takes besides its tables (rank order)."""
        dims = bounds.dimensions(meta, "rank", self.rows(), {})
        first = np.cumsum([0] + [t.row_counts.get("ops", 0) for t in self.parts])
        return [RankArgs(t.base_ns - self.origin, self.waits.get(t.rank), int(first[k]),
                         dims, label) for k, t in enumerate(self.parts)]


@dataclass
class RankArgs:
    """One rank's finishing, beside its part and the job's p2p (`finish_rank`)."""

    shift_ns: int  # its clock onto the common one
    waiting: pd.DataFrame | None  # its p2p calls as trace events (a CPU rank)
    first_op: int  # its first op's id
    dims: bounds.Dimensions  # what the reader will bound the profile by
    label: str  # the inputs, as errors name them


@dataclass
class FinishedRank:
    """A rank's share of every rank table, ready to write, and what the small tables, the
    summary and the meta take from it."""

    tables: dict[str, Slice]
    facts: tbl.TraceFacts
    transfers: pd.DataFrame | None  # its collectives and copies (exchange rows)
    # each bounded column's largest value (`largest_values`), taken where it was finished
    largest: dict[tuple[str, str], float] = field(default_factory=dict)


def finish_rank(part: RankPart, args: RankArgs, p2p: pd.DataFrame) -> FinishedRank:
    """`part` on the common clock, its tables finished (`rank_tables`), text cleaned and
    checked against the reader's bounds; runs where the part is (a Dask worker, or
    here). A data error is a ProfileError naming the inputs."""
    try:
        part.shift_tables(args.shift_ns)
        tables = rank_tables(part, args.waiting, p2p, args.first_op)
        clean_text(tables)
        facts = tbl.TraceFacts.of(tables["trace"], tables["liveness"])
        transfers = device_transfers(tables["trace"])
    except DATA_ERRORS as exc:
        raise data_error(args.label, exc) from None
    for name, frame in tables.items():
        check_rows(name, frame, args.dims, args.label)
    kept = {n: tables[n] for n in RANK_TABLES if n in tables}
    return FinishedRank(dict[str, Slice](kept), facts, transfers, largest_values(kept))


def finish_rank_encoded(part: RankPart, args: RankArgs, p2p: pd.DataFrame
                        ) -> FinishedRank:
    """`finish_rank` with its tables' columns encoded as the profile stores them
    (format/encoded.py): on a Dask worker, so the client that writes every rank takes
    each in as arrays and each distinct text once."""
    done = finish_rank(part, args, p2p)
    done.tables = {name: encode_frame(frame) for name, frame in done.tables.items()
                   if isinstance(frame, pd.DataFrame)}
    return done


def finished_here(plan: JobPlan, store: PartStore, args: list[RankArgs],
                  between: Callable[[], None] = lambda: None) -> Iterator[FinishedRank]:
    """Each rank finished in this process, in rank order, its tables taken from `store`
    (and forgotten there); `between()` runs before each (Ctrl-C's check)."""
    for light, rank_args in zip(plan.parts, args, strict=True):
        between()
        yield finish_rank(store.take(light), rank_args, plan.p2p)


def rank_tables(part: RankPart, waiting: pd.DataFrame | None, p2p: pd.DataFrame,
                first_op: int) -> dict[str, pd.DataFrame]:
    """One rank's share of every rank table, finished (common clock): its trace with its
    p2p waits, sorted, micro-batches numbered by its transfers; ops numbered from
    `first_op` in (start, end) order."""
    events = [part.events] + ([waiting] if waiting is not None and len(waiting) else [])
    trace = pd.concat([e for e in events if len(e)] or events[:1], ignore_index=True)
    trace = trace.astype({c: "int64" for c in TRACE_INTS})
    trace["op_class"] = trace["op_class"].fillna("") if "op_class" in trace else ""
    trace = kineto_lanes.fill_links(trace)
    trace = trace.sort_values(["ipu", "start", "end"], kind="stable").reset_index(drop=True)
    number_by_transfers(trace, p2p)
    ops = part.ops.sort_values(["ipu", "start", "end"], kind="stable") \
        .reset_index(drop=True) if len(part.ops) else part.ops
    ops["op_id"] = np.arange(first_op, first_op + len(ops), dtype=np.int64)
    out = {"trace": trace, "ops": ops, "liveness": part.liveness,
           "host_slices": part.slices}
    if len(part.kernels):  # CUPTI's launch fields (format 1.4)
        out["kernels"] = part.kernels
    out.update(part.allocations)
    return out


def largest_values(tables: dict[str, pd.DataFrame]) -> dict[tuple[str, str], float]:
    """Each bounded column's largest finite value (`bounds.COLUMNS`), per (table, column):
    what the reader's bounds of the exact row counts are checked against at the end."""
    out: dict[tuple[str, str], float] = {}
    for name, frame in tables.items():
        for column in bounds.COLUMNS.get(name, {}):
            if column in frame.columns and len(frame) and frame[column].dtype.kind in "iuf":
                values = frame[column].to_numpy(np.float64)
                values = values[np.isfinite(values)]  # the rest was refused per rank
                if len(values):
                    out[(name, column)] = float(values.max())
    return out


@dataclass
class Written:
    """What went through the sink: rows per table and each bounded column's largest value.
    Each rank's rows were checked against bounds from an upper bound of the row counts;
    the reader bounds them by the exact counts, known only at the end (`check`)."""

    rows: dict[str, int] = field(default_factory=dict)
    largest: dict[tuple[str, str], float] = field(default_factory=dict)

    def add(self, done: FinishedRank) -> None:
        for name, frame in done.tables.items():
            self.rows[name] = self.rows.get(name, 0) + len(frame)
        for key, top in done.largest.items():
            self.largest[key] = max(top, self.largest.get(key, top))

    def check(self, small: dict[str, pd.DataFrame], meta: dict[str, Any], label: str) -> None:
        """ProfileError naming `label` if a bound of the exact counts refuses a value."""
        rows = {**self.rows, **{name: len(frame) for name, frame in small.items()}}
        dims = bounds.dimensions(meta, "rank", rows, {})
        for (name, column), top in self.largest.items():
            check_rows(name, pd.DataFrame({column: [top]}), dims, label)


def merge_ranks(plan: JobPlan, finished: Iterable[FinishedRank], sink: TableSink
                ) -> tuple[dict[str, pd.DataFrame], tbl.TraceFacts, Written]:
    """Every finished rank's tables through `sink`, in rank order; returns the small
    tables that span the ranks (p2p, exchange, stages, tile_memory), the facts of the
    trace and what was written."""
    facts = tbl.TraceFacts()
    written = Written()
    transfers: list[pd.DataFrame] = [waits.transfers(plan.p2p)] if len(plan.p2p) else []
    for done in finished:
        facts.merge(done.facts)
        if done.transfers is not None:
            transfers.append(done.transfers)
        written.add(done)
        for name, frame in done.tables.items():
            sink.append(name, frame)
        del done
    small = {"p2p": waits.p2p_table(plan.p2p), "exchange": exchange_table(transfers),
             "stages": tbl.stages_table(facts, plan.info, facts.steps),
             "tile_memory": tbl.empty_tile_memory()}
    clean_text(small)
    return small, facts, written


def device_transfers(trace: pd.DataFrame) -> pd.DataFrame | None:
    """A rank's collectives (NCCL kernels with bytes) and device copies ('host' for host
    <-> device) as exchange rows; None when it has none."""
    dev = trace[(trace["kind"].isin(["exchange", "host_io"]))
                & ~trace["op"].astype(str).str.startswith(("wait:", "send ", "recv "))]
    dev = dev[dev["op"].astype(str).str.contains("nccl|Memcpy", case=False, regex=True)]
    if not len(dev):
        return None
    op = dev["op"].astype(str)
    h2d, d2h = op.str.contains("HtoD").to_numpy(), op.str.contains("DtoH").to_numpy()
    rank = dev["ipu"].astype(object).to_numpy()
    return pd.DataFrame({
        "src": np.where(h2d, "host", rank), "dst": np.where(d2h, "host", rank),
        "bytes": dev["bytes"].to_numpy(), "start": dev["start"].to_numpy(),
        "end": dev["end"].to_numpy(),
        # an NCCL send / recv kernel moves a p2p transfer (counted by its call), not a
        # collective
        "kind": np.where(h2d | d2h, "host", np.where(
            op.str.contains(r"nccl\w*?(?:SendRecv|Send|Recv)\b|nccl\w*_(?:Send|Recv)",
                            case=False, regex=True), "p2p_kernel",
            np.where(op.str.contains("nccl", case=False), "collective", "internal"))),
        "stage": dev["stage"].to_numpy(), "microbatch": dev["microbatch"].to_numpy(),
        "step": dev["step"].to_numpy(), "waiting_ns": 0,
        "transfer_ns": (dev["end"] - dev["start"]).to_numpy()})


def exchange_table(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Transfers: each p2p once (its recv; the first part), then each rank's collectives
    and copies, by start."""
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
