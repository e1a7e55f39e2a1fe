"""The activation stash in words, from the metrics core's one definition
(popviz.metrics.stash: micro-batches held x bytes each), so /liveness, /stages and
/compare say the same numbers in the same units (binary: MiB, as everywhere in the app)."""

from __future__ import annotations

import re
from collections.abc import Callable

import pandas as pd

from popviz.metrics import stash
from popviz.units import fmt_bytes

# the compiler names the copies beyond the current micro-batch "stash of <tensor> x<N>"
_STASH_NAME = re.compile(r"^stash of (?P<tensor>.+) x(?P<n>\d+)$")


def stash_words(depth: int, per_microbatch: int, total: int) -> str:
    """'7 micro-batches x 4.6 MiB = 32.2 MiB'; the bytes alone when the depth is unknown."""
    if depth < 0:
        return fmt_bytes(total)
    if depth == 0 or total == 0:
        return "none"
    return f"{depth} micro-batch{'es' if depth != 1 else ''} x {fmt_bytes(per_microbatch)} " \
        f"= {fmt_bytes(total)}"


NOT_MEASURED = "not measured"


def stash_column(stages: pd.DataFrame, measured: bool = False) -> list[str]:
    """One `stash_words` per row of a stage table, in its order; a measured run's
    stages are `NOT_MEASURED` (its traces show no stash, which is not none)."""
    if measured:
        return [NOT_MEASURED] * len(stages)
    table = stash(stages)
    return [stash_words(int(r.depth), int(r.per_microbatch_bytes), int(r.stash_bytes))  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
            for r in table.itertuples()]


def stash_line(stages: pd.DataFrame, label: Callable[[int], str]) -> str:
    """'Stash (micro-batches held between forward and backward x bytes each): IPU0 7
    micro-batches x 4.6 MiB = 32.2 MiB · ...' over the devices that stash anything; ''
    when none does."""
    table = stash(stages)
    table = table[table["stash_bytes"] > 0]
    if table.empty:
        return ""
    parts = []
    for ipu, group in table.groupby("ipu", sort=True):
        words = [stash_words(int(r.depth), int(r.per_microbatch_bytes), int(r.stash_bytes))  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
                 for r in group.itertuples()]
        total = int(group["stash_bytes"].sum())
        parts.append(f"{label(int(ipu))} " + (words[0] if len(words) == 1 else  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
                                              f"{' + '.join(words)} = {fmt_bytes(total)}"))
    return ("Stash (micro-batches held between their forward and backward, this one "
            "included, x bytes each; as on Stages and Compare): " + " · ".join(parts))


def stash_variable_name(name: str) -> str:
    """A liveness variable of the extra stash in words: 'stash of input#320 x6' ->
    'stash of input#320: 6 more micro-batches in flight (stash depth 7)' (the current
    micro-batch's copy is its own variable). Other names as they are."""
    found = _STASH_NAME.match(str(name))
    if not found:
        return str(name)
    n = int(found["n"])
    return f"stash of {found['tensor']}: {n} more micro-batch{'es' if n != 1 else ''} " \
        f"in flight (stash depth {n + 1})"
