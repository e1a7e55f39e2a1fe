"""Liveness by section: phase bands, the activation curve without one-step temporaries,
and one bump per recomputation section.

The not-always-live curve of a conv net is dominated by each op's own temporaries, which
live for one or two program steps; its local peaks are those spikes, not the sections a
user checkpoints. Here:

- `phase_bands`: per IPU, the runs of consecutive program steps with one phase (forward,
  backward, recompute, optimiser) and one recomputation section (the ops table's
  `section`), in program order.
- `liveness_layers`: per IPU and step, not-always-live split into temporaries (variables
  of category 'temporary') and the rest ("activations": stashed activations, recomputed
  activations, inputs).
- `section_bumps`: one bump per section whose activation curve rises and falls again
  within the section's contiguous steps (a recompute pass and the backward pass that
  consumes it, or the last forward section and its backward), with how far it rose."""

from __future__ import annotations

import numpy as np
import pandas as pd

BAND_COLUMNS = ["ipu", "phase", "section", "first_step", "last_step", "label"]
PHASE_LETTER = {"forward": "F", "backward": "B", "recompute": "R", "optimiser": "WU"}


def _with_section(liveness: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    live = liveness.sort_values(["ipu", "step"], kind="stable")
    if "section" in live:
        return live
    if "op_id" in live and {"op_id", "section"} <= set(ops.columns):
        section = ops.set_index("op_id")["section"]
        section = section[~section.index.duplicated()]
        return live.assign(section=live["op_id"].map(section).fillna(-1).astype(int))
    return live.assign(section=-1)


def phase_bands(liveness: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """Runs of steps with one phase and section per IPU: ipu, phase, section, first_step,
    last_step, label ('R3', 'B3', 'F', 'optimiser'). Sections are numbered only where the
    program has more than one (recomputation checkpoints)."""
    if liveness.empty or "phase" not in liveness:
        return pd.DataFrame(columns=BAND_COLUMNS)
    live = _with_section(liveness, ops)
    numbered = live["section"].nunique() > 1
    rows = []
    for ipu, g in live.groupby("ipu", sort=True):
        phase = g["phase"].astype(str).to_numpy()
        section = g["section"].to_numpy()
        steps = g["step"].to_numpy()
        cut = np.flatnonzero((phase[1:] != phase[:-1]) | (section[1:] != section[:-1])) + 1
        for a, b in zip(np.r_[0, cut], np.r_[cut, len(g)], strict=True):
            ph, sec = phase[a], int(section[a])
            letter = PHASE_LETTER.get(ph, ph)
            label = "optimiser" if ph == "optimiser" else (
                f"{letter}{sec}" if numbered and sec >= 0 else letter)
            rows.append((int(ipu), ph, sec, int(steps[a]), int(steps[b - 1]), label))  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
    bands = pd.DataFrame(rows, columns=BAND_COLUMNS)
    if numbered:  # optimiser runs per section are one phase to a reader: merge them
        opt = bands["phase"] == "optimiser"
        block = (opt != opt.shift()).cumsum()
        merged = bands[opt].groupby(["ipu", block[opt]], as_index=False).agg(
            phase=("phase", "first"), section=("section", "min"),
            first_step=("first_step", "min"), last_step=("last_step", "max"),
            label=("label", "first"))
        bands = pd.concat([bands[~opt], merged[BAND_COLUMNS]]).sort_values(
            ["ipu", "first_step"], kind="stable").reset_index(drop=True)
    return bands


def liveness_layers(liveness: pd.DataFrame, variables: pd.DataFrame) -> pd.DataFrame:
    """Per IPU and step: always_live_bytes, activation_bytes, temporary_bytes (the two
    sum to not_always_live_bytes; temporaries are the variables of category 'temporary'
    live at that step, capped at the not-always-live total)."""
    out = liveness[["ipu", "step", "always_live_bytes", "not_always_live_bytes"]].copy()
    out["temporary_bytes"] = 0.0
    if not variables.empty and {"category", "first_step", "last_step"} <= set(variables):
        temps = variables[variables["category"].astype(str) == "temporary"]
        for ipu, g in temps.groupby("ipu"):
            rows = out.index[out["ipu"] == ipu]
            if not len(rows):
                continue
            steps = out.loc[rows, "step"].to_numpy()
            top = int(steps.max()) + 2
            diff = np.zeros(top + 1)
            np.add.at(diff, np.clip(g["first_step"].to_numpy(int), 0, top), g["bytes"])
            np.add.at(diff, np.clip(g["last_step"].to_numpy(int) + 1, 0, top), -g["bytes"])
            live = np.cumsum(diff)
            out.loc[rows, "temporary_bytes"] = live[np.clip(steps, 0, top)]
    out["temporary_bytes"] = np.minimum(out["temporary_bytes"], out["not_always_live_bytes"])
    out["activation_bytes"] = out["not_always_live_bytes"] - out["temporary_bytes"]
    return out


def bump_label(labels: list[str], most: int = 3, at_peak: str | None = None) -> str:
    """A unit's bands as one short label: 'R3+B3'; a long run (an unsectioned program's
    F B F B ..., a measured 1F1B step) as the band its peak is in, 'B3', where that is
    known (its first and last band, 'F…F', said nothing of the peak the label sits on),
    else as its first and last band."""
    if len(labels) <= most:
        return "+".join(labels)
    return at_peak if at_peak else f"{labels[0]}…{labels[-1]}"


def section_bumps(layers: pd.DataFrame, bands: pd.DataFrame,
                  rel_rise: float = 0.05) -> pd.DataFrame:
    """One bump per IPU and section whose activation curve rises and then falls by at least
    `rel_rise` of that IPU's activation range within the section's contiguous steps:
    ipu, section, label, step (of the peak), activation_bytes, total_bytes, rise, fall,
    first_step, last_step."""
    cols = ["ipu", "section", "label", "step", "activation_bytes", "total_bytes", "rise",
            "fall", "first_step", "last_step"]
    if layers.empty or bands.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for ipu, b in bands.groupby("ipu", sort=True):
        g = layers[layers["ipu"] == ipu].sort_values("step")
        steps = g["step"].to_numpy()
        act = g["activation_bytes"].to_numpy(float)
        total = (g["always_live_bytes"] + g["not_always_live_bytes"]).to_numpy(float)
        span = float(act.max() - act.min()) if len(act) else 0.0
        if span <= 0:
            continue
        # consecutive bands of one section form one unit (R3 then B3; F6 then B6); an
        # optimiser run ends one (a measured run's training steps are apart)
        opt = b["phase"] == "optimiser"
        unit = ((b["section"] != b["section"].shift()) | (opt != opt.shift())).cumsum()
        for _, u in b[~opt].groupby(unit[~opt], sort=False):
            a = int(np.searchsorted(steps, u["first_step"].min(), side="left"))
            z = int(np.searchsorted(steps, u["last_step"].max(), side="right"))
            if z - a < 2:
                continue
            seg = act[a:z]
            top = int(np.argmax(seg))
            rise, fall = seg[top] - seg[0], seg[top] - seg[-1]
            if min(rise, fall) < rel_rise * span:
                continue
            peak = int(steps[a + top])
            holds = u[(u["first_step"] <= peak) & (u["last_step"] >= peak)]
            at_peak = str(holds["label"].iloc[-1]) if len(holds) else None
            rows.append((int(ipu), int(u["section"].iloc[0]),  # type: ignore[arg-type]  # pandas-stubs: a cell is any scalar
                         bump_label(list(u["label"]), at_peak=at_peak),
                         int(steps[a + top]),
                         float(seg[top]), float(total[a + top]), float(rise), float(fall),
                         int(steps[a]), int(steps[z - 1])))
    return pd.DataFrame(rows, columns=cols)


def fitted_range(layers: pd.DataFrame, capacity: float | None,
                 headroom: float = 1.12) -> tuple[float, float, bool]:
    """(0, top, capacity_shown) for a liveness y-axis: fitted to the data; the capacity is
    on scale only when it is within twice the data's peak (else it is named, not drawn)."""
    peak = float((layers["always_live_bytes"] + layers["not_always_live_bytes"]).max()) \
        if len(layers) else 0.0
    if capacity and capacity <= 2 * max(peak, 1.0):
        return 0.0, max(peak, capacity) * headroom, True
    return 0.0, max(peak, 1.0) * headroom, False
