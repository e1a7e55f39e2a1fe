"""popviz.compare and `popviz compare`: hand-made pairs with hand-checkable numbers, and
compiled pairs (a 4-IPU pipeline vs one IPU with recomputation and 4 replicas)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import popviz
from popviz.analysis.compare import Comparison
from popviz.api import compare
from popviz.cli.main import main
from popviz.format.writer import write_profile
from popviz.metrics import oom_tiles, peak_liveness

CLOCK = 1.0e9  # 1 cycle = 1 ns keeps the hand arithmetic readable
ROOT = Path(__file__).resolve().parents[1]


def _trace(rows: list[tuple[int, int, int, str, str]]) -> pd.DataFrame:
    """(ipu, start, end, kind, pass) rows -> a contract trace table."""
    t = pd.DataFrame(rows, columns=["ipu", "start", "end", "kind", "pass"])
    t["stage"] = t["ipu"]
    t["microbatch"] = 0
    t["op"] = t["kind"]
    return t


def _liveness(ipus: int, phases: list[tuple[str, int]], base: int) -> pd.DataFrame:
    seq = [p for p, n in phases for _ in range(n)]
    rows = [(i, s, p, base, 1000 * (s + 1) * (i + 1)) for i in range(ipus)
            for s, p in enumerate(seq)]
    return pd.DataFrame(rows, columns=["ipu", "step", "phase", "always_live_bytes",
                                       "not_always_live_bytes"])


def _tiles(ipus: int, cap: int, over_ipu: int | None) -> pd.DataFrame:
    rows = []
    for i in range(ipus):
        for t in range(4):
            total = 100 * (t + 1) + (cap if i == over_ipu and t == 3 else 0)
            rows.append((i, t, cap, total, total))
    return pd.DataFrame(rows, columns=["ipu", "tile", "capacity_bytes", "total_bytes",
                                       "always_live"])


def pipeline_profile(path: Path, oom: bool = False) -> Path:
    """A: 2-IPU pipeline, 8 samples per step in 1000 cycles; IPU1 overflows if `oom`."""
    trace = _trace([(0, 0, 300, "compute", "F"), (0, 300, 700, "compute", "B"),
                    (0, 700, 1000, "idle", ""), (1, 0, 200, "compute", "F"),
                    (1, 200, 300, "exchange", ""), (1, 300, 600, "compute", "B"),
                    (1, 600, 1000, "idle", "")])
    stages = pd.DataFrame({"stage": [0, 1], "ipu": [0, 1], "forward_cycles": [300, 200],
                           "backward_cycles": [400, 300], "recompute_cycles": [0, 0],
                           "exchange_cycles": [0, 100], "idle_cycles": [300, 400],
                           "stash_bytes": [3000, 0], "peak_bytes": [0, 0]})
    exchange = pd.DataFrame({"src": [0, "host"], "dst": [1, 0], "bytes": [5000, 700],
                             "start": [200, 0], "end": [300, 10],
                             "kind": ["activation", "host_in"]})
    ops = pd.DataFrame({"op_id": [0, 1, 2], "op": ["conv", "conv_bw", "sgd"],
                        "op_class": ["conv", "conv", "elementwise"],
                        "phase": ["forward", "backward", "optimiser"],
                        "cycles": [100, 200, 48]})
    tables = {"stages": stages, "trace": trace, "exchange": exchange, "ops": ops,
              "liveness": _liveness(2, [("forward", 4), ("backward", 4), ("optimiser", 2)],
                                    50_000),
              "tile_memory": _tiles(2, 10_000, 1 if oom else None)}
    meta = {"target": {"name": "mk2", "num_ipus": 2, "tiles_per_ipu": 4,
                       "bytes_per_tile": 10_000, "clock_hz": CLOCK},
            "options": {"strategy": "pipelined", "schedule": "Grouped", "micro_batch_size": 4,
                        "gradient_accumulation": 2, "replication_factor": 1,
                        "available_memory_proportion": {"IPU0": 0.15}, "splits": ["b2/3"]},
            "model": {"name": "hand", "batch_size": 4}}
    return write_profile(path, meta=meta, tables=tables, summary={})


def recompute_profile(path: Path, kind: str = "modelled") -> Path:
    """B: one IPU, 2 replicas, 8 samples per replica in 1500 time units, recomputation."""
    trace = _trace([(0, 0, 500, "compute", "F"), (0, 500, 700, "compute", "R"),
                    (0, 700, 1400, "compute", "B"), (0, 1400, 1500, "exchange", "")])
    stages = pd.DataFrame({"stage": [0], "ipu": [0], "forward_cycles": [500],
                           "backward_cycles": [700], "recompute_cycles": [200],
                           "exchange_cycles": [100], "idle_cycles": [0],
                           "stash_bytes": [0], "peak_bytes": [0]})
    exchange = pd.DataFrame({"src": [0, "host"], "dst": [0, 0], "bytes": [2000, 700],
                             "start": [1400, 0], "end": [1500, 10],
                             "kind": ["allreduce", "host_in"]})
    ops = pd.DataFrame({"op_id": [0, 1, 2, 3], "op": ["conv", "conv_r", "conv_bw", "sgd"],
                        "op_class": ["conv", "conv", "conv", "elementwise"],
                        "phase": ["forward", "recompute", "backward", "optimiser"],
                        "cycles": [160, 60, 200, 48]})
    tables = {"stages": stages, "trace": trace, "exchange": exchange, "ops": ops,
              "liveness": _liveness(1, [("forward", 5), ("recompute", 3), ("backward", 10),
                                        ("optimiser", 2)], 80_000),
              "tile_memory": _tiles(1, 20_000, None)}
    meta = {"target": {"name": "mk1", "num_ipus": 1, "tiles_per_ipu": 4,
                       "bytes_per_tile": 20_000, "clock_hz": 2 * CLOCK},
            "options": {"strategy": "pipelined", "schedule": "Sequential",
                        "micro_batch_size": 4, "gradient_accumulation": 2,
                        "replication_factor": 2, "recomputation": True,
                        "available_memory_proportion": {"IPU0": 0.6}, "splits": ["b2/1"]},
            "model": {"name": "hand", "batch_size": 4}}
    return write_profile(path, meta=meta, tables=tables, summary={}, kind=kind)


@pytest.fixture(scope="module")
def hand(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hand")
    return {"pipe": pipeline_profile(d / "pipe"), "pipe_oom": pipeline_profile(d / "oom", True),
            "rec": recompute_profile(d / "rec"),
            "measured": recompute_profile(d / "measured", "measured")}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small real pair from the compiler: a 4-IPU pipeline vs 1 IPU x 4 replicas."""
    from popviz.compiler.compiler import compile as compile_program
    from popviz.format.writer import write_report
    from popviz.options import Options
    from tooling.testing.programs import synthetic_program

    prog = synthetic_program(layers=8, batch=4)
    d = tmp_path_factory.mktemp("compiled")
    layouts = {"pipe": Options(splits=["l2", "l4", "l6"], gradient_accumulation=8,
                               recomputation=True),
               "rec": Options(splits=["l2", "l4", "l6"], num_ipus=1, recomputation=True,
                              replication_factor=4, gradient_accumulation=8)}
    return {k: write_report(compile_program(prog, o), d / k) for k, o in layouts.items()}


def _check_deltas(frame: pd.DataFrame) -> None:
    both = frame.dropna(subset=["a", "b"])
    assert len(both)
    np.testing.assert_array_equal(both["delta"], both["b"] - both["a"])
    nz = both[both["a"] != 0]
    np.testing.assert_allclose(nz["ratio"], nz["b"] / nz["a"], rtol=1e-12)
    assert both.loc[both["a"] == 0, "ratio"].isna().all()


def _metric(comp: Comparison, name: str) -> pd.Series:
    return comp.metrics.set_index("metric").loc[name]


def test_every_delta_is_b_minus_a(hand: dict[str, Path], compiled: dict[str, Path]) -> None:
    for a, b in ((hand["pipe"], hand["rec"]), (compiled["pipe"], compiled["rec"])):
        comp = compare(a, b)
        for frame in (comp.metrics, comp.time_per_sample, comp.ipus, comp.stages,
                      comp.op_classes):
            _check_deltas(frame)


def test_hand_figures_and_verdict(hand: dict[str, Path]) -> None:
    comp = compare(hand["pipe"], hand["rec"])
    m = comp.metrics.set_index("metric")
    # A: 8 samples / 1000 ns on 2 IPUs; B: 16 samples / 750 ns (1500 cycles at 2 GHz) on 2
    assert m.loc["throughput", "a"] == pytest.approx(8 / 1e-6)
    assert m.loc["throughput", "b"] == pytest.approx(16 / 0.75e-6)
    assert m.loc["throughput_per_ipu", "ratio"] == pytest.approx((16 / 0.75) / 8)
    assert m.loc["step_ms", "b"] == pytest.approx(1500 / (2 * CLOCK) * 1e3)
    assert m.loc["idle_fraction", "a"] == pytest.approx(700 / 2000)
    assert m.loc["inter_ipu_bytes", "a"] == 5000 and m.loc["host_bytes", "a"] == 700
    assert m.loc["stash_bytes", "delta"] == -3000
    tps = comp.time_per_sample.set_index("category")
    # IPU-cycles per sample: A idles (300 + 400) / 8; B recomputes 200 / 8 cycles at 2 GHz
    assert tps.loc["idle", "a"] == pytest.approx(700 / 8 / CLOCK * 1e6)
    assert tps.loc["recompute", "b"] == pytest.approx(200 / 8 / (2 * CLOCK) * 1e6)
    for side in ("a", "b"):  # the decomposition is exact
        assert tps[side].sum() == pytest.approx(1e6 / m.loc["throughput_per_ipu", side])
    ops = comp.op_classes.set_index(["op_class", "phase"])
    assert ops.loc[("conv", "forward"), "a"] == pytest.approx(100 / 4 / CLOCK * 1e6)
    assert ops.loc[("elementwise", "optimiser"), "a"] == pytest.approx(48 / 8 / CLOCK * 1e6)
    assert ops.loc[("conv", "recompute"), "a"] == 0  # absent in A = no time spent
    v = comp.verdict
    factor = (16 / 0.75) / 8
    assert v["winner"] == "B" and v["faster_per_ipu"] == "B"
    assert f"{factor:.2f}x faster per IPU" in v["headline"]
    assert "idle" in v["reasons"][0] and "recomputing" in v["reasons"][0]
    assert "most on IPU1 (40% of its step" in v["reasons"][0]  # 400 of 1000 idle
    assert "AMP: IPU0: 0.15 vs IPU0: 0.6" in v["differences"]
    assert "target: mk2 vs mk1" in v["differences"]


def test_public_name() -> None:
    assert popviz.compare is compare  # the contract's `popviz.compare(a, b)`


def test_swapping_sides_negates_deltas(hand: dict[str, Path]) -> None:
    ab, ba = compare(hand["pipe"], hand["rec"]), compare(hand["rec"], hand["pipe"])
    np.testing.assert_allclose(ab.metrics["delta"], -ba.metrics["delta"])
    assert ba.verdict["winner"] == "A" and ba.verdict["faster_per_ipu"] == "A"


def test_only_one_fits_wins(hand: dict[str, Path]) -> None:
    comp = compare(hand["pipe_oom"], hand["pipe"])
    v = comp.verdict
    assert v["fits"] == {"A": False, "B": True} and v["winner"] == "B"
    assert v["headline"].startswith("Only B (pipe) fits. A (oom) does not fit: 1 tile(s) "
                                    "out of memory on IPU1")
    assert _metric(comp, "oom_tiles")["delta"] == -1
    ipus = comp.ipus.set_index(["ipu", "metric"])
    assert ipus.loc[(1, "oom_tiles"), "a"] == 1 and ipus.loc[(0, "oom_tiles"), "a"] == 0


def test_same_profile_is_a_tie(hand: dict[str, Path]) -> None:
    comp = compare(hand["pipe"], hand["pipe"])
    assert (comp.metrics["delta"] == 0).all()
    assert comp.verdict["winner"] is None and comp.verdict["differences"] == []
    assert "about as fast" in comp.verdict["headline"]


def test_measured_vs_modelled_in_seconds(hand: dict[str, Path]) -> None:
    comp = compare(hand["rec"], hand["measured"])
    m = comp.metrics.set_index("metric")
    assert m.loc["step_ms", "a"] == pytest.approx(1500 / (2 * CLOCK) * 1e3)
    assert m.loc["step_ms", "b"] == pytest.approx(1500 * 1e-9 * 1e3)  # ns
    assert "step_cycles" not in m.index  # cycles only make sense when both are modelled
    units = comp.sides.set_index("side")["time_unit"]
    assert units.to_dict() == {"A": "cycles", "B": "ns"}
    assert any("modelled and B measured" in r for r in comp.verdict["reasons"])


def test_liveness_phase_boundaries_aligned(hand: dict[str, Path]) -> None:
    comp = compare(hand["pipe"], hand["rec"])
    # A: backward at 4/10, optimiser at 8/10; B: 5/20 and 18/20 -> means of the two
    assert comp.phase_x == pytest.approx({"backward": (0.4 + 0.25) / 2,
                                          "optimiser": (0.8 + 0.9) / 2})
    lv = comp.liveness
    for (_side, _ipu), g in lv.groupby(["side", "ipu"]):
        assert g["x"].is_monotonic_increasing and g["x"].between(0, 1).all()
        assert g["x"].iloc[0] == 0 and g["x"].iloc[-1] == 1  # first and last step
        first_b = g[g["phase"].isin(["backward", "recompute"])].iloc[0]
        first_o = g[g["phase"] == "optimiser"].iloc[0]
        assert first_b["x"] == pytest.approx(comp.phase_x["backward"])
        assert first_o["x"] == pytest.approx(comp.phase_x["optimiser"])


def test_compiled_pair_matches_own_summaries(compiled: dict[str, Path]) -> None:
    comp = compare(compiled["pipe"], compiled["rec"])
    m = comp.metrics.set_index("metric")
    with popviz.open(compiled["pipe"]) as a, popviz.open(compiled["rec"]) as b:
        for side, p in (("a", a), ("b", b)):
            s = p.summary
            for key in ("throughput", "throughput_per_ipu", "step_cycles", "total_ipus",
                        "idle_fraction"):
                assert m.loc[key, side] == pytest.approx(s[key], rel=1e-12), key
            assert m.loc["peak_bytes_max", side] == peak_liveness(p.liveness).max()
            assert m.loc["oom_tiles", side] == len(oom_tiles(p.tile_memory))
            assert m.loc["exchange_bytes", side] == p.exchange["bytes"].sum()
            assert m.loc["stash_bytes", side] == p.stages["stash_bytes"].sum()
        ratio = b.summary["throughput_per_ipu"] / a.summary["throughput_per_ipu"]
    v = comp.verdict
    assert v["speedup_per_ipu"] == pytest.approx(ratio)
    faster = "B" if ratio > 1 else "A"
    assert v["faster_per_ipu"] == faster and v["winner"] == faster
    assert "IPUs per replica: 4 vs 1" in v["differences"]


def test_missing_clock_is_one_line_error(tmp_path: Path, hand: dict[str, Path]) -> None:
    from tests.profiles_util import tiny_tables
    path = write_profile(tmp_path / "noclock", meta={"target": {"name": "x", "num_ipus": 2}},
                         tables=tiny_tables(), summary={})
    with pytest.raises(ValueError, match="clock_hz is missing"):
        compare(path, hand["pipe"])


def test_cli_text_and_json(hand: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(hand["pipe"]), str(hand["rec"])]) == 0
    out = capsys.readouterr().out
    comp = compare(hand["pipe"], hand["rec"])
    assert comp.verdict["headline"] in out
    assert "throughput_per_ipu" in out and "B / A" in out
    assert main(["compare", str(hand["pipe"]), str(hand["rec"]), "--json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert data["verdict"]["headline"] == comp.verdict["headline"]
    got = {r["metric"]: r for r in data["metrics"]}
    for _, r in comp.metrics.iterrows():
        for col in ("a", "b", "delta"):
            assert got[r["metric"]][col] == pytest.approx(r[col])
    ratio = got["oom_tiles"]["ratio"]  # 0 / 0: no ratio, null rather than NaN
    assert ratio is None or not math.isnan(ratio)


def test_cli_bad_path_one_line(hand: dict[str, Path], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", str(hand["pipe"]), str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("popviz: error: ") and "no such file" in err
    assert err.count("\n") == 1 and "Traceback" not in err


BUNDLED = ROOT / "profiles"


def test_bundled_rn50_pipeline_vs_recompute() -> None:
    comp = compare(BUNDLED / "rn50_pipeline", BUNDLED / "rn50_recompute")
    with popviz.open(BUNDLED / "rn50_pipeline") as a, \
            popviz.open(BUNDLED / "rn50_recompute") as b:
        m = comp.metrics.set_index("metric")
        for side, p in (("a", a), ("b", b)):
            assert m.loc["throughput_per_ipu", side] == pytest.approx(
                p.summary["throughput_per_ipu"])
            assert bool(comp.sides.set_index("side").loc[side.upper(), "fits"]) == \
                bool(oom_tiles(p.tile_memory).empty)
        ratio = b.summary["throughput_per_ipu"] / a.summary["throughput_per_ipu"]
    for frame in (comp.metrics, comp.time_per_sample, comp.ipus, comp.op_classes):
        _check_deltas(frame)
    assert comp.verdict["speedup_per_ipu"] == pytest.approx(ratio)
    assert f"{max(ratio, 1 / ratio):.2f}x" in " ".join([comp.verdict["headline"],
                                                         *comp.verdict["reasons"]])


def test_minimal_contract_profiles(tmp_path: Path) -> None:
    """Only the contract columns (no op_class, empty trace and liveness, no summary): the
    comparison still stands, with unknown figures left empty rather than made up."""
    from tests.profiles_util import tiny_meta, tiny_summary, tiny_tables
    a = write_profile(tmp_path / "a", meta=tiny_meta(), tables=tiny_tables(),
                      summary=tiny_summary())
    t = tiny_tables()
    for name in ("trace", "liveness", "exchange"):
        t[name] = t[name].iloc[0:0]
    b = write_profile(tmp_path / "b", meta=tiny_meta(), tables=t, summary={}, kind="measured")
    comp = compare(a, b)
    m = comp.metrics.set_index("metric")
    assert m.loc["throughput", "a"] == 1234.5 and math.isnan(m.loc["throughput", "b"])
    assert math.isnan(m.loc["step_ms", "b"]) and math.isnan(m.loc["step_ms", "delta"])
    assert m.loc["peak_bytes_max", "b"] == 9000  # from stages.peak_bytes without liveness
    assert set(comp.op_classes["op_class"]) == {"other"}
    v = comp.verdict
    assert v["winner"] is None and v["headline"].startswith("Neither fits.")
    assert "Throughput is not known for both profiles." in v["reasons"]
    json.dumps(comp.to_dict(), allow_nan=False)  # NaN becomes null


def test_a_layout_reads_the_same_however_its_options_named_it() -> None:
    """The tutorial pipeline names blocks per stage (options.splits is empty, AMP unset);
    compare describes the layout as compiled: split points and the AMP each IPU ran with."""
    from popviz.analysis.compare.sides import load_side

    prof = popviz.open("profiles/tutorial_pipelined/training")
    assert prof.meta["options"]["splits"] == []
    facts = load_side(prof, "A").facts
    assert facts["splits"] == " ".join(prof.stages["first_layer"].iloc[1:]) == "B2 B3 B4"
    assert facts["amp"] == "IPU0: 0.6, IPU1: 0.6, IPU2: 0.6, IPU3: 0.6"


def test_a_measured_run_is_compared_per_step_and_per_sample() -> None:
    """The bundled 2-rank gloo run (2 recorded steps): its op classes, bars and traffic
    are one step's (or one sample's), and its unknown fit is not called a fit."""
    measured = ROOT / "profiles" / "tutorial_measured_2ranks"
    comp = compare(measured, measured)
    with popviz.open(measured) as p:
        steps = p.trace["step"].nunique()
        inter = float(p.exchange["bytes"][p.exchange["src"].astype(str).ne("host")
                                          & p.exchange["dst"].astype(str).ne("host")].sum())
        step_ms = float(p.summary["step_seconds"]) * 1e3
    assert steps == 2
    # every call of both steps counted once: per sample, the ops of a phase are the
    # phase's device time per sample from the trace (top-level ops cover it)
    ops = comp.op_classes.groupby("phase")["a"].sum()
    tps = comp.time_per_sample.set_index("category")["a"]
    for phase in ("forward", "backward"):
        assert ops[phase] == pytest.approx(tps[phase], rel=0.02), phase
    # each rank's bars add up to the step, untraced host time included
    a = comp.ipus[comp.ipus["metric"].str.endswith("_ms")].pivot_table(
        index="ipu", columns="metric", values="a")
    assert (a["untraced_ms"] > 0).all()
    assert a.sum(axis=1).to_numpy() == pytest.approx(step_ms, rel=1e-6)
    metrics = comp.metrics.set_index("metric")["a"]
    assert metrics["inter_ipu_bytes"] == pytest.approx(inter / steps)
    assert pd.isna(metrics.get("stash_bytes"))  # no stash in the traces: unknown, not 0 B
    assert not any("stash" in r for r in comp.verdict["reasons"])
    assert "Both fit" not in comp.verdict["headline"]
    assert "not known" in comp.verdict["headline"]
