"""Liveness by section on a hand-made program, with the expected bands and bumps worked
out by hand, and the figure's fitted axis."""

from __future__ import annotations

import pandas as pd

from popviz.analysis.liveness_sections import (
    fitted_range,
    liveness_layers,
    phase_bands,
    section_bumps,
)
from popviz.figures.liveness_sections import liveness_sections_figure

# 2 sections: F0 F0 F1 F1 | B1 B1 | R0 R0 | B0 B0 | WU WU WU
PHASES = ["forward"] * 4 + ["backward"] * 2 + ["recompute"] * 2 + ["backward"] * 2 + \
    ["optimiser"] * 3
SECTIONS = [0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1]
NAL = [10, 20, 30, 50, 40, 12, 22, 32, 20, 5, 0, 0, 0]


def _live() -> pd.DataFrame:
    n = len(PHASES)
    return pd.DataFrame({"ipu": 0, "step": range(n), "phase": PHASES, "op_id": range(n),
                         "always_live_bytes": 100, "not_always_live_bytes": NAL,
                         "label": "op"})


def _ops() -> pd.DataFrame:
    return pd.DataFrame({"op_id": range(len(PHASES)), "section": SECTIONS})


def _variables() -> pd.DataFrame:
    # a 20-byte temporary at step 3 only: the spike there is an op's working memory
    return pd.DataFrame({"ipu": [0, 0], "category": ["temporary", "activation"],
                         "bytes": [20, 10], "first_step": [3, 0], "last_step": [3, 5]})


def test_bands_follow_phase_and_section() -> None:
    bands = phase_bands(_live(), _ops())
    assert bands["label"].tolist() == ["F0", "F1", "B1", "R0", "B0", "optimiser"]
    assert bands[["first_step", "last_step"]].values.tolist() == [
        [0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 12]]


def test_temporaries_split_off_the_curve() -> None:
    layers = liveness_layers(_live(), _variables()).set_index("step")
    assert layers.loc[3, "temporary_bytes"] == 20 and layers.loc[3, "activation_bytes"] == 30
    assert layers.loc[2, "temporary_bytes"] == 0
    assert (layers["activation_bytes"] + layers["temporary_bytes"]
            == layers["not_always_live_bytes"]).all()


def test_one_bump_per_section_that_rises_and_falls() -> None:
    layers = liveness_layers(_live(), _variables())
    found = section_bumps(layers, phase_bands(_live(), _ops()))
    # activations: 10 20 30 30 40 12 | 22 32 20 5: F1+B1 peaks at step 4, R0+B0 at step 7;
    # F0 only rises, so it is no bump
    assert found["label"].tolist() == ["F1+B1", "R0+B0"]
    assert found["step"].tolist() == [4, 7]
    assert found["rise"].tolist() == [10, 10] and found["fall"].tolist() == [28, 27]


def test_axis_fitted_and_capacity_named_when_off_scale() -> None:
    layers = liveness_layers(_live(), _variables())
    assert fitted_range(layers, 10_000) == (0.0, 150 * 1.12, False)
    assert fitted_range(layers, 200) == (0.0, 200 * 1.12, True)
    bands = phase_bands(_live(), _ops())
    fig = liveness_sections_figure(layers, bands, section_bumps(layers, bands), 10_000)
    notes = [a.text for a in fig.layout.annotations]
    assert any("off scale" in t for t in notes) and any("folded" in t for t in notes)
    assert fig.layout.meta["capacity_on_scale"] is False
    assert list(fig.layout.xaxis.range) == [-0.5, 9 + 2.0]  # optimiser folded out
    assert {"F1", "B1", "R0", "B0"} <= set(notes)
