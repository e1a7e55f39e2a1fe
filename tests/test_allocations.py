"""A CUDA memory snapshot's allocator (issue 21): the import's alloc_blocks / alloc_segments /
alloc_frames tables, older files without them, the analysis (stacked bands, reserved vs
allocated), the figures and the /memory wiring, on the real H100 snapshot."""

from __future__ import annotations

import gzip
import pickle
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd
import pytest

import popviz
from popviz.analysis import allocations as al
from popviz.figures.allocations import allocator_state_figure, block_timeline_figure
from tests.dash_util import component_text
from tests.import_fixtures import RESNET, SNAPSHOT, snapshot_inside_trace


@pytest.fixture(scope="module")
def snap() -> dict[str, Any]:
    return pickle.loads(gzip.decompress(SNAPSHOT.read_bytes()))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the ResNet-50 trace imported with the snapshot (its events spread
    over the trace, as if of the same run)."""
    root = tmp_path_factory.mktemp("alloc")
    popviz.import_trace([RESNET], root / "rn", memory_snapshot=snapshot_inside_trace(root))
    return root


@pytest.fixture(scope="module")
def prof(served: Path) -> Any:
    with popviz.open(served / "rn") as p:
        yield p


# ---- import and format ----
def test_import_keeps_every_block_segment_and_stack(prof: Any, snap: dict[str, Any]) -> None:
    blocks, segments = prof.table("alloc_blocks"), prof.table("alloc_segments")
    events = snap["device_traces"][0]
    allocs = [e for e in events if e["action"] == "alloc"]
    recorded = blocks[~blocks["from_start"]]
    assert len(recorded) == len(allocs)
    assert recorded["bytes"].sum() == sum(e["size"] for e in allocs)
    assert len(segments) == len(snap["segments"])
    assert segments["bytes"].sum() == sum(s["total_size"] for s in snap["segments"])
    # a block is live before the history began either freed during it, or still active
    active = sum(b["state"].startswith("active") for s in snap["segments"] for b in s["blocks"])
    assert blocks["to_end"].sum() == active
    assert (blocks["end"] >= blocks["start"]).all()
    # every stack reference resolves, and one ends in the recording script's own line
    frames = prof.table("alloc_frames")
    used = set(blocks["stack"][blocks["stack"] >= 0])
    assert used <= set(frames["stack"])
    assert any(f.endswith(".py") and n == "<module>" for f, n in
               zip(frames["filename"], frames["name"]))
    assert prof.format_version == popviz.format.FORMAT_VERSION


def test_an_import_without_snapshot_has_no_allocator_tables(tmp_path: Path) -> None:
    with popviz.open(popviz.import_trace([RESNET], tmp_path / "p")) as p:
        assert "alloc_blocks" not in p.table_names
        assert p.table("alloc_blocks").empty and "stack" in p.table("alloc_blocks").columns


def test_a_format_1_1_file_still_reads(prof: Any, tmp_path: Path) -> None:
    old = tmp_path / "old.h5"
    shutil.copy(prof.path, old)
    with h5py.File(old, "a") as h5:
        for name in ("alloc_blocks", "alloc_segments", "alloc_frames"):
            del h5["tables"][name]
        h5.attrs["format_version"] = np.bytes_(b"1.1.0")
    with popviz.open(old) as p:
        assert p.format_version == "1.1.0" and len(p.trace) == len(prof.trace)
        assert p.table("alloc_segments").empty and p.table("alloc_frames").empty


# ---- analysis ----
def _blocks(rows: list[tuple[int, int, int, int, bool]]) -> pd.DataFrame:
    """(block, bytes, start, end, to_end) rows of one device."""
    return pd.DataFrame([{"ipu": 0, "block": b, "addr": 4096 * b, "bytes": n, "stream": 0,
                          "start": s, "end": e, "from_start": False, "to_end": t, "stack": -1}
                         for b, n, s, e, t in rows])


def test_bands_stack_in_allocation_order_and_drop_when_one_below_frees() -> None:
    blocks = _blocks([(0, 100, 0, 50, False), (1, 30, 10, 80, True), (2, 5, 20, 30, False)])
    t = al.block_timeline(blocks, 0, max_blocks=2)
    assert t.hidden == 1  # the 5-byte block shares the bottom band
    one = t.bands[t.bands["block"] == 1]
    # above the other band (5 bytes in 20..30) and block 0 until its free at 50, then down
    at = {int(s): (int(lo), int(hi)) for s, lo, hi in zip(one["start"], one["lower"],
                                                           one["upper"])}
    assert at[10] == (100, 130) and at[20] == (105, 135) and at[30] == (100, 130)
    assert at[50] == (0, 30) and one["end"].max() == 80
    other = t.bands[t.bands["block"] == al.OTHER]
    assert other["upper"].max() == 5


def test_reserved_allocated_and_fragmentation() -> None:
    blocks = _blocks([(0, 100, 0, 50, False), (1, 30, 10, 80, True)])
    segments = pd.DataFrame({"ipu": 0, "segment": [0], "addr": [0], "bytes": [200],
                             "stream": 0, "segment_type": "large", "start": [0], "end": [80],
                             "from_start": [True], "to_end": [True]})
    s = al.allocator_series(blocks, segments, 0).set_index("time")
    assert s.loc[10, "allocated"] == 130 and s.loc[50, "allocated"] == 30
    assert (s["reserved"] == 200).all() and s.loc[50, "fragmentation"] == 170
    summary = al.allocation_summary(s.reset_index(), blocks, 0)
    assert summary["peak_allocated"] == 130 and summary["max_fragmentation"] == 170


def test_block_stack_hides_the_allocator_frames(prof: Any) -> None:
    blocks, frames = prof.table("alloc_blocks"), prof.table("alloc_frames")
    block = int(blocks.loc[blocks["stack"] >= 0, "block"].iloc[0])
    d = al.block_detail(blocks, frames, 0, block)
    assert d["frames"] and d["hidden"] > 0
    assert not any("CUDACachingAllocator" in f or f.startswith("??") for f in d["frames"])
    assert all(f.split(" ")[0].rsplit(":", 1)[1].isdigit() for f in d["frames"])
    with pytest.raises(ValueError, match="no block 999999"):
        al.block_detail(blocks, frames, 0, 999_999)


# ---- figures ----
def test_timeline_figure_carries_block_ids_and_stays_small(prof: Any) -> None:
    blocks = prof.table("alloc_blocks")
    t = al.block_timeline(blocks, 0)
    fig = block_timeline_figure(t, al.top_frame(prof.table("alloc_frames"), 0))
    assert fig.layout.meta["blocks"] == al.MAX_BLOCKS and fig.layout.meta["hidden"] > 0
    ids = set(int(c) for c in fig.data[-1].customdata)
    assert ids - {al.OTHER} == set(t.shown["block"])
    assert len(fig.to_json()) < 1_500_000
    state = allocator_state_figure(al.allocator_series(blocks, prof.table("alloc_segments"),
                                                       0))
    assert [d.name for d in state.data] == ["allocated (live blocks)", "reserved (segments)"]


def test_zoomed_timeline_draws_the_range_own_blocks(prof: Any) -> None:
    blocks = prof.table("alloc_blocks")
    lo, hi = int(blocks["start"].min()), int(blocks["end"].max())
    mid = (lo + hi) // 2
    t = al.block_timeline(blocks, 0, mid, mid + (hi - lo) // 50)
    live = blocks[(blocks["start"] <= t.window[1]) & ((blocks["end"] > t.window[0])
                                                      | blocks["to_end"])]
    assert len(t.shown) + t.hidden == len(live)
    assert t.bands["start"].min() >= mid and t.bands["end"].max() <= t.window[1]


# ---- the /memory page ----
def test_memory_page_shows_the_allocator_and_a_click_its_stack(served: Path) -> None:
    from popviz_app import ProfileCache, create_app, render
    from popviz_app.common import AppContext

    query = "?profile=rn/profile.h5"
    ctx = AppContext(root=served, cache=ProfileCache(served))
    text = component_text(render(ctx, "/memory", query)[1])
    assert "CUDA allocator (memory snapshot)" in text and "Peak allocated" in text
    cb = create_app(served, vetter=False).popviz_callbacks
    blocks = ctx.cache.get("rn/profile.h5").profile.table("alloc_blocks")
    block = int(blocks.loc[blocks["stack"] >= 0, "block"].iloc[0])
    panel = " ".join(component_text(c) for c in cb["memory.alloc_pick"]({"block": block}, 0,
                                                                         query))
    assert panel.startswith(f"Block {block}: ") and ".py:" in panel
    fig, status, *_ = cb["memory.alloc_zoom"]({"xaxis.range[0]": 1.0,
                                               "xaxis.range[1]": 2.0}, 0, query)
    assert fig.layout.meta["blocks"] > 0 and "blocks drawn" in status


def test_unreadable_blocks_leave_the_view_out_not_the_import(tmp_path: Path,
                                                             snap: dict[str, Any]) -> None:
    bad = pickle.loads(pickle.dumps(snap))
    alloc = next(e for e in bad["device_traces"][0] if e["action"] == "alloc")
    alloc["frames"][0]["line"] = "twelve"  # the liveness curve never reads frames
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(bad))
    with popviz.open(popviz.import_trace([RESNET], tmp_path / "p",
                                         memory_snapshot=[path])) as p:
        assert p.table("alloc_blocks").empty and len(p.liveness)
        assert any("its blocks cannot be read" in w for w in p.meta["warnings"])


def test_a_block_of_the_trace_own_run_links_to_its_life_on_the_trace(served: Path) -> None:
    from popviz_app import create_app

    cb = create_app(served, vetter=False).popviz_callbacks
    with popviz.open(served / "rn") as p:
        blocks, trace = p.table("alloc_blocks"), p.trace
    inside = blocks[(blocks["start"] > trace["start"].min()) & ~blocks["to_end"]]
    row = inside.iloc[len(inside) // 2]
    panel = cb["memory.alloc_pick"]({"block": int(row["block"])}, 0, "?profile=rn/profile.h5")
    link = next(c for c in panel if getattr(c, "className", "") == "downloads").children
    q = dict(kv.split("=") for kv in link.href.split("?", 1)[1].split("&"))
    assert float(q["t0"]) <= row["start"] and float(q["t1"]) >= row["end"] and q["ipu"] == "0"
