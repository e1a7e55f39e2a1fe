"""The Trace page on profiles imported from real H100 torch.profiler traces (tests/fixtures):
range statistics from measured times, each instant counted once (the metrics core), no
modelled op layout, and words that say what a measured profile shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from popviz_app import create_app

import popviz
from popviz.analysis.range_stats import range_statistics
from popviz.analysis.trace_detail import count_ops, op_events, pass_ops
from popviz.metrics import rank_time
from tests.dash_util import component_text
from tests.import_fixtures import PIPELINE, RESNET, trace_events

RECOMPUTE = Path(__file__).resolve().parents[1] / "profiles" / "rn50_recompute"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imported")
    popviz.import_trace([RESNET], root / "rn")
    popviz.import_trace(PIPELINE, root / "fx")
    return root


@pytest.fixture(scope="module")
def app(root: Path) -> Any:
    _cpu_trace(root / "cpu.json")  # a CPU step traced by torch.profiler here
    popviz.import_trace(root / "cpu.json", root / "cpu")
    return create_app(root)


def _cpu_trace(path: Path) -> None:
    """A training step of a small attention model on CPU, traced by torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 2, 64, batch_first=True)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    x = torch.randn(4, 8, 32)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        layer(x).square().mean().backward()
        opt.step()
    prof.export_chrome_trace(str(path))


def _rel(root: Path, name: str) -> str:
    return next((root / name).rglob("*.h5")).relative_to(root).as_posix()


def _busy_window(trace: Any) -> tuple[float, float]:
    """A window of the backward pass a few kernels long (like a zoom in the browser)."""
    comp = trace[(trace["kind"] == "compute") & (trace["pass"] == "B")].sort_values("start")
    mid = comp.iloc[len(comp) // 2: len(comp) // 2 + 20]
    return float(mid["start"].iloc[0]) + 1.0, float(mid["end"].iloc[-1]) - 1.0


@pytest.mark.parametrize("name", ["rn", "fx"])
def test_range_top_is_the_kernels_in_the_window(root: Path, name: str) -> None:
    with popviz.open(next((root / name).rglob("*.h5"))) as p:
        trace = p.trace
        lo, hi = _busy_window(trace)
        stats = range_statistics(trace, pass_ops(p.ops, measured=True), lo, hi, top=10_000,
                                 measured=True)
        comp = trace[(trace["kind"] == "compute") & (trace["end"] > lo) & (trace["start"] < hi)]
        # every kernel in the window once: runs are real counts, times clipped GPU time,
        # by kernel and by the host op that launched it
        assert stats.measured and stats.top_kernels is not None
        clipped = (comp["end"].clip(upper=hi) - comp["start"].clip(lower=lo)).sum()
        for table, runs in ((stats.top_kernels, "runs"), (stats.top_ops, "kernels")):
            assert int(table[runs].sum()) == len(comp)
            assert table["time"].sum() == pytest.approx(clipped)
            assert table["time"].is_monotonic_decreasing
        assert stats.by_class["time"].sum() == pytest.approx(clipped)
        assert stats.by_class["share"].sum() == pytest.approx(1.0)
        # the imported ops' cycles are measured GPU time: no modelled layout of them
        assert pass_ops(p.ops, measured=True) == {}


@pytest.mark.parametrize("name", ["rn", "fx"])
def test_time_by_kind_is_the_metrics_sweep(root: Path, name: str) -> None:
    with popviz.open(next((root / name).rglob("*.h5"))) as p:
        trace = p.trace
        lo, hi = float(trace["start"].min()), float(trace["end"].max())
        stats = range_statistics(trace, {}, lo, hi)
        assert stats.by_kind["share"].sum() == pytest.approx(1.0)
        got = stats.by_kind.set_index("kind")["time"]
        swept = rank_time(trace).iloc[0]
        assert got.get("sync", 0.0) == pytest.approx(swept["sync"])
        assert got.get("sync", 0.0) == pytest.approx(float(p.stages["sync_cycles"].sum()))
        assert got["idle"] == pytest.approx(swept["idle"])
        assert got["compute"] == pytest.approx(
            swept[["forward", "backward", "recompute", "weight_update", "compute"]].sum())
        row = stats.per_ipu.iloc[0]
        assert row["busy_share"] == pytest.approx(
            1 - (got["idle"] + got.get("sync", 0.0) + got.get("untraced", 0.0)) / (hi - lo))


@pytest.mark.parametrize("name", ["rn", "fx"])
def test_trace_page_of_an_imported_profile(app: Any, root: Path, name: str) -> None:
    search = f"?profile={_rel(root, name)}"
    with popviz.open(root / _rel(root, name)) as p:
        lo, hi = _busy_window(p.trace)
    fig, status, *_ = app.popviz_callbacks["trace.zoom"](
        {"xaxis.range[0]": lo, "xaxis.range[1]": hi}, search)
    assert fig.layout.meta["mode"] == "events"
    assert "ops" not in status and "modelled" not in status  # no op layout to promise
    # Perfetto's layout (format 1.2): host threads, GPU idle and streams, no op lanes
    rows = fig.layout.meta["rows"]
    assert any("thread" in r for r in rows) and any(r.startswith("stream") for r in rows)
    assert not any(r.endswith(" ops") for r in rows)
    panel = app.popviz_callbacks["trace.stats"]([lo, hi], None, search)
    text = " ".join(component_text(c) for c in panel)
    assert "Top kernels (measured GPU time)" in text and "modelled" not in text
    assert "Compute by op class (measured GPU time)" in text
    assert "Top ops (GPU time of the kernels each launched)" in text
    assert "Op-level statistics" not in text
    assert "GPU idle by cause (ns)" in text and "launched late" in text


def test_layout_control_keeps_the_window(app: Any, root: Path) -> None:
    """Flame / flat redraws the shown window: flat drops the depth rows of an import's
    threads, on an H100 step (with its stream) and a CPU step (no stream) alike; the
    status names the layout."""
    for name, stream in (("rn", True), ("cpu", False)):
        search = f"?profile={_rel(root, name)}"
        with popviz.open(root / _rel(root, name)) as p:
            lo, hi = float(p.trace["start"].min()), float(p.trace["end"].max()) / 2
        mode = app.popviz_callbacks["trace.mode"]
        flame, flame_status = mode("flame", {"range": [lo, hi]}, search)
        flat, flat_status = mode("flat", {"range": [lo, hi]}, search)
        assert flame.layout.meta["range"] == flat.layout.meta["range"] == [lo, hi]
        assert flame_status.endswith("(flame layout).")
        assert flat_status.endswith("(flat layout).")
        assert any(r.startswith("depth") for r in flame.layout.meta["rows"])
        assert not any(r.startswith("depth") for r in flat.layout.meta["rows"])
        assert any(r.startswith("stream") for r in flat.layout.meta["rows"]) == stream


def test_ops_of_a_range_are_the_launching_ops_of_the_raw_trace(root: Path) -> None:
    """Over the whole step, each host op's GPU time equals the summed durations of the
    compute kernels carrying its External id in the raw JSON (read with json here)."""
    events = trace_events(RESNET)
    name_of = {e["args"]["External id"]: e["name"] for e in events
               if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    want: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "kernel" and "nccl" not in e["name"].lower():
            op = name_of[e["args"]["External id"]]
            want[op] = want.get(op, 0.0) + e["dur"] * 1e3  # µs -> ns
    with popviz.open(next((root / "rn").rglob("*.h5"))) as p:
        trace = p.trace
        stats = range_statistics(trace, {}, float(trace["start"].min()),
                                 float(trace["end"].max()), top=10_000, measured=True)
    # one row per op and pass (an add_ of the forward apart from one of the backward)
    got = stats.top_ops.groupby("op")["time"].sum()
    assert not stats.top_ops.duplicated(["op", "pass"]).any()
    assert set(got.index) == set(want)
    for op, ns in want.items():
        assert got[op] == pytest.approx(ns, abs=len(events) * 1e-3), op  # ns rounding
    conv = stats.top_ops[stats.top_ops["op"] == "aten::cudnn_convolution"]
    assert set(conv["op_class"]) == {"conv"}
    # a profile without the link (an older import) still lists its kernels, no op tables
    bare = range_statistics(trace.drop(columns=["host_op", "op_class"]), {},
                            float(trace["start"].min()), float(trace["end"].max()),
                            measured=True)
    assert bare.by_class.empty and bare.top_ops.empty and len(bare.top_kernels)


def test_count_ops_is_the_ops_in_view() -> None:
    if not RECOMPUTE.exists():
        pytest.fail("profiles/ is committed: a bundled profile is missing (make profiles)")
    p = popviz.open(RECOMPUTE)
    templates = pass_ops(p.ops)
    comp = p.trace[p.trace["kind"] == "compute"].sort_values("start")
    first = comp.iloc[0]
    span = float(first["end"] - first["start"])
    for lo, hi in [(float(first["start"]) + span / 3, float(first["start"]) + span / 2),
                   (float(first["start"]) + span / 2, float(comp["end"].iloc[3]))]:
        assert count_ops(p.trace, templates, lo, hi) == len(
            op_events(p.trace, templates, lo, hi))


def test_trace_page_of_a_cpu_import_speaks_host_time(app: Any, root: Path) -> None:
    search = f"?profile={_rel(root, 'cpu')}"
    with popviz.open(root / _rel(root, "cpu")) as p:
        trace = p.trace
        comp = trace[trace["kind"] == "compute"]
        assert (comp["host_op"] == comp["op"]).all()  # a CPU rank's compute rows are ops
        lo, hi = float(trace["start"].min()), float(trace["end"].max())
    panel = app.popviz_callbacks["trace.stats"]([lo, hi], None, search)
    text = " ".join(component_text(c) for c in panel)
    assert "Top ops (measured host time)" in text
    assert "Compute by op class (measured host time)" in text
    assert "GPU" not in text and "kernel" not in text.lower()
    stats = range_statistics(trace, {}, lo, hi, top=10_000, measured=True)
    # fused attention is matmul work, as popviz.record classes it
    classes = stats.top_ops.set_index("op")["op_class"]
    attention = [op for op in classes.index if "attention" in op and op.startswith("aten::")]
    assert attention and all(classes[op] == "matmul" for op in attention)
