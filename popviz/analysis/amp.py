"""What each availableMemoryProportion (AMP) step trades on each IPU: the modelled cycles
and temporary memory of that IPU's convolutions and matmuls, re-planned at every step.

AMP bounds the temporary memory a conv / matmul plan may add to a tile (docs/cost-model.md
section 2): a lower AMP rules out the fast, replicated partitions, so cycles rise and
temporaries fall, until no plan fits and the leanest one is kept. Only the conv / matmul ops
of the profile are re-costed (`popviz.target.cost.op_costs`, the compiler's own per-op
cost, with the plan caches warm after the first step): no compile, no file; the layout,
and so which ops run on which IPU, is the profile's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from popviz.options import Options
from popviz.target.cost import AMP_CLASSES, Precision, op_costs, op_features
from popviz.target.machines import ipu_target
from popviz.vocab import naming_of

AMP_STEPS = (0.1, 0.15, 0.2, 0.3, 0.4, 0.6)
COLUMNS = ["ipu", "amp", "in_force", "ops", "cycles", "temp_bytes", "serial_ops",
           "over_amp_ops", "changes"]
_NEEDED = ("op_class", "ipu", "flops", "dtype", "bytes_read", "bytes_written", "op",
           "shapes", "amp_used")


def amp_steps(ops: pd.DataFrame, meta: dict[str, Any],
              amps: tuple[float, ...] = AMP_STEPS) -> pd.DataFrame | None:
    """One row per (IPU, AMP): `amps` and the AMP in force on that IPU's convs (`in_force`),
    ascending. cycles: the sum over the IPU's conv / matmul ops (one micro-batch, each op
    once as the ops table lists it, recomputation included); temp_bytes: the largest
    temporary any of them adds to a tile (the fullest tile's); serial_ops: ops planned in
    serial slices; over_amp_ops: ops with no plan within the bound (the leanest kept);
    changes: whether cycles or temp_bytes differ from the next lower AMP of that IPU.
    None when the profile cannot be re-costed (no conv / matmul op, a measured profile,
    a GPU target (AMP is an IPU option), an unknown target, missing columns)."""
    if ops is None or ops.empty or any(c not in ops.columns for c in _NEEDED) \
            or naming_of(meta).gpu_plan:
        return None
    sel = ops[ops["op_class"].isin(AMP_CLASSES)]
    if sel.empty:
        return None
    try:
        options = Options.from_meta(dict(meta.get("options") or {}))
        target = ipu_target(options.target)
    except (TypeError, ValueError, KeyError):
        return None
    precision = Precision.of(options)
    sel = sel.assign(shapes=sel["shapes"].fillna("").astype(str),
                     out_shape=sel["out_shape"].fillna("").astype(str)
                     if "out_shape" in sel.columns else "")
    features = op_features(sel)
    ipus = sel["ipu"].to_numpy(np.int64)
    # the AMP in force on each IPU: its convs' (matmuls' where it has no conv)
    in_force: dict[int, float] = {}
    for ipu, group in sel.groupby("ipu", sort=True):
        convs = group[group["op_class"] != "matmul"]
        in_force[int(ipu)] = float((convs if len(convs) else group)["amp_used"].iloc[0])  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
    values = sorted({round(float(a), 6) for a in amps} | set(in_force.values()))
    rows = []
    for amp in values:
        costs = op_costs(sel, target, precision, np.full(len(sel), amp), features=features)
        frame = pd.DataFrame({"ipu": ipus, "cycles": costs["cycles"].to_numpy(),
                              "temp": costs["temp_bytes"].to_numpy(),
                              "serial": costs["passes"].to_numpy() > 1,
                              "over": costs["amp_ignored"].to_numpy()})
        for ipu, g in frame.groupby("ipu", sort=True):
            if amp not in amps and amp != in_force[int(ipu)]:  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
                continue  # another IPU's AMP in force: not a step of this one
            rows.append([int(ipu), amp, amp == in_force[int(ipu)], len(g),  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
                         int(g["cycles"].sum()), int(g["temp"].max()), int(g["serial"].sum()),
                         int(g["over"].sum()), False])
    out = pd.DataFrame(rows, columns=COLUMNS).sort_values(["ipu", "amp"], kind="stable")
    prev = out.groupby("ipu")[["cycles", "temp_bytes"]].shift(1)
    out["changes"] = (prev["cycles"].notna() & ((prev["cycles"] != out["cycles"])
                                                | (prev["temp_bytes"] != out["temp_bytes"])))
    return out.reset_index(drop=True)


MIN_GAIN = 0.005  # a higher AMP is worth naming when it saves at least 0.5% of the cycles


def amp_effect(steps: pd.DataFrame | None, ipu: int, lower: bool) -> tuple[float, float,
                                                                          float] | None:
    """The nearest AMP below (`lower`: one that changes a plan) or above (one that saves at
    least MIN_GAIN of the cycles) the one in force on `ipu`: (amp, cycles ratio to now,
    temporary-bytes ratio to now) of its conv / matmul ops; None when no step that way
    does (or nothing is known)."""
    if steps is None or steps.empty:
        return None
    mine = steps[steps["ipu"] == ipu]
    now = mine[mine["in_force"]]
    if now.empty:
        return None
    base = now.iloc[0]
    side = mine[mine["amp"] < base["amp"]].iloc[::-1] if lower else \
        mine[mine["amp"] > base["amp"]]
    for row in side.itertuples():
        changed = row.cycles <= (1 - MIN_GAIN) * base["cycles"] if not lower else \
            row.cycles != base["cycles"] or row.temp_bytes != base["temp_bytes"]
        if changed:
            return (float(row.amp), row.cycles / max(1, base["cycles"]),
                    row.temp_bytes / max(1, base["temp_bytes"]))
    return None


def amp_to_fit(steps: pd.DataFrame | None, ipu: int, over_bytes: int
               ) -> tuple[float | None, int]:
    """Whether lowering AMP on `ipu` can save the `over_bytes` its fullest tile is over:
    (the highest lower AMP step whose largest conv / matmul temporary per tile is at least
    that much smaller than now's, or None when no step is), and the most any lower step
    saves. An upper bound on what AMP can do: the saving lands on the fullest tile only
    if that tile's peak is the largest temporary."""
    if steps is None or steps.empty:
        return None, 0
    mine = steps[steps["ipu"] == ipu]
    now = mine[mine["in_force"]]
    if now.empty:
        return None, 0
    base = int(now.iloc[0]["temp_bytes"])
    lower = mine[mine["amp"] < float(now.iloc[0]["amp"])]
    if lower.empty:
        return None, 0
    saved = base - lower["temp_bytes"].to_numpy(np.int64)
    enough = lower[saved >= over_bytes]
    best = float(enough["amp"].max()) if len(enough) else None
    return best, int(max(int(saved.max()), 0))


def knows(steps: pd.DataFrame | None, ipu: int) -> bool:
    """Whether `steps` re-planned the conv / matmul ops of `ipu` (else advice cannot tell)."""
    return steps is not None and bool((steps["ipu"] == ipu).any())


def effect_words(now: float, effect: tuple[float, float, float]) -> str:
    """'from 0.15 to 0.1 (its convolutions and matmuls: temporary per tile 61% of now,
    cycles +5.6%)'."""
    amp, cycles, temp = effect
    return (f"from {now:g} to {amp:g} (its convolutions and matmuls: largest temporary per "
            f"tile {temp:.0%} of now, cycles {cycles - 1:+.1%})")
