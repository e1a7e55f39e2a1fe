"""/memory for any tile: its own not-always-live peak from the tile liveness, what is on
it, and a tile map with real per-tile variation and honest axes (issue 21)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import popviz
from popviz.analysis.tile_contents import (
    flat_per_ipu,
    live_on_tile,
    on_tile,
    placed,
    row_to_step,
    row_width,
    tile_peaks,
    with_tile_peaks,
)
from popviz.figures.memory import tile_map_figure

PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "rn50_pipeline"


def test_a_flat_not_always_live_peak_is_taken_per_tile_from_the_tile_liveness() -> None:
    with popviz.open(PROFILE) as p:
        tm, matrix = p.tile_memory, p.tile_liveness(0)
    peak, row = tile_peaks(matrix)
    assert peak.tolist() == matrix.max(axis=0).tolist()
    assert all(matrix[row[t], t] == peak[t] for t in (0, 100, 877))
    assert not flat_per_ipu(tm, 0)  # this file keeps per-tile peaks: left as it is
    assert with_tile_peaks(tm, 0, peak) is tm
    # a file that kept only the IPU's peak on every tile
    on0 = tm["ipu"] == 0
    flat = tm.copy()
    top = int(flat.loc[on0, "not_always_live_peak"].max())
    flat.loc[on0, "total_bytes"] += top - flat.loc[on0, "not_always_live_peak"]
    flat.loc[on0, "not_always_live_peak"] = top
    assert flat_per_ipu(flat, 0)
    fixed = with_tile_peaks(flat, 0, peak)
    assert fixed.loc[on0, "not_always_live_peak"].tolist() == peak[:on0.sum()].tolist()
    assert fixed.loc[on0, "total_bytes"].tolist() == tm.loc[on0, "total_bytes"].tolist()
    assert fixed.loc[~on0].equals(flat.loc[~on0])


def test_what_is_on_a_tile() -> None:
    variables = pd.DataFrame({"ipu": [0, 0, 0, 1], "name": ["a", "b", "c", "d"],
                              "category": ["activation"] * 4, "bytes": [10, 30, 20, 99],
                              "first_step": [0, 5, 9, 0], "last_step": [9, 8, 12, 20]})
    oom = pd.DataFrame({"ipu": [0], "tile": [7], "bytes_over": [5],
                        "variables": ["x.out (312 KiB), y (2 KiB)"]})
    got = live_on_tile(variables, oom, 0, 3, step=6)
    assert got["name"].tolist() == ["b", "a"] and got["source"].iloc[0].endswith("step 6")
    listed = live_on_tile(variables, oom, 0, 7, step=6)
    assert listed["name"].tolist() == ["x.out (312 KiB)", "y (2 KiB)"]
    assert live_on_tile(variables.iloc[0:0], oom.iloc[0:0], 0, 3, 6).empty
    live = pd.DataFrame({"ipu": [0] * 10, "step": range(10)})
    assert row_to_step(4, 10, live, 0) == 4 and row_to_step(2, 5, live, 0) == 4


def test_tile_map_colours_span_a_fitting_ipus_tiles_and_the_axis_says_tile_numbers() -> None:
    tm = pd.DataFrame({"ipu": 0, "tile": range(256), "capacity_bytes": 1000,
                       "total_bytes": np.linspace(300, 600, 256).astype(int)})
    fig = tile_map_figure(tm, 0, columns=64)
    heat = fig.data[0]
    assert heat.zmin == 30 and heat.zmax == 60
    assert "colours from 30% to 60% used" in fig.layout.title.text
    assert fig.layout.yaxis.title.text.startswith("first tile of the row")
    assert list(fig.layout.yaxis.ticktext)[:2] == ["0", "64"]
    over = tm.assign(total_bytes=tm["total_bytes"] * 2)  # overflowing: full scale
    assert tile_map_figure(over, 0).data[0].zmax == 100


def test_memory_page_lists_what_is_on_a_tile_that_fits(tmp_path: Path) -> None:
    from popviz_app import create_app

    from tests.dash_util import component_text

    shutil.copytree(PROFILE, tmp_path / "p")
    app = create_app(tmp_path)
    out = app.popviz_callbacks["memory.pick_tile"](
        None, {"points": [{"x": 5, "y": 3}]}, 1, "?profile=p%2Fprofile.h5")
    text = " ".join(component_text(c) for c in out)
    assert "IPU1 tile 197: not-always-live peak" in text and "What is on it" in text


def test_peaks_read_in_blocks_are_the_whole_arrays(tmp_path: Path, monkeypatch: Any) -> None:
    from popviz_app import create_app
    from popviz_app.pages import memory

    shutil.copytree(PROFILE, tmp_path / "p")
    monkeypatch.setattr(memory, "PEAK_BLOCK", 7)  # many blocks, a ragged last one
    entry = create_app(tmp_path).popviz_context.cache.get("p/profile.h5")
    peak, row = memory._peaks(entry, 1)
    with popviz.open(PROFILE) as p:
        whole = tile_peaks(p.tile_liveness(1))
    assert peak.tolist() == whole[0].tolist() and row.tolist() == whole[1].tolist()


def test_each_tiles_variables_sum_to_its_totals() -> None:
    """Issue 29: /memory lists a tile's own variables with their bytes on that tile, and
    they add up to what the tile map shows: always-live + not-always-live peak = the
    tile's total less code, vertex state and exchange buffers, on tiles across every IPU."""
    with popviz.open(PROFILE) as p:
        tm, variables = p.tile_memory, p.variables
        always = p.table("always_live_variables")
        assert placed(variables) and placed(always)
        checked = 0
        for ipu in sorted(tm["ipu"].unique()):
            matrix = p.tile_liveness(int(ipu))
            _, row = tile_peaks(matrix)
            width = row_width(matrix.shape[0], p.liveness, int(ipu))
            rows = tm[tm["ipu"] == ipu].set_index("tile")
            fullest = int(rows["total_bytes"].idxmax())
            for tile in sorted({0, 1, 63, 64, 700, 1000, 1471, fullest}):
                got = on_tile(variables, always, int(ipu), tile, int(row[tile]) * width, width)
                r = rows.loc[tile]
                want = r["total_bytes"] - r["code"] - r["vertex_state"] - r["exchange"]
                assert abs(got["bytes"].sum() - want) <= 2, (ipu, tile)
                # every variable listed sits on this tile, at most its whole size
                assert (got["bytes"] > 0).all()
                assert (got["bytes"] <= got["variable_bytes"]).all()
                # the always-live part alone is the tile's always-live bytes
                fixed = got.loc[got["live"] == "always", "bytes"].sum()
                assert abs(fixed - r["always_live"]) <= 1, (ipu, tile)
                checked += 1
        assert checked >= 32
        # tiles differ: a tensor spread over part of an IPU loads some tiles more
        spread = tm.groupby("ipu")["total_bytes"].agg(lambda x: x.max() / x.min())
        assert (spread > 1.5).all(), spread


def test_a_binned_programs_row_holds_every_step_of_its_bin() -> None:
    variables = pd.DataFrame({
        "ipu": [0, 0, 0], "name": ["early", "late", "elsewhere"],
        "category": ["activation"] * 3, "bytes": [1000, 640, 500],
        "first_step": [0, 7, 0], "last_step": [3, 9, 9], "first_tile": [0, 2, 10],
        "tiles": [4, 2, 4], "grain_bytes": [128, 128, 128]})
    # 1,000 B = 8 grains over 4 tiles: 2 each; 640 B = 5 grains over tiles 2-3: 3 and 2
    got = on_tile(variables, pd.DataFrame(), 0, 2, step=4, width=4)  # row 1: steps 4-7
    assert got["name"].tolist() == ["late"] and got["bytes"].iloc[0] == 3 * 128
    got = on_tile(variables, pd.DataFrame(), 0, 3, step=0, width=4)
    assert got["name"].tolist() == ["early"] and got["bytes"].iloc[0] == 250
    assert on_tile(variables, pd.DataFrame(), 0, 9, step=0, width=4).empty
    # a profile written before format 1.3 has no tile ranges: not placed
    assert not placed(variables.drop(columns=["first_tile"]))
