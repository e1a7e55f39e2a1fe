"""Finding things in a profile's trace: the ops (and, for an import, the kernels) whose
name or module holds a text, optionally in one pass or one micro-batch. Pure functions
over the profile's tables; the /trace page's search box lists what they find and links to
each, centred and outlined (`links.op_span`, in micro-batch N's pass with `mb:N`).

    q = parse_query("conv pass:B mb:2")     # text "conv", backward ops of micro-batch 2
    note = microbatch_note(profile.ops, profile.trace, q)   # "" unless mb:2 cannot narrow
    found, total = find_ops(profile.ops, q, trace=profile.trace)

A modelled op runs once in every micro-batch (its ops table has no micro-batch): `mb:N`
keeps the ops whose pass has a run in micro-batch N, and each links to that run. A measured
op ran once: its micro-batch is its own where the ops table has one, else that of the
trace's event its start falls in (a CPU run's top-level ops, transfers and waits carry it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.analysis.liveness_sections import PHASE_LETTER

LIMIT = 20  # matches listed at once
_FILTER = re.compile(r"^(pass|mb|microbatch|micro-batch):(\S+)$", re.IGNORECASE)
PASS_WORDS = {"f": "F", "forward": "F", "b": "B", "backward": "B", "r": "R",
              "recompute": "R", "wu": "WU", "update": "WU", "w": "W", "i": "I"}


@dataclass(frozen=True)
class Query:
    """What to look for: `text` in an op's (or kernel's) name or module, case ignored;
    `passes` and `microbatch` narrow it where the profile tells them apart."""

    text: str = ""
    passes: tuple[str, ...] = ()
    microbatch: int | None = None

    @property
    def empty(self) -> bool:
        return not self.text and not self.passes and self.microbatch is None


def parse_query(typed: str | None) -> Query:
    """`conv pass:B mb:2`: words are the text (joined by spaces), `pass:` a pass (F, B,
    R, WU, W, I or a word for one), `mb:` a micro-batch number. Unknown filters are text."""
    words, passes, microbatch = [], [], None
    for word in (typed or "").split()[:20]:
        found = _FILTER.match(word)
        if found and found.group(1).lower() == "pass":
            passes.append(PASS_WORDS.get(found.group(2).lower(), found.group(2).upper()))
        elif found and re.fullmatch(r"[0-9]{1,8}", found.group(2)):
            microbatch = int(found.group(2))
        else:
            words.append(word)
    return Query(" ".join(words)[:200], tuple(passes), microbatch)


def _holds(column: pd.Series, text: str) -> np.ndarray:
    # a copy: pandas may hand out a read-only view, and the filters narrow it in place
    return np.array(column.astype(str).str.contains(text, case=False, regex=False),
                    dtype=bool)


def _timed(ops: pd.DataFrame) -> bool:
    """Whether the ops carry their own times (measured), not modelled cycles alone."""
    return {"start", "end"} <= set(ops.columns)


def run_microbatches(trace: pd.DataFrame) -> np.ndarray:
    """The micro-batches the trace's events name, sorted (none when it names none)."""
    if trace.empty or "microbatch" not in trace.columns:
        return np.array([], dtype=np.int64)
    mb = trace["microbatch"].to_numpy()
    return np.unique(mb[mb >= 0]).astype(np.int64)


def op_microbatches(ops: pd.DataFrame, trace: pd.DataFrame) -> np.ndarray:
    """Per op of a measured run, the micro-batch it ran in, -1 where the profile cannot
    tell: the op's own `microbatch` where the ops table has one, else that of the trace
    event on its device, naming a micro-batch, that holds the op's start (the latest
    starting such event; a CPU run's ops carry none, its top-level ops, transfers and
    waits on the trace do). An import's kernels are left out of that: they run after
    their launch, not around it. All -1 for modelled ops (they run in every micro-batch)."""
    n = len(ops)
    out = ops["microbatch"].to_numpy(dtype=np.int64).copy() if "microbatch" in ops.columns \
        else np.full(n, -1, dtype=np.int64)
    need = (out < 0) & _timed(ops)
    if not need.any() or "ipu" not in ops.columns or trace.empty \
            or not {"ipu", "start", "end", "microbatch"} <= set(trace.columns):
        return out
    ev = trace[trace["microbatch"].to_numpy() >= 0]
    if "host_op" in ev.columns and "op" in ev.columns:  # the host's own time alone
        host = ev["host_op"].astype(str).to_numpy()
        ev = ev[(host == "") | (host == ev["op"].astype(str).to_numpy())]
    start, o_ipu = ops["start"].to_numpy(dtype=float), ops["ipu"].to_numpy()
    for ipu, g in ev.groupby("ipu", sort=True):
        mine = np.flatnonzero(need & (o_ipu == ipu) & (start >= 0))
        if not len(mine):
            continue
        # equal starts: the shorter last, so the innermost of nested events is taken
        g = g.assign(_len=g["end"] - g["start"]).sort_values(["start", "_len"],
                                                             ascending=[True, False],
                                                             kind="stable")
        s, e = g["start"].to_numpy(dtype=float), g["end"].to_numpy(dtype=float)
        m = g["microbatch"].to_numpy(dtype=np.int64)
        at = start[mine]
        k = np.searchsorted(s, at, side="right") - 1
        ok = k >= 0
        k = np.where(ok, k, 0)
        holds = ok & ((at < e[k]) | (s[k] == e[k]))
        # overlapping events: the latest to start may have ended; the longest-reaching
        # event that started before still holds the op when it reaches past its start
        reach = np.maximum.accumulate(np.where(e == np.maximum.accumulate(e),
                                               np.arange(len(e)), 0))[k]
        holds_too = ok & ~holds & (at < e[reach])
        out[mine] = np.where(holds, m[k], np.where(holds_too, m[reach], -1))
    return out


def _spans(numbers: np.ndarray) -> str:
    """0-15, or 0-3, 8, 10-11 (at most five runs, then ...)."""
    runs: list[str] = []
    nums = [int(x) for x in numbers]
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        runs.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(runs[:5]) + (", ..." if len(runs) > 5 else "")


def known_microbatches(ops: pd.DataFrame, trace: pd.DataFrame,
                       microbatches: np.ndarray | None = None) -> np.ndarray:
    """The micro-batches the profile can place its ops in: its trace's, and a measured
    run's ops' (`microbatches`: `op_microbatches(ops, trace)`, if known). Empty: `mb:N`
    cannot narrow anything, and the rest of a query still has an answer."""
    known = run_microbatches(trace)
    if _timed(ops):
        mbs = op_microbatches(ops, trace) if microbatches is None else microbatches
        known = np.union1d(known, mbs[mbs >= 0]).astype(np.int64)
    return known


def microbatch_note(ops: pd.DataFrame, trace: pd.DataFrame, query: Query,
                    microbatches: np.ndarray | None = None,
                    known: np.ndarray | None = None) -> str:
    """One line when `mb:N` cannot narrow the search ("" when it can or is not asked):
    N is none of the run's micro-batches, or the profile cannot tell which micro-batch
    its ops (and kernels) ran in. `microbatches`: `op_microbatches(ops, trace)`, and
    `known`: `known_microbatches(...)`, if already known."""
    if query.microbatch is None:
        return ""
    n = query.microbatch
    known = known_microbatches(ops, trace, microbatches) if known is None else known
    if not len(known):
        return (f"micro-batch {n}: this profile cannot tell which micro-batch its ops "
                "ran in." if _timed(ops) else
                f"micro-batch {n}: this run's trace names no micro-batches.")
    if n in set(known.tolist()):
        return ""
    many = "micro-batch" if len(known) == 1 else "micro-batches"
    return f"micro-batch {n}: this run has {many} {_spans(known)}."


def _run_in(ops: pd.DataFrame, trace: pd.DataFrame, microbatch: int) -> np.ndarray:
    """Which modelled ops run in `microbatch`: a compute event of the op's device, stage
    and pass names it (an optimiser's update runs once, in none)."""
    if trace.empty or not {"stage", "pass"} <= set(ops.columns) \
            or not {"kind", "stage", "pass", "microbatch"} <= set(trace.columns):
        return np.zeros(len(ops), dtype=bool)
    c = trace[(trace["kind"].astype(str).to_numpy() == "compute")
              & (trace["microbatch"].to_numpy() == microbatch)]
    by_ipu = "ipu" in ops.columns and "ipu" in c.columns
    ipus = c["ipu"].to_numpy() if by_ipu else np.zeros(len(c), dtype=np.int64)
    ran = set(zip(ipus.astype(int).tolist(), c["stage"].astype(int).tolist(),
                  c["pass"].astype(str).tolist(), strict=True))
    o_ipu = ops["ipu"].to_numpy() if by_ipu else np.zeros(len(ops), dtype=np.int64)
    return np.array([(int(i), int(s), str(p)) in ran for i, s, p in
                     zip(o_ipu, ops["stage"], ops["pass"], strict=True)], dtype=bool)


def find_ops(ops: pd.DataFrame, query: Query, limit: int = LIMIT,
             trace: pd.DataFrame | None = None,
             microbatches: np.ndarray | None = None) -> tuple[pd.DataFrame, int]:
    """(the first `limit` ops that match, in program order (measured: time order), how
    many match). An op matches when its name or module holds the text and it runs in the
    asked pass and micro-batch. `mb:N` with the run's `trace`: a modelled op when its pass
    has a run in micro-batch N (`links.op_span(..., microbatch=N)` places it in that run),
    a measured one when it ran in N (`op_microbatches`, or `microbatches` when given);
    without a trace, by the ops' own `microbatch` alone (a
    modelled op is then not narrowed). Where `mb:N` cannot narrow, `microbatch_note` says
    why."""
    if query.empty or ops.empty:
        return ops.iloc[:0], 0
    keep = np.ones(len(ops), dtype=bool)
    if query.text:
        hit = _holds(ops["op"], query.text)
        if "module" in ops.columns:
            hit |= _holds(ops["module"], query.text)
        keep &= hit
    if query.passes and "pass" in ops.columns:
        keep &= ops["pass"].astype(str).isin(query.passes).to_numpy()
    elif query.passes and "phase" in ops.columns:  # a modelled program's ops: by phase
        letter = ops["phase"].astype(str).map(PHASE_LETTER).fillna("")
        keep &= letter.isin(query.passes).to_numpy()
    if query.microbatch is not None and keep.any():
        if trace is not None and not _timed(ops):
            keep &= _run_in(ops, trace, query.microbatch)
        elif trace is not None:
            mbs = op_microbatches(ops, trace) if microbatches is None else microbatches
            keep &= mbs == query.microbatch
        elif "microbatch" in ops.columns:
            keep &= ops["microbatch"].to_numpy() == query.microbatch
    found = ops[keep]
    if "start" in found.columns:  # measured: in time order
        found = found.sort_values(["start", "op_id"], kind="stable")
    return found.head(limit), int(keep.sum())


def find_kernels(trace: pd.DataFrame, query: Query, limit: int = LIMIT
                 ) -> tuple[pd.DataFrame, int]:
    """(the first `limit` compute events named by the text, in time order, how many): an
    import's kernels carry their own names on the trace (the op that launched one is
    `host_op`); a modelled trace's compute events are passes and never match."""
    if not query.text or trace.empty or "host_op" not in trace.columns:
        return trace.iloc[:0], 0
    compute = trace[trace["kind"].astype(str) == "compute"]
    # a CPU run's compute events are its ops themselves (op == host_op): found as ops
    keep = _holds(compute["op"], query.text) \
        & (compute["op"].astype(str).to_numpy() != compute["host_op"].astype(str).to_numpy())
    if query.passes and "pass" in compute.columns:
        keep &= compute["pass"].astype(str).isin(query.passes).to_numpy()
    if query.microbatch is not None and "microbatch" in compute.columns:
        keep &= compute["microbatch"].to_numpy() == query.microbatch
    found = compute[keep].sort_values(["start", "ipu"], kind="stable")
    return found.head(limit), int(keep.sum())


__all__ = ["LIMIT", "Query", "find_kernels", "find_ops", "known_microbatches",
           "microbatch_note", "op_microbatches",
           "parse_query", "run_microbatches"]
