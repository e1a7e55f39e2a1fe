"""Op-by-op comparison (analysis.compare.ops) and the merged liveness overlay
(analysis.compare.overlay): exact figures on hand-made tables, totals on the bundled
profiles computed from their own tables, and an imported H100 trace against a modelled run."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

import popviz
from popviz.analysis.compare import compare
from popviz.analysis.compare.ops import compare_ops, module_at, short_op
from popviz.analysis.compare.overlay import liveness_overlay
from popviz.figures.compare_ops import liveness_overlay_figure, ops_diff_figure
from tests.import_fixtures import RESNET, trace_events

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
PIPELINE, RECOMPUTE = PROFILES / "rn50_pipeline", PROFILES / "rn50_recompute"
NS = 1e-9


def _modelled() -> Any:
    """Clock 1 GHz (a cycle is a ns), micro-batch 2, accumulation 4: 8 samples a step."""
    ops = pd.DataFrame({
        "op": ["aten.convolution.default", "aten.convolution_backward.default",
               "aten.relu.default", "aten._foreach_add.default"],
        "op_class": ["conv", "conv", "elementwise", "elementwise"],
        "phase": ["forward", "backward", "forward", "optimiser"],
        "pass": ["F", "B", "F", "WU"], "module": ["l1.c", "l1.c", "l2", ""],
        "cycles": [1000, 2000, 100, 50], "temp_total_bytes": [500, 700, 0, 0],
        "bytes_written": [10, 20, 5, 1]})
    return SimpleNamespace(kind="modelled", meta={"target": {"clock_hz": 1e9}}, ops=ops,
                           path="a.h5", name="a")


def _measured() -> Any:
    """Two recorded steps of a GPU: kernels with their host op, a copy with none."""
    trace = pd.DataFrame({
        "ipu": 0, "step": [0, 0, 0, 0, 1, 1],
        "kind": ["compute", "compute", "idle", "exchange", "compute", "sync"],
        "start": [0, 3000, 3500, 4000, 5000, 8000], "end": [3000, 3500, 4000, 4200, 8000, 8100],
        "op": ["k_conv", "k_relu", "", "Memcpy HtoD", "k_conv", ""],
        "host_op": ["aten::convolution", "aten::relu", "", "", "aten::convolution", ""],
        "op_class": ["conv", "elementwise", "", "", "conv", ""],
        "pass": ["F", "F", "", "", "F", ""]})
    return SimpleNamespace(kind="measured", meta={}, trace=trace, path="b.h5", name="b")


def _comp(samples_b: float = 8) -> Any:
    sides = pd.DataFrame([
        {"side": "A", "name": "a", "kind": "modelled", "replicas": 1, "micro_batch_size": 2,
         "gradient_accumulation": 4},
        {"side": "B", "name": "b", "kind": "measured", "replicas": 1,
         "micro_batch_size": samples_b, "gradient_accumulation": 1}])
    metrics = pd.DataFrame([{"metric": "samples_per_step", "a": 8.0, "b": samples_b}])
    return SimpleNamespace(sides=sides, metrics=metrics)


def _rows(diff: Any) -> dict[str, dict[str, float]]:
    return {r["group"]: r for r in diff.table.to_dict("records")}


def _same(got: float, want: float | None) -> bool:
    return (want is None and math.isnan(got)) or (want is not None and
                                                  math.isclose(got, want, rel_tol=1e-12))


def test_by_op_exact() -> None:
    diff = compare_ops(_modelled(), _measured(), _comp())
    assert diff.per == "step"  # both steps hold 8 samples
    rows = _rows(diff)
    # A: forward ops run 4 times a step (accumulation), the optimiser once; B: mean of 2 steps
    want = {"convolution_backward": (8000, None, 4, None),
            "convolution": (4000, 3000, 4, 1), "relu": (400, 250, 4, 0.5),
            "Memcpy HtoD": (None, 100, None, 0.5), "_foreach_add": (50, None, 1, None)}
    assert list(rows) == list(want)  # largest difference (or one side's time) first
    for group, (a, b, ca, cb) in want.items():
        r = rows[group]
        assert _same(r["a_seconds"], a and a * NS) and _same(r["b_seconds"], b and b * NS)
        assert _same(r["a_count"], ca) and _same(r["b_count"], cb)
        both = a is not None and b is not None
        assert _same(r["delta_seconds"], (b - a) * NS if both else None)
        assert _same(r["ratio"], b / a if both else None)
    assert rows["convolution"]["a_temp_bytes"] == 500
    assert rows["convolution"]["a_bytes_written"] == 40
    assert math.isnan(rows["convolution"]["b_temp_bytes"])  # a trace records none
    assert diff.totals == pytest.approx({"a_seconds": 12450 * NS, "b_seconds": 3350 * NS})


def test_other_keys_exact() -> None:
    a, b, comp = _modelled(), _measured(), _comp()
    rows = _rows(compare_ops(a, b, comp, by="class"))
    assert rows["conv"]["a_seconds"] == pytest.approx(12000 * NS)
    assert rows["conv"]["b_seconds"] == pytest.approx(3000 * NS)
    assert rows["conv"]["a_temp_bytes"] == 700  # the largest of one op, not a sum
    assert rows["elementwise"]["a_seconds"] == pytest.approx(450 * NS)
    assert rows["exchange"]["b_seconds"] == pytest.approx(100 * NS)  # kind stands in
    assert math.isnan(rows["exchange"]["a_seconds"])
    rows = _rows(compare_ops(a, b, comp, by="module", depth=1))
    assert set(rows) == {"l1", "l2", "(no module)"}
    assert rows["(no module)"]["a_seconds"] == pytest.approx(50 * NS)
    assert rows["(no module)"]["b_seconds"] == pytest.approx(3350 * NS)
    assert set(_rows(compare_ops(a, b, comp, by="module", depth=2))) == {
        "l1.c", "l2", "(no module)"}
    rows = _rows(compare_ops(a, b, comp, by="pass"))
    assert rows["forward"]["a_seconds"] == pytest.approx(4400 * NS)
    assert rows["forward"]["b_seconds"] == pytest.approx(3250 * NS)
    assert rows["optimiser"]["a_seconds"] == pytest.approx(50 * NS)
    assert rows["(none)"]["b_seconds"] == pytest.approx(100 * NS)


def test_per_sample_when_the_steps_differ() -> None:
    a, b = _modelled(), _measured()
    diff = compare_ops(a, b, _comp(samples_b=32))
    assert diff.per == "sample"  # 8 vs 32 samples a step: per-step times are not alike
    conv = _rows(diff)["convolution"]
    assert conv["a_seconds"] == pytest.approx(4000 * NS / 8)
    assert conv["b_seconds"] == pytest.approx(3000 * NS / 32)
    assert conv["a_count"] == 4  # calls stay per step
    step = _rows(compare_ops(a, b, _comp(samples_b=32), per="step"))["convolution"]
    assert step["b_seconds"] == pytest.approx(3000 * NS)


def test_bad_choices_are_one_line_errors() -> None:
    for kwargs in ({"by": "layer"}, {"per": "minute"}, {"by": "module", "depth": 0}):
        with pytest.raises(ValueError, match=r"by|per|depth"):
            compare_ops(_modelled(), _measured(), _comp(), **kwargs)


def test_names_and_depths() -> None:
    assert short_op("aten.convolution.default") == short_op("aten::convolution") \
        == "convolution"
    assert short_op("void cudnn::kernel<float>") == "void cudnn::kernel<float>"
    assert module_at("layer1.0.conv1", 2) == "layer1.0" and module_at("", 3) == "(no module)"


def _op_seconds(profile: Any) -> tuple[float, float, float]:
    """From the profile's own tables: (op seconds per step, calls per step, samples per
    replica step): per-micro-batch phases run accumulation x iterations times a step."""
    opts, summary = profile.meta["options"], profile.summary
    acc, its = int(opts["gradient_accumulation"]), int(opts.get("device_iterations") or 1)
    ops = profile.ops
    runs = np.where(ops["phase"].isin(["forward", "backward", "recompute", "host_io"]),
                    acc * its, its)
    clock = float(profile.meta["target"]["clock_hz"])
    samples = float(summary["samples_per_step"]) / int(opts.get("replication_factor") or 1)
    return float((ops["cycles"] * runs).sum()) / clock, float(runs.sum()), samples


@pytest.fixture(scope="module")
def bundled() -> Any:
    with popviz.open(PIPELINE) as a, popviz.open(RECOMPUTE) as b:
        yield a, b, compare(a, b)


@pytest.mark.parametrize("by", ["op", "class", "module", "pass"])
def test_bundled_totals_are_each_profiles_op_time(bundled: Any, by: str) -> None:
    a, b, comp = bundled
    diff = compare_ops(a, b, comp, by=by, depth=2, per="step")
    t = diff.table
    assert t["group"].is_unique and len(t)
    for side, profile in (("a", a), ("b", b)):
        seconds, calls, _ = _op_seconds(profile)
        assert t[f"{side}_seconds"].sum() == pytest.approx(seconds, rel=1e-9)
        assert diff.totals[f"{side}_seconds"] == pytest.approx(seconds, rel=1e-9)
        assert t[f"{side}_count"].sum() == pytest.approx(calls, rel=1e-12)
    size = t["delta_seconds"].abs().fillna(t[["a_seconds", "b_seconds"]].max(axis=1))
    assert (size.diff().dropna() <= 1e-18).all()  # largest difference first


def test_bundled_per_sample_matches_the_op_class_table(bundled: Any) -> None:
    a, b, comp = bundled
    diff = compare_ops(a, b, comp, by="class")
    samples = {s: _op_seconds(p)[2] for s, p in (("a", a), ("b", b))}
    assert diff.per == ("step" if samples["a"] == samples["b"] else "sample")
    per_sample = compare_ops(a, b, comp, by="class", per="sample").table
    # the comparison's own per-(class, phase) table, summed over phases, in µs per sample
    classes = comp.op_classes.groupby("op_class")[["a", "b"]].sum()
    for side in ("a", "b"):
        got = per_sample.set_index("group")[f"{side}_seconds"] * 1e6
        assert got.reindex(classes.index).to_numpy() == pytest.approx(
            classes[side].to_numpy(), rel=1e-9)
        assert got.sum() == pytest.approx(_op_seconds((a, b)[side == "b"])[0]
                                          / samples[side] * 1e6, rel=1e-9)
    fig = ops_diff_figure(diff, top=4)
    assert len(fig.data[0].y) == min(4, len(diff.table))
    assert list(fig.data[0].y) == list(diff.table["group"].head(4))
    scale = 1e3 if diff.per == "step" else 1e6
    first = diff.table.iloc[0]
    assert fig.data[0].x[0] == pytest.approx(first["delta_seconds"] * scale)
    # the hover names both sides' figures
    assert fig.data[0].customdata[0][0] == format(first["a_seconds"] * scale, ",.4g")
    assert fig.data[0].customdata[0][1] == format(first["b_seconds"] * scale, ",.4g")
    assert "A %{customdata[0]}, B %{customdata[1]}" in fig.data[0].hovertemplate


def test_imported_h100_against_a_modelled_run(resnet: Any, bundled: Any) -> None:
    _, b, _ = bundled
    comp = compare(resnet, b)
    diff = compare_ops(resnet, b, comp, by="class", per="step")
    # every GPU kernel, copy and memset of the raw trace (one step), read with json alone
    kernels = [e for e in trace_events(RESNET) if e.get("ph") == "X"
               and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert diff.table["a_seconds"].sum() == pytest.approx(
        sum(e["dur"] for e in kernels) * 1e-6, rel=1e-9)
    # calls, not kernels: an op whose calls launched compute kernels counts once a call
    # (one External id), its memsets nothing more; any other event counts itself
    ops = {e["args"]["External id"] for e in trace_events(RESNET)
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    calls = {e["args"].get("External id") for e in kernels if e["cat"] == "kernel"
             and "nccl" not in e["name"].lower() and e["args"].get("External id") in ops}
    others = [e for e in kernels if e["args"].get("External id") not in calls]
    assert diff.table["a_count"].sum() == pytest.approx(len(calls) + len(others))
    assert diff.table["a_count"].sum() < len(kernels)
    assert diff.table["b_seconds"].sum() == pytest.approx(_op_seconds(b)[0], rel=1e-9)
    conv = _rows(diff)["conv"]
    assert conv["a_seconds"] > 0 and conv["b_seconds"] > 0  # both sides ran convolutions
    assert diff.table["a_temp_bytes"].isna().all()  # a trace records no temporaries
    auto = compare_ops(resnet, b, comp, by="op")
    assert auto.per == "sample"  # a batch-64 step against a 320-sample step
    ops = set(auto.table["group"])
    assert "convolution_backward" in ops  # the aten op launching the kernels, both sides
    both = auto.table.dropna(subset=["a_seconds", "b_seconds"])
    assert "convolution_backward" in set(both["group"])


def test_overlay_exact() -> None:
    lv = pd.DataFrame({"side": ["A"] * 5 + ["B"] * 2, "ipu": [0, 0, 0, 1, 1, 0, 0],
                       "step": [0, 1, 2, 0, 1, 0, 1],
                       "total_bytes": [1.0, 3.0, 2.0, 0.0, 4.0, 5.0, 6.0]})
    dev = liveness_overlay(lv, "device")
    a0 = dev[(dev["side"] == "A") & (dev["ipu"] == 0)]
    assert a0["x"].tolist() == [0.0, 0.5, 1.0]  # each curve spans its own step
    assert dev[(dev["side"] == "A") & (dev["ipu"] == 1)]["x"].tolist() == [0.0, 1.0]
    peak = liveness_overlay(lv, "peak")
    a = peak[peak["side"] == "A"]
    # at x 0: max(1, 0); 0.5: max(3, 0 held); 1: max(2, 4)
    assert a["x"].tolist() == [0.0, 0.5, 1.0] and a["total_bytes"].tolist() == [1, 3, 4]
    assert a["ipu"].tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="device or peak"):
        liveness_overlay(lv, "sum")


def test_overlay_bundled_peak_is_the_fullest_device(bundled: Any) -> None:
    _, _, comp = bundled
    peak = liveness_overlay(comp.liveness, "peak")
    best = comp.metrics.set_index("metric").loc["peak_bytes_max"]
    for side in ("A", "B"):
        assert peak[peak["side"] == side]["total_bytes"].max() == best[side.lower()]
    dev = liveness_overlay(comp.liveness, "device")
    ends = dev.groupby(["side", "ipu"])["x"].agg(["min", "max"])
    assert (ends["min"] == 0).all() and (ends["max"] == 1).all()
    ipus = comp.liveness.groupby("side")["ipu"].nunique()
    fig = liveness_overlay_figure(dev, comp.sides)
    assert len(fig.data) == int(ipus.sum())
    dashes = {t.legendgroup: t.line.dash for t in fig.data}
    assert dashes == {"A": "solid", "B": "dash"}
    colours = [t.line.color for t in fig.data]
    assert len(set(colours)) == len(colours)  # every curve its own colour
