"""Liveness by section on a hand-made program, with the expected bands and bumps worked
out by hand, and the figure's fitted axis."""

from __future__ import annotations

import itertools

import pandas as pd

from popviz.analysis.liveness_sections import (
    bump_label,
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


def _two_training_steps(opt_steps: int) -> pd.DataFrame:
    """A measured-style run: F B F B ... then the optimiser, twice (no sections)."""
    one = ["forward", "backward"] * 4 + ["optimiser"] * opt_steps
    nal = [10, 30, 20, 40, 30, 50, 20, 5] + [0] * opt_steps
    phases, values = one * 2, nal * 2
    return pd.DataFrame({"ipu": 0, "step": range(len(phases)), "phase": phases,
                         "always_live_bytes": 100, "not_always_live_bytes": values,
                         "label": "op"})


def test_an_optimiser_in_view_is_not_called_folded() -> None:
    # optimiser at steps 8 and 17: both drawn (the axis reaches 17), so no fold note
    live = _two_training_steps(1)
    layers, bands = liveness_layers(live, pd.DataFrame()), phase_bands(live, pd.DataFrame())
    fig = liveness_sections_figure(layers, bands, section_bumps(layers, bands))
    notes = [a.text for a in fig.layout.annotations if a.name == "fold-note"]
    assert notes == [] and fig.layout.meta["folded"] is False
    assert fig.layout.xaxis.range[1] >= 17


def test_the_fold_note_names_only_the_hidden_steps() -> None:
    # 40 optimiser steps after each training step: the first run (8-47) is drawn; the view
    # ends at 55 + 2, so steps 58-95 of the last run are folded
    live = _two_training_steps(40)
    layers, bands = liveness_layers(live, pd.DataFrame()), phase_bands(live, pd.DataFrame())
    fig = liveness_sections_figure(layers, bands, section_bumps(layers, bands))
    notes = [a.text for a in fig.layout.annotations if a.name == "fold-note"]
    assert len(notes) == 1 and "steps 58–95 folded" in notes[0], notes
    assert list(fig.layout.xaxis.range) == [-0.5, 57.0]


def test_an_unsectioned_run_has_one_short_bump_per_training_step() -> None:
    live = _two_training_steps(1)
    layers, bands = liveness_layers(live, pd.DataFrame()), phase_bands(live, pd.DataFrame())
    found = section_bumps(layers, bands)
    # one bump per training step (the optimiser ends a unit), labelled by the band its
    # peak is in (steps 5 and 14 are backwards; first…last read 'F…B')
    assert found["step"].tolist() == [5, 14]
    assert found["label"].tolist() == ["B", "B"]


def test_narrow_bands_share_labels_that_do_not_overlap() -> None:
    # 300 steps: a wide F, then 60 alternating one-step F/B bands, then a wide B
    phases = ["forward"] * 100 + ["forward", "backward"] * 30 + ["backward"] * 140
    live = pd.DataFrame({"ipu": 0, "step": range(len(phases)), "phase": phases,
                         "always_live_bytes": 100, "not_always_live_bytes": 10,
                         "label": "op"})
    layers, bands = liveness_layers(live, pd.DataFrame()), phase_bands(live, pd.DataFrame())
    fig = liveness_sections_figure(layers, bands, section_bumps(layers, bands))
    labels = sorted((a.x, a.text) for a in fig.layout.annotations if a.name == "band-label")
    assert [t for _, t in labels] == ["F", "B/F", "B"]  # the run opens on a B
    px = 1000 / 299  # the figure lays labels out for ~1000 px
    for (x0, t0), (x1, t1) in itertools.pairwise(labels):
        assert (x1 - x0) * px >= 3.5 * (len(t0) + len(t1)), (t0, t1)


def test_each_ipu_has_its_own_axis_a_peak_star_and_full_hovers() -> None:
    """Issue 21: IPUs count their own steps (own x-axes, own opening range); each IPU's
    peak is starred; a hover never shows empty ' ·  · ' fields; the fold note sits inside
    the figure however many IPUs it has."""
    one = _two_training_steps(40)
    short = _two_training_steps(40).iloc[:60].assign(ipu=1, label="")
    live = pd.concat([one, short], ignore_index=True)
    layers, bands = liveness_layers(live, pd.DataFrame()), phase_bands(live, pd.DataFrame())
    fig = liveness_sections_figure(layers, bands, section_bumps(layers, bands))
    assert fig.layout.xaxis.matches is None and fig.layout.xaxis2.matches is None
    assert list(fig.layout.xaxis.range) == [-0.5, 57.0]
    assert fig.layout.xaxis2.range[1] <= 59  # IPU1's own program ends at step 59
    stars = [d for d in fig.data if d.name == "peak"]
    assert len(stars) == 2
    for star, ipu in zip(stars, (0, 1), strict=True):
        g = live[live["ipu"] == ipu]
        total = g["always_live_bytes"] + g["not_always_live_bytes"]
        assert star.x[0] == g["step"].iloc[int(total.to_numpy().argmax())]
    heads = [c[0] for d in fig.data if d.customdata is not None for c in d.customdata]
    assert heads and not any(" ·  · " in h or h.endswith(" · ") for h in heads)
    note = next(a for a in fig.layout.annotations if a.name == "fold-note")
    plot_h = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert -note.y * plot_h <= fig.layout.margin.b  # within the bottom margin, not past it
    assert "IPU0 steps 58–95" in note.text
    zoomed = liveness_sections_figure(layers, bands, section_bumps(layers, bands),
                                      ranges={1: (10.0, 20.0)})
    assert list(zoomed.layout.xaxis2.range) == [10, 20]
    assert list(zoomed.layout.xaxis.range) == [-0.5, 57.0]


def test_identical_live_variables_are_one_row() -> None:
    from popviz.analysis.liveness import merged_variables

    live = pd.DataFrame({"ipu": 0, "name": ["bn#3", "bn#3", "conv#1"],
                         "category": "activation", "bytes": [512, 512, 100],
                         "first_step": [3, 3, 1], "last_step": [9, 9, 4]})
    out = merged_variables(live)
    assert out["name"].tolist() == ["bn#3 (2 tensors)", "conv#1"]
    assert out["bytes"].tolist() == [1024, 100]


def test_a_bump_label_moves_aside_of_a_near_peak_star() -> None:
    """Issue 31: a bump's label under its triangle sat under the peak's star when the two
    were a few pixels apart. The peak (always-live + all not-always-live: 150 at step 3,
    with the temporary) is one step from the F1+B1 bump at 4 and four from R0+B0's at 7.
    Drawn 1,000 px wide (87 px a step) nothing is near and both labels stay under their
    triangles; 60 px wide (5.2 px a step) both are near, and each label moves to its
    triangle's side away from the star (the star is left of both: to their right)."""
    layers = liveness_layers(_live(), _variables())
    bands = phase_bands(_live(), _ops())
    bumps = section_bumps(layers, bands)
    for pixels, want in ((1000, ["bottom center"] * 2), (60, ["middle right"] * 2)):
        fig = liveness_sections_figure(layers, bands, bumps, 10_000, pixels=pixels)
        (bump,) = [t for t in fig.data if t.name == "section bump"]
        (star,) = [t for t in fig.data if t.name == "peak"]
        assert list(star.x) == [3.0] and list(bump.x) == [4, 7]
        assert list(bump.textposition) == want


def test_a_long_units_bump_is_named_by_the_band_of_its_peak() -> None:
    """A measured 1F1B step is one unit of many bands (F B F B ... F): its bumps read
    'F…F', first and last, while each peak sits in a backward. Named by the band the
    peak is in now; a short unit keeps every band ('R3+B3')."""
    from pathlib import Path

    import popviz

    assert bump_label(["R3", "B3"]) == "R3+B3"
    assert bump_label(["F", "B", "F", "B", "F"], at_peak="B") == "B"
    assert bump_label(["F", "B", "F", "B", "F"]) == "F…F"  # the peak's band unknown
    path = Path(__file__).resolve().parents[1] / "profiles" / "tutorial_measured_2ranks"
    with popviz.open(path / "profile.h5") as p:
        live = p.liveness
        bands = phase_bands(live, p.ops)
        bumps = section_bumps(liveness_layers(live, p.table("variables")), bands)
    assert len(bumps)
    for bump in bumps.itertuples():
        held = bands[(bands["ipu"] == bump.ipu) & (bands["first_step"] <= bump.step)
                     & (bands["last_step"] >= bump.step)]
        assert bump.label == held["label"].iloc[-1] and "…" not in bump.label
