"""Thread and stream lanes of an imported trace (format 1.2): host slices nested as the raw
JSON nests them, launch -> kernel links equal to Kineto's own 'ac2g' flow events, GPU idle
causes, flame / flat rows, the level of detail on a million slices, and older files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import popviz
from popviz.analysis.trace_detail import module_levels, module_runs, pass_ops
from popviz.analysis.trace_threads import (
    has_threads,
    idle_by_cause,
    idle_causes,
    launch_links,
    thread_rows,
)
from popviz.figures.lod import TraceIndex
from popviz.figures.trace_lanes import trace_lanes_figure
from popviz.figures.trace_threads import thread_lanes_figure
from popviz.ingest.kineto_lanes import slice_depths
from tests.format_versions import as_format_1_1
from tests.import_fixtures import RESNET, trace_events

PROFILES = Path(__file__).resolve().parents[1] / "profiles"


def _stack_depths(events: list[tuple[float, float]]) -> list[int]:
    """Depth of each (start, end) of one thread by a plain stack walk (the reference)."""
    order = sorted(range(len(events)), key=lambda i: (events[i][0], -events[i][1]))
    out, stack = [0] * len(events), []
    for i in order:
        s, e = events[i]
        while stack and stack[-1] <= s:
            stack.pop()
        out[i] = len(stack)
        stack.append(max(e, s + 1e-9))
    return out


def test_slice_depths_match_a_stack_walk() -> None:
    rng = np.random.default_rng(4)
    spans: list[tuple[float, float]] = []

    def nest(lo: float, hi: float, level: int) -> None:  # a random properly nested tree
        t = lo
        while t < hi and level < 6:
            w = rng.uniform(0, (hi - t))
            spans.append((t, t + w))
            if rng.random() < 0.6:
                nest(t, t + w, level + 1)
            t += w + rng.uniform(0, 3)

    nest(0, 1000, 0)
    spans.append((spans[3][0], spans[3][0]))  # an instant where a slice starts
    start = np.array([s for s, _ in spans]) * 1000
    end = np.array([e for _, e in spans]) * 1000
    got = slice_depths(np.zeros(len(spans), int), start.astype(np.int64),
                       end.astype(np.int64))
    want = _stack_depths([(int(s), int(e)) for s, e in zip(start, end)])
    assert got.tolist() == want and max(want) >= 3


def test_host_slices_are_the_raw_host_events(resnet: Any) -> None:
    events = [e for e in trace_events(RESNET) if e.get("ph") == "X"
              and e.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime",
                                     "cuda_driver")]
    slices = resnet.table("host_slices")
    assert len(slices) == len(events)
    assert sorted(slices["thread"].unique()) == sorted({f"thread {e['tid']}" for e in events})
    for thread, mine in slices.groupby("thread"):  # the depths of a stack walk, per thread
        raw = [e for e in events if f"thread {e['tid']}" == thread]
        want = _stack_depths([(e["ts"], e["ts"] + e["dur"]) for e in raw])
        assert sorted(mine["depth"]) == sorted(want)
        got = mine.sort_values(["start", "depth"])
        raw_sorted = sorted(zip((e["ts"] for e in raw), want))
        assert got["depth"].tolist() == [d for _, d in raw_sorted]


def test_links_are_kinetos_flow_events(resnet: Any) -> None:
    """Each 'ac2g' flow pair (start at the runtime call, end at the kernel) is one link,
    with the same launch-to-kernel delay."""
    flows: dict[int, dict[str, float]] = {}
    for e in trace_events(RESNET):
        if e.get("cat") == "ac2g":
            flows.setdefault(int(e["id"]), {})[e["ph"]] = float(e["ts"])
    pairs = {k: (v["f"] - v["s"]) * 1e3 for k, v in flows.items() if {"s", "f"} <= set(v)}
    links = launch_links(resnet.table("host_slices"), resnet.trace).set_index("correlation")
    assert set(links.index) == set(pairs)
    lag = (links["start"] - links["launch_start"]).to_numpy()
    want = np.array([pairs[k] for k in links.index])
    assert np.abs(lag - want).max() <= 2  # µs with 3 decimals -> ns, rounded
    assert links["launch"].str.startswith(("cuda", "cuLaunch")).all()
    assert set(links["stream"]) == {7}


def test_idle_causes() -> None:
    """A gap whose next kernel was launched late names what the host was doing; one whose
    kernel was queued before it says the GPU waited on a dependency."""
    slices = pd.DataFrame({
        "ipu": 0, "tid": 0, "thread": "thread 1", "depth": [0, 1, 0, 0],
        "start": [0, 10, 100, 300], "end": [90, 80, 110, 310],
        "name": ["aten::item", "cudaStreamSynchronize", "cudaLaunchKernel",
                 "cudaLaunchKernel"], "cat": ["cpu_op", "cuda_runtime", "cuda_runtime",
                                             "cuda_runtime"],
        "correlation": [-1, -1, 5, 6]})
    trace = pd.DataFrame({
        "ipu": 0, "start": [20, 40, 150, 400], "end": [40, 150, 160, 500],
        "kind": ["compute", "idle", "compute", "compute"], "stream": [7, -1, 7, 7],
        "correlation": [4, -1, 5, 6], "op": ["k0", "GPU idle", "k1", "k2"], "peer": -1})
    links = launch_links(slices, trace)
    gaps = pd.DataFrame({"ipu": [0, 0], "start": [40, 320], "end": [150, 400]})
    late, queued = idle_causes(gaps, links, slices)
    assert "60 ns late" in late and "cudaStreamSynchronize" in late and "waiting" in late
    assert "k1" in late
    assert queued.startswith("next kernel queued 20 ns before the gap") and "k2" in queued


def test_idle_by_cause_adds_up_to_the_gpu_idle(resnet: Any) -> None:
    slices, trace = resnet.table("host_slices"), resnet.trace
    gaps = trace[trace["op"] == "GPU idle"]
    lo, hi = float(trace["start"].min()), float(trace["end"].max())
    table = idle_by_cause(trace, launch_links(slices, trace), slices, lo, hi, top=10_000)
    assert table["idle"].sum() == (gaps["end"] - gaps["start"]).sum()
    assert table["gaps"].sum() == len(gaps)
    assert table["idle"].is_monotonic_decreasing
    assert table["share"].sum() == pytest.approx(1.0)
    late = table[table["cause"] == "launched late"]
    assert (late["host"] != "").all() and len(late) > 1
    # half the range: gaps clipped to it
    half = idle_by_cause(trace, launch_links(slices, trace), slices, lo, (lo + hi) / 2,
                         top=10_000)
    inside = gaps[gaps["start"] < (lo + hi) / 2]
    assert half["idle"].sum() == (inside["end"].clip(upper=(lo + hi) / 2)
                                  - inside["start"]).sum()


def test_flame_and_flat_rows(resnet: Any) -> None:
    slices, trace = resnet.table("host_slices"), resnet.trace
    deepest = slices.groupby("tid")["depth"].max()
    flame = thread_rows(slices, trace, "flame")
    flat = thread_rows(slices, trace, "flat")
    assert len(flame) == int((deepest + 1).sum()) + 2  # + GPU idle + stream 7
    assert [r.label for r in flat] == [*[f"thread {t}" for t in ("531", "556")],
                                       "GPU idle", "stream 7"]
    with pytest.raises(ValueError, match="trace mode 'tree'"):
        thread_rows(slices, trace, "tree")


def test_zoomed_figure_draws_every_slice_and_its_arrows(resnet: Any) -> None:
    slices, trace = resnet.table("host_slices"), resnet.trace
    links = launch_links(slices, trace)
    mid = links.iloc[len(links) // 2]
    lo, hi = float(mid["launch_start"]) - 20_000, float(mid["start"]) + 20_000
    for mode in ("flame", "flat"):
        fig = thread_lanes_figure(slices, trace, links, lo, hi, mode=mode)
        meta = fig.layout.meta
        assert meta["mode"] == "events" and meta["view"] == mode
        in_view = ((slices["start"] < hi) & (slices["end"] > lo)).sum()
        bars = sum(len(t.x) for t in fig.data if t.type == "bar")
        assert bars == meta["drawn"] >= in_view
        arrows = next(t for t in fig.data if t.name == "launch → kernel")
        ends = ((links["launch_start"].between(lo, hi, inclusive="left"))
                | (links["start"].between(lo, hi, inclusive="left"))).sum()
        assert meta["flows_drawn"] == ends == len(arrows.x) // 3
        rows = meta["rows"]
        heads = np.array(arrows.y[1::3]) + 0.3  # each head sits on a stream row
        assert all(rows[round(y)].startswith("stream") for y in heads)
        if mode == "flame":  # each tail on its launch's depth row, depth >= 1
            tails = np.array(arrows.y[0::3]) - 0.3
            assert all(rows[round(y)].startswith("depth") for y in tails)
        # kernels carry their names (issue 31: none, even on wide bars), shortened to the
        # function: no `void`, namespace, template arguments or parameters
        kernels = [t for t in fig.data if t.type == "bar" and "launched by" in
                   str(t.hovertemplate)]
        assert kernels and all(len(t.text) == len(t.x) for t in kernels)
        names = [str(n) for t in kernels for n in t.text]
        full = [str(c[0]) for t in kernels for c in t.customdata]
        assert all(n and n in f and "<" not in n and "(" not in n and not n.startswith("void")
                   for n, f in zip(names, full, strict=True))


def _big_import(n_threads: int = 4, per_thread: int = 250_000) -> tuple[pd.DataFrame,
                                                                      pd.DataFrame]:
    """A million host slices (ops with nested launches) and their 500,000 kernels."""
    frames, kernels = [], []
    for t in range(n_threads):
        start = np.arange(per_thread // 2, dtype=np.int64) * 1000
        op = pd.DataFrame({"start": start, "end": start + 800, "depth": 0,
                           "name": "aten::add", "cat": "cpu_op", "correlation": -1})
        corr = t * per_thread + np.arange(len(start))
        launch = pd.DataFrame({"start": start + 100, "end": start + 300, "depth": 1,
                               "name": "cudaLaunchKernel", "cat": "cuda_runtime",
                               "correlation": corr})
        frames.append(pd.concat([op, launch]).assign(ipu=0, tid=t, thread=f"thread {t}"))
        kernels.append(pd.DataFrame({"ipu": 0, "start": start + 500, "end": start + 900,
                                     "kind": "compute", "stream": 7 + t, "correlation": corr,
                                     "op": "k", "pass": "F", "peer": -1}))
    return pd.concat(frames, ignore_index=True), pd.concat(kernels, ignore_index=True)


def test_a_million_slices_draw_fast_and_bounded() -> None:
    slices, trace = _big_import()
    links = launch_links(slices, trace)
    t0 = time.perf_counter()
    fig = thread_lanes_figure(slices, trace, links)
    whole = time.perf_counter() - t0
    meta = fig.layout.meta
    assert meta["mode"] == "merged" and meta["visible_events"] == 1_500_000
    # counted before the short ones are merged, host slices and stream events apart
    assert (meta["visible_slices"], meta["visible_device_events"]) == (1_000_000, 500_000)
    assert "1,000,000 host slices and 500,000 stream, idle and transfer events, short " \
        "ones merged" in fig.layout.title.text
    bars = sum(len(t.x) for t in fig.data if t.type == "bar")
    assert bars <= 1500 + 500 * len(meta["rows"])  # wide slices + merged runs per row
    assert meta["flows_drawn"] == 0 and meta["flows_hidden"] == 500_000
    t0 = time.perf_counter()
    fig = thread_lanes_figure(slices, trace, links, 40_000_000, 40_020_000)
    zoomed = time.perf_counter() - t0
    assert fig.layout.meta["mode"] == "events" and fig.layout.meta["flows_drawn"] == 4 * 20
    assert whole < 4 and zoomed < 2, (whole, zoomed)  # ~0.8 s and 0.4 s on 2 busy cores


def test_a_modelled_trace_flat_draws_ops_over_their_pass() -> None:
    with popviz.open(PROFILES / "rn50_pipeline") as p:
        index, templates = TraceIndex(p.trace), pass_ops(p.ops)
        first = p.trace[p.trace["kind"] == "compute"].sort_values("start").iloc[0]
        lo, hi = float(first["start"]), float(first["end"])
        levels = module_levels(p.ops)
        flame = trace_lanes_figure(index, lo, hi, templates=templates, module_levels=levels)
        flat = trace_lanes_figure(index, lo, hi, templates=templates, flat=True,
                                  module_levels=levels)
    assert levels == 2  # resnet: layer1 > layer1.0 > the op (in layer1.0.conv1)
    assert [x for x in flame.layout.meta["lanes"] if x.startswith("IPU0")][:4] == [
        "IPU0 compute", "IPU0 module 1", "IPU0 module 2", "IPU0 ops"]
    assert not any("module" in lane for lane in flat.layout.meta["lanes"])
    mods = next(t for t in flame.data if t.name == "modules")
    assert {m.split(".")[0] for m in mods.customdata[:, 0]} >= {"stem", "layer1"}
    assert flame.layout.meta["view"] == "flame" and flat.layout.meta["view"] == "flat"
    assert any(lane.endswith(" ops") for lane in flame.layout.meta["lanes"])
    assert not any(lane.endswith(" ops") for lane in flat.layout.meta["lanes"])
    assert flat.layout.meta["ops_drawn"] == flame.layout.meta["ops_drawn"] > 0
    lanes = flat.layout.meta["lanes"]
    compute_rows = {r for r, lane in enumerate(lanes) if lane.endswith(" compute")}
    ops = [t for t in flat.data if str(t.name).startswith("op:")]
    assert ops and all(set(t.y) <= compute_rows for t in ops)


def test_an_older_file_reads_unchanged(tmp_path: Path) -> None:
    """A 1.1 profile: no host_slices table (read back empty, with its columns), no stream
    column, so /trace keeps its lanes."""
    with popviz.open(as_format_1_1(PROFILES / "tutorial_measured_2ranks", tmp_path)) as p:
        assert p.format_version == "1.1.0"
        slices = p.table("host_slices")
        assert slices.empty and "depth" in slices.columns
        assert not has_threads(slices, p.trace)


def test_module_runs_nest_consecutive_ops() -> None:
    ops = pd.DataFrame({"ipu": 0, "stage": 0, "microbatch": 0, "pass": "F",
                        "start": [0, 10, 20, 30, 40], "end": [10, 20, 30, 40, 50],
                        "module": ["a.x.c1", "a.x.c2", "a.y.c1", "b.c", "a.x.c1"]})
    one, two = module_runs(ops, 1), module_runs(ops, 2)
    assert one[["module", "start", "end"]].values.tolist() == [
        ["a", 0, 30], ["b", 30, 40], ["a", 40, 50]]  # a again after b: a run of its own
    assert two["module"].tolist() == ["a.x", "a.y", "b.c", "a.x"]
    assert module_runs(ops.assign(module=["", "a", "a", "a", "a"]), 2).empty


def test_the_measured_status_counts_what_the_view_draws() -> None:
    """The status over a measured trace counts the host slices and the events on no host
    thread apart, as drawn: not as one sum that reads like the statistics' trace events."""
    rel = "tutorial_measured_2ranks/profile.h5"
    root = Path(__file__).resolve().parent.parent / "profiles"
    if not (root / rel).exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    from popviz_app import create_app, render

    from popviz.analysis.trace_threads import side_events
    from tests.dash_util import component_text

    ctx = create_app(root).popviz_context
    text = component_text(render(ctx, "/trace", f"?profile={rel}")[1])
    with popviz.open(root / rel) as profile:
        slices, side = len(profile.table("host_slices")), len(side_events(profile.trace))
        events = len(profile.trace)
    assert f"{slices:,} host slices and {side:,} stream, idle and transfer events in " in text
    assert f"{events:,} trace events" in text  # the statistics' count, of every kind
