"""One rank's Kineto spans -> trace events with popviz kinds, stage / pass / micro-batch.

A rank's timeline is its GPU when the trace has GPU activity (kernels are `compute`, NCCL
kernels, device copies and memsets `exchange`, host <-> device copies `host_io`; gaps
between them are `idle`, the host's cudaXSynchronize calls `sync`), else its CPU
threads (top-level ops are `compute`, c10d / gloo / nccl calls `exchange`, gaps stay
untraced: Python between ops). Stage, pass and micro-batch come from the pipelining
annotations around the time an event was launched on the host. See docs/import.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
import pandas as pd

from popviz.actions import TORCH_ACTION, TORCH_TYPE_PASS
from popviz.ingest.import_limits import (
    MAX_ACTION_DIGITS,
    MAX_MEMORY_BYTES,
    MAX_WORLD,
    LimitError,
    check_actions,
)
from popviz.ingest.kineto_lanes import LINK_COLUMNS, gpu_links

MAX_DIM = 1 << 40  # a tensor dimension beyond this is not one
# torch.distributed.pipelining's action annotations, "PP:" + the action's string form
PP_ACTION = re.compile("^PP:" + TORCH_ACTION.pattern.removeprefix("^"))
SINGLE_STAGE = re.compile(r"^(Forward|Backward) (\d+)$")  # ScheduleGPipe's annotations
ACTION_PASS = TORCH_TYPE_PASS
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
COMM_OP = re.compile(r"^(c10d::|record_param_comms|nccl:|gloo:)")
P2P_ANNOTATION = re.compile(r"^(gloo|nccl):(send|recv)$")
DTYPE_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8,
               "int": 4, "short int": 2, "bool": 1, "unsigned char": 1, "signed char": 1,
               "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4,
               "Bool": 1, "Byte": 1, "Char": 1, "Short": 2}
EVENT_COLUMNS = ["ipu", "start", "end", "kind", "stage", "microbatch", "pass", "op", "step",
                 "bytes", "peer", "host_op"]  # host_op: the host op that launched a kernel


def name_test(names: pd.Series, test: Callable[[pd.Series], pd.Series]) -> np.ndarray:
    """`test` (a vectorised str predicate) applied to each distinct name once, as a mask
    over all rows: names are categorical, and 300k rows share a few thousand names."""
    if not isinstance(names.dtype, pd.CategoricalDtype):
        return test(names.astype(str)).to_numpy(dtype=bool)
    hit = test(pd.Series(names.cat.categories.astype(str))).to_numpy(dtype=bool)
    codes = names.cat.codes.to_numpy()
    return np.where(codes >= 0, hit[np.clip(codes, 0, None)], False) if len(hit) \
        else np.zeros(len(names), dtype=bool)


def action_annotations(spans: pd.DataFrame, rank: int, world: int = 1) -> pd.DataFrame:
    """Pipelining actions as intervals: start, end, stage, pass, microbatch, label.
    `PP:{stage}{action}{mb}` (multi-stage schedules), or GPipe's `Forward i` / `Backward i`
    (stage unknown there: -1, filled in with the rank's stage later). Stages and
    micro-batches the trace cannot hold (import_limits.check_actions): LimitError."""
    ua = spans[spans["cat"] == "user_annotation"]
    names = ua["name"].astype(str)
    rows = []
    for start, end, name in zip(ua["start"].to_numpy(), ua["end"].to_numpy(), names):
        m = PP_ACTION.match(name)
        if m:
            rows.append((start, end, _numbered(m[1], "stage", name), ACTION_PASS[m[2]],
                         _numbered(m[3], "micro-batch", name) if m[3] else -1, name))
            continue
        m = SINGLE_STAGE.match(name)
        if m:
            rows.append((start, end, -1, m[1][0], _numbered(m[2], "micro-batch", name),
                         name))
        elif name.startswith("Optimizer.step"):
            rows.append((start, end, -1, "WU", -1, name))
    actions = [r for r in rows if r[5].startswith(("PP:", "Forward", "Backward"))]
    check_actions([r[2] for r in actions], [r[4] for r in actions],
                  [r[5] for r in actions], world)
    frame = pd.DataFrame(rows, columns=["start", "end", "stage", "pass", "microbatch",
                                        "label"])
    return frame.sort_values("start", kind="stable").reset_index(drop=True)


def _numbered(digits: str, what: str, label: str) -> int:
    """The stage or micro-batch number an annotation gives; LimitError past
    MAX_ACTION_DIGITS digits, before it becomes an int64 or sizes anything."""
    if len(digits) > MAX_ACTION_DIGITS:  # (int() of a huge one is slow)
        raise LimitError(f"annotation {label[:80]!r} gives {what} {digits[:30]}, a number "
                         f"of {len(digits)} digits (at most {MAX_ACTION_DIGITS}); refused")
    return int(digits)


def merged_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as sorted disjoint intervals (vectorised)."""
    if len(start) == 0:
        return start.astype(np.int64), end.astype(np.int64)
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    out_end = np.zeros(group[-1] + 1, dtype=np.int64)
    np.maximum.at(out_end, group, e)
    return s[new], out_end


def inside(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Index of the interval (sorted, disjoint) holding each time, or -1."""
    if len(starts) == 0:
        return np.full(len(t), -1, dtype=np.int64)
    idx = np.searchsorted(starts, t, side="right") - 1
    ok = (idx >= 0) & (t < ends[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)


def top_level(spans: pd.DataFrame) -> np.ndarray:
    """Mask of spans not nested in an earlier span of their thread (ops on one thread nest
    properly, so an op is top-level when it starts after every earlier op has ended)."""
    out = np.zeros(len(spans), dtype=bool)
    if spans.empty:
        return out
    order = np.lexsort((-spans["end"].to_numpy(), spans["start"].to_numpy(),
                        spans["tid"].cat.codes.to_numpy()))
    tid = spans["tid"].cat.codes.to_numpy()[order]
    s, e = spans["start"].to_numpy()[order], spans["end"].to_numpy()[order]
    for t in np.unique(tid):
        sel = np.flatnonzero(tid == t)
        reach = np.maximum.accumulate(e[sel])
        first = np.ones(len(sel), dtype=bool)
        first[1:] = s[sel][1:] >= reach[:-1]
        out[order[sel[first]]] = True
    return out


def launch_times(spans: pd.DataFrame, gpu: pd.DataFrame) -> np.ndarray:
    """When each GPU event was launched on the host: the start of the op that launched it
    (its `External id`: the time the ops table labels that op by, so a kernel is in its
    op's stage, pass and micro-batch), else its runtime or driver call (same correlation
    id: cuLaunchKernel launches CUTLASS kernels), else its own start. Not the kernel's own
    start: the GPU runs behind the host, and a backward kernel that runs while the host is
    in the optimiser step was labelled WU."""
    ops = spans[(spans["cat"] == "cpu_op").to_numpy() & (spans["ext"].to_numpy() >= 0)]
    ops = ops.drop_duplicates("ext")
    by_op = pd.Series(ops["start"].to_numpy(), index=ops["ext"].to_numpy())
    found = by_op.reindex(gpu["ext"].to_numpy()).to_numpy(dtype=np.float64)
    rt = spans[spans["cat"].isin(("cuda_runtime", "cuda_driver")).to_numpy()]
    when = pd.Series(rt["start"].to_numpy(), index=rt["corr"].to_numpy())
    when = when[~when.index.duplicated()]
    called = when.reindex(gpu["corr"].to_numpy()).to_numpy(dtype=np.float64)
    found = np.where(np.isnan(found), called, found)
    return np.where(np.isnan(found), gpu["start"].to_numpy(), found).astype(np.int64)


class Labeller:
    """Stage / pass / micro-batch for a time on one rank, from its annotations, its
    backward (autograd) spans and its optimiser step."""

    def __init__(self, spans: pd.DataFrame, rank: int, world: int = 1) -> None:
        self.ann = action_annotations(spans, rank, world)
        stages = sorted(s for s in self.ann["stage"].unique() if s >= 0)
        self.stages = stages or [rank]
        self.default_stage = stages[0] if len(stages) == 1 else rank if not stages else -1
        pp = self.ann[self.ann["label"].str.startswith(("PP:", "Forward", "Backward"))]
        self.pp_start, self.pp_end = pp["start"].to_numpy(), pp["end"].to_numpy()
        self.pp = pp.reset_index(drop=True)
        opt = self.ann[self.ann["pass"] == "WU"]
        self.wu = merged_intervals(opt["start"].to_numpy(), opt["end"].to_numpy())
        bwd = spans[(spans["cat"] == "cpu_op").to_numpy() & name_test(
            spans["name"], lambda n: n.str.startswith("autograd::engine::evaluate_function"))]
        self.bwd = merged_intervals(bwd["start"].to_numpy(), bwd["end"].to_numpy())

    def backward_tail(self, t: np.ndarray) -> np.ndarray:
        """Mask of times after a backward and before the optimiser step that follows it,
        with no other backward between: what `loss.backward()` frees as it returns, the
        loss read back, gradient clipping. They were `F` (nothing marks them), so a
        step's memory read F, B, then F again. Only up to an optimiser step: without one
        what follows a backward may be the next micro-batch's forward (Schedule1F1B
        runs without annotations), and that stays F."""
        (bs, be), (ws, we) = self.bwd, self.wu
        if len(t) == 0 or len(be) == 0 or len(ws) == 0:
            return np.zeros(len(t), dtype=bool)
        none = np.iinfo(np.int64).min

        def last_end(ends: np.ndarray) -> np.ndarray:  # latest end at or before t
            i = np.searchsorted(ends, t, side="right") - 1
            return np.where(i >= 0, ends[np.clip(i, 0, None)], none)

        def next_start(starts: np.ndarray) -> np.ndarray:  # earliest start after t
            i = np.searchsorted(starts, t, side="right")
            return np.where(i < len(starts), starts[np.clip(i, 0, len(starts) - 1)],
                            np.iinfo(np.int64).max)

        after_backward = last_end(be) > last_end(we)
        wu_next = next_start(ws)
        return after_backward & (wu_next < np.iinfo(np.int64).max) \
            & (wu_next <= next_start(bs))

    def label(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        stage = np.full(len(t), self.default_stage, dtype=np.int64)
        mb = np.full(len(t), -1, dtype=np.int64)
        ps = np.full(len(t), "F", dtype=object)
        ps[inside(t, *self.bwd) >= 0] = "B"
        ps[self.backward_tail(t)] = "B"
        ps[inside(t, *self.wu) >= 0] = "WU"
        idx = inside(t, self.pp_start, self.pp_end)
        hit = idx >= 0
        if hit.any():
            row = self.pp.iloc[idx[hit]]
            st = row["stage"].to_numpy()
            stage[hit] = np.where(st >= 0, st, self.default_stage)
            mb[hit] = row["microbatch"].to_numpy()
            named = row["pass"].to_numpy()
            ps[np.flatnonzero(hit)[named != ""]] = named[named != ""]
        return stage, ps, mb


def tensor_bytes(dims: object, types: object) -> int:
    """Bytes of the tensors of an op from its recorded shapes and dtypes (0 if unknown)."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return 0
    total = 0
    for d, ty in zip(dims, types):
        shapes = d if d and isinstance(d[0], list) else [d]
        for shape in shapes:
            if isinstance(shape, list) and all(isinstance(x, int) and 0 <= x < MAX_DIM
                                               for x in shape):
                total += math.prod(shape) * DTYPE_BYTES.get(str(ty), 4)
    return min(total, MAX_MEMORY_BYTES)  # a shape a tensor cannot have: capped, not wrapped


def launching_ops(spans: pd.DataFrame, gpu: pd.DataFrame) -> np.ndarray:
    """The host op that launched each GPU event: the op with the event's `External id`
    (Kineto gives a kernel the id of the innermost op running at its launch; the ops
    table counts the kernel's time there too); "" when none was recorded."""
    ops = spans[spans["cat"] == "cpu_op"]
    ops = ops[ops["ext"].to_numpy() >= 0].drop_duplicates("ext")
    names = pd.Series(ops["name"].astype(str).to_numpy(), index=ops["ext"].to_numpy())
    return names.reindex(gpu["ext"].to_numpy()).fillna("").to_numpy(dtype=object)


def compute_kernels(gpu: pd.DataFrame) -> np.ndarray:
    """Mask of the GPU events a trace counts as compute: kernels, NCCL's excepted (its
    kernels are exchange, as copies and sets are). The ops table's cycles count these."""
    return (gpu["cat"].astype(str) == "kernel").to_numpy() \
        & ~name_test(gpu["name"], lambda n: n.str.contains("nccl", case=False))


def gpu_events(spans: pd.DataFrame, rank: int, lab: Labeller) -> pd.DataFrame:
    """Kernels, copies and sets as trace events, the host's sync calls, and idle gaps."""
    gpu = spans[spans["cat"].isin(GPU_CATS)]
    cat = gpu["cat"].astype(str).to_numpy()
    kind = np.full(len(gpu), "compute", dtype=object)
    kind[(cat == "kernel") & ~compute_kernels(gpu)] = "exchange"  # NCCL's kernels
    copy = cat == "gpu_memcpy"
    host = name_test(gpu["name"], lambda n: n.str.contains("HtoD|DtoH|HtoH", regex=True))
    kind[copy & host] = "host_io"
    kind[copy & ~host] = "exchange"
    kind[cat == "gpu_memset"] = "exchange"  # memory traffic, not compute (as HTA counts it)
    stage, ps, mb = lab.label(launch_times(spans, gpu))
    nbytes = gpu["bytes"].to_numpy().copy()
    coll = gpu["nelems"].to_numpy() > 0
    nbytes[coll] = gpu["nelems"].to_numpy()[coll] * np.array(
        [DTYPE_BYTES.get(d, 4) for d in gpu["dtype"].to_numpy()[coll]], dtype=np.int64)
    ev = pd.DataFrame({"ipu": rank, "start": gpu["start"].to_numpy(),
                       "end": gpu["end"].to_numpy(), "kind": kind, "stage": stage,
                       "microbatch": mb, "pass": ps, "op": gpu["name"].to_numpy(),
                       "step": 0, "bytes": nbytes, "peer": -1,
                       "host_op": launching_ops(spans, gpu)})
    ev[LINK_COLUMNS] = gpu_links(spans, GPU_CATS).to_numpy()  # same rows, same order
    lo, hi = int(ev["start"].min()), int(ev["end"].max())
    busy_s, busy_e = merged_intervals(ev["start"].to_numpy(), ev["end"].to_numpy())
    gap_s, gap_e = busy_e[:-1], busy_s[1:]
    keep = gap_e > gap_s
    gap_s, gap_e = gap_s[keep], gap_e[keep]
    # a gap is the GPU waiting for the work that ends it: labelled as that work is (its
    # launch), not by the host's pass at the gap's own time, which runs ahead of the GPU
    by_start = np.argsort(ev["start"].to_numpy(), kind="stable")
    ending = by_start[np.searchsorted(ev["start"].to_numpy()[by_start], gap_e)]
    g_stage, g_pass, g_mb = stage[ending], ps[ending], mb[ending]
    idle = pd.DataFrame({"ipu": rank, "start": gap_s, "end": gap_e, "kind": "idle",
                         "stage": g_stage, "microbatch": g_mb, "pass": g_pass,
                         "op": "GPU idle", "step": 0, "bytes": 0, "peer": -1,
                         "host_op": ""})
    rt = spans[(spans["cat"] == "cuda_runtime").to_numpy()
               & name_test(spans["name"], lambda n: n.isin(SYNC_CALLS))]
    s = np.clip(rt["start"].to_numpy(), lo, hi)
    e = np.clip(rt["end"].to_numpy(), lo, hi)
    s_stage, s_pass, s_mb = lab.label(s)
    sync = pd.DataFrame({"ipu": rank, "start": s, "end": e, "kind": "sync",
                         "stage": s_stage, "microbatch": s_mb, "pass": s_pass,
                         "op": rt["name"].astype(str).to_numpy(), "step": 0, "bytes": 0,
                         "peer": -1, "host_op": ""})
    parts = [p for p in (ev, idle, sync[sync["end"] > sync["start"]]) if len(p)]
    return pd.concat(parts, ignore_index=True)[EVENT_COLUMNS + LINK_COLUMNS]


def p2p_calls(spans: pd.DataFrame, rank: int, lab: Labeller,
              step_of: Callable[[np.ndarray], np.ndarray] | None = None) -> pd.DataFrame:
    """gloo / nccl send and recv annotations (post to completion) with their peer (from the
    c10d call that posted them) and bytes: rank, direction, peer, start, end, bytes,
    stage, pass, microbatch, seq (k-th op between this rank and that peer that way)."""
    ann = spans[(spans["cat"] == "user_annotation").to_numpy()
                & name_test(spans["name"], lambda n: n.str.match(P2P_ANNOTATION.pattern))]
    calls = spans[(spans["cat"] == "cpu_op").to_numpy()
                  & name_test(spans["name"], lambda n: n.str.match(r"^c10d::(send|recv)"))]
    cols = ["rank", "direction", "peer", "start", "end", "bytes", "stage", "pass",
            "microbatch", "seq", "step"]
    if ann.empty:
        return pd.DataFrame(columns=cols)
    calls = calls.sort_values("start")
    idx = np.searchsorted(calls["start"].to_numpy(), ann["start"].to_numpy(), "right") - 1
    peers = []
    for i in idx:  # c10d::send / recv_(tensors, group, peer, tag): the peer is input 2
        conc = calls["concrete"].iloc[i] if i >= 0 else None
        peer = str(conc[2])[:12] if isinstance(conc, list) and len(conc) > 2 else ""
        peers.append(int(peer) if peer.isdigit() and int(peer) < MAX_WORLD else -1)
    # posted when the c10d call began: gloo opens its annotation only when that call
    # returns, and a first send may block in it until the peer connects
    post = np.where(idx >= 0, calls["start"].to_numpy()[np.clip(idx, 0, None)],
                    ann["start"].to_numpy()) if len(calls) else ann["start"].to_numpy()
    direction = ann["name"].astype(str).str.split(":").str[1].to_numpy()
    stage, ps, mb = lab.label(post)
    frame = pd.DataFrame({
        "rank": rank, "direction": direction, "peer": peers,
        "start": post, "end": ann["end"].to_numpy(),
        "bytes": [tensor_bytes(d, t) for d, t in zip(ann["dims"], ann["types"])],
        "stage": stage, "pass": ps, "microbatch": mb,
        "step": step_of(post) if step_of is not None else 0})
    frame = frame.sort_values("start", kind="stable").reset_index(drop=True)
    frame["seq"] = frame.groupby(["direction", "peer"]).cumcount()
    # without pipelining's annotations (Schedule1F1B has none): stages run in rank order,
    # so what goes to a lower rank (or comes from a higher one) is a gradient, and each
    # way carries the micro-batches in order
    bare = (frame["microbatch"] < 0).to_numpy()
    down = ((frame["direction"] == "send") & (frame["peer"] < rank)) \
        | ((frame["direction"] == "recv") & (frame["peer"] > rank))
    frame.loc[bare, "pass"] = np.where(down.to_numpy()[bare], "B", "F")
    # (numbered afresh in each of torch.profiler's steps)
    frame.loc[bare, "microbatch"] = frame.groupby(["direction", "peer", "step"]
                                                  ).cumcount().to_numpy()[bare]
    return frame[cols]


def cpu_events(spans: pd.DataFrame, rank: int, lab: Labeller) -> pd.DataFrame:
    """Top-level host ops as compute (c10d / gloo / nccl calls as exchange)."""
    ops = spans[spans["cat"] == "cpu_op"]
    ops = ops[top_level(ops)]
    kind = np.where(name_test(ops["name"], lambda n: n.str.match(COMM_OP.pattern)),
                    "exchange", "compute")
    stage, ps, mb = lab.label(ops["start"].to_numpy())
    return pd.DataFrame({"ipu": rank, "start": ops["start"].to_numpy(),
                         "end": ops["end"].to_numpy(), "kind": kind, "stage": stage,
                         "microbatch": mb, "pass": ps, "op": ops["name"].to_numpy(),
                         "step": 0, "bytes": 0, "peer": -1,
                         "host_op": ops["name"].to_numpy()})[EVENT_COLUMNS]
