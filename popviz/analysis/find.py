"""Finding things in a profile's trace: the ops (and, for an import, the kernels) whose
name or module holds a text, optionally in one pass or one micro-batch. Pure functions
over the profile's tables; the /trace page's search box lists what they find and links to
each, centred and outlined (`links.op_span`).

    q = parse_query("conv pass:B mb:2")     # text "conv", backward ops of micro-batch 2
    found, total = find_ops(profile.ops, q)
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


def find_ops(ops: pd.DataFrame, query: Query, limit: int = LIMIT
             ) -> tuple[pd.DataFrame, int]:
    """(the first `limit` ops that match, in program order, how many match). An op
    matches when its name or module holds the text and it runs in the asked pass and
    micro-batch (a modelled op runs in every micro-batch: `mb:` does not narrow it)."""
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
    if query.microbatch is not None and "microbatch" in ops.columns:
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


__all__ = ["LIMIT", "Query", "find_kernels", "find_ops", "parse_query"]
