"""What an imported trace says of its pipeline schedule and micro-batch size; None when it
does not say (never a guess). See docs/import.md, "Schedule and micro-batch size".

Schedule family, from the order of the forward / backward actions pipelining annotates on
each rank (`PP:{stage}{F|B|I|W}{mb}`, or ScheduleGPipe's `Forward i` / `Backward i`):
a rank that runs a backward before its last forward interleaves them (1F1B), else every
forward comes first (GPipe); with several stages on a rank those are Interleaved1F1B and
LoopedBFS. Split backwards (I / W actions) are one of torch's zero-bubble schedules when
every rank's first step runs exactly that schedule's order (`compiler.schedule_zb`, which
is torch's): ZBV or InterleavedZB; any other order, and a trace without actions
(Schedule1F1B writes none), gives None.

Micro-batch size: the leading dimension of the first input of stage 0's first top-level
forward op inside an annotated micro-batch. Without annotations only a single rank with a
single stage (no pipeline: the batch is the micro-batch) gives one; a pipeline that numbers
no micro-batch (Schedule1F1B) splits the batch before its first op, so None. An
embedding's first input is its weight: its indices (the second input) carry the batch.
"""

from __future__ import annotations

import json
import re

from popviz.compiler.schedule_zb import interleaved_zb_orders, zbv_orders
from popviz.ingest.import_rank import RankPart
from popviz.ingest.kineto_events import PP_ACTION, SINGLE_STAGE

BATCH_SECOND = re.compile(r"^aten::embedding")  # (weight, indices, ...)


def _passes(actions: list[str]) -> list[str] | None:
    """F / B per annotated action in order; None if a backward is split (I / W)."""
    out = []
    for label in actions:
        m = PP_ACTION.match(label)
        if m:
            if m[2] in ("I", "W"):
                return None
            out.append(m[2])
            continue
        m = SINGLE_STAGE.match(label)
        if m:
            out.append(m[1][0])
    return out


def _computes(actions: list[str]) -> list[str]:
    """The forward, input-gradient and weight-gradient actions as popviz writes them
    ("3F0", "3B0", "3W0": torch's I is B), in order."""
    out = []
    for label in actions:
        m = PP_ACTION.match(label)
        if m and m[2] in ("F", "I", "W"):
            out.append(f"{m[1]}{'B' if m[2] == 'I' else m[2]}{m[3]}")
    return out


def zero_bubble_seen(parts: list[RankPart]) -> str | None:
    """ZBV or InterleavedZB when every rank's first step is that schedule's order for the
    ranks and micro-batches the trace holds, else None (also for one rank, whose order
    any split-backward schedule could give)."""
    runs = {part.rank: _computes(part.actions) for part in parts}
    ranks = len(parts)
    if ranks < 2 or sorted(runs) != list(range(ranks)):
        return None
    stages = sorted({s for part in parts for s in part.stages})
    forwards = {a for run in runs.values() for a in run if "F" in a}
    if not stages or len(stages) % ranks or not forwards:
        return None
    m = len(forwards) // len(stages)  # every stage runs each micro-batch's forward once
    candidates: dict[str, list[list[str]]] = {}
    if len(stages) == 2 * ranks:
        candidates["ZBV"] = [[str(a) for a in o] for o in zbv_orders(ranks, m)]
    if m % max(1, m // ranks) == 0:
        candidates["InterleavedZB"] = [[str(a) for a in o] for o in
                                       interleaved_zb_orders(ranks, len(stages) // ranks, m)]
    for name, orders in candidates.items():
        if all(runs[r][:len(order)] == order for r, order in enumerate(orders)):
            return name
    return None


def schedule_seen(parts: list[RankPart]) -> str | None:
    """GPipe, 1F1B, LoopedBFS, Interleaved1F1B, ZBV or InterleavedZB as the ranks'
    annotated actions show it (the schedule family a trace shows;
    `measure.split.canonical_schedule` is the name a user typed, which a live run keeps
    in meta.options.schedule)."""
    interleaved = False
    for part in parts:
        passes = _passes(part.actions)
        if passes is None:
            return zero_bubble_seen(parts)
        if "F" in passes and "B" in passes:
            last_f = len(passes) - 1 - passes[::-1].index("F")
            interleaved |= "B" in passes[:last_f]
    if not any(part.actions for part in parts):
        return None
    looped = max(len(part.stages) for part in parts) > 1
    if looped:
        return "Interleaved1F1B" if interleaved else "LoopedBFS"
    return "1F1B" if interleaved else "GPipe"


def micro_batch_size(parts: list[RankPart]) -> int | None:
    """The first stage's first forward op's batch dimension (see the module doc)."""
    annotated = any(part.actions for part in parts)
    if not annotated and (len(parts) > 1 or any(len(p.stages) > 1 for p in parts)):
        return None  # a pipeline that numbers no micro-batch: its first op sees the batch
    firsts = [(stage, part.first_ops[stage]) for part in parts for stage in part.first_ops]
    if not firsts:
        return None
    op, shapes = min(firsts)[1]
    try:
        dims = json.loads(shapes)
        dims = json.loads(dims) if isinstance(dims, str) else dims  # a quoted list (CPU)
    except ValueError:
        return None
    at = 1 if BATCH_SECOND.match(op) else 0
    if not isinstance(dims, list) or len(dims) <= at or not isinstance(dims[at], list) \
            or not dims[at] or not isinstance(dims[at][0], int) or dims[at][0] < 1:
        return None
    return int(dims[at][0])
