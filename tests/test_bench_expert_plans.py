"""bench/bench_expert_plans.py on a small config (ResNet-18 at 32x32, micro-batch 2, a
4-IPU pipeline) through the bench's own code path with a tiny compile budget."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from popviz.compiler import compile
from tooling.calibration import load_points

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_expert_plans",
                                              ROOT / "bench" / "bench_expert_plans.py")
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # dataclasses look their module up there
spec.loader.exec_module(bench)

SMALL = {"name": "small-r18-4ipu", "point": None, "source": "this test",
         "config": {"target": "mk2", "model": "resnet", "size": 18, "batch": 2, "image": 32,
                    "training": True,
                    "options": {"splits": ["b2/0", "b3/0", "b4/0"], "recomputation": True,
                                "precision": "16.32", "half_partials": True,
                                "available_memory_proportion": 0.15,
                                "gradient_accumulation": 8, "schedule": "Grouped"}}}


@pytest.fixture(scope="module")
def row():
    return bench.run_config(SMALL, max_compiles=6)


def test_the_speedup_is_the_ratio_of_the_two_compiled_throughputs(row) -> None:
    assert row.result is not None and row.result.compiles <= 6
    program, options = bench.config_program(SMALL), bench.config_options(SMALL)
    now = compile(program, options).summary
    best = compile(program, row.result.best_options(options)).summary
    assert row.ipus == 4 == now["num_ipus"] == best["num_ipus"]
    assert row.now.throughput == pytest.approx(now["throughput"], rel=1e-9)
    assert row.best.throughput == pytest.approx(best["throughput"], rel=1e-9)
    assert row.speedup == pytest.approx(best["throughput"] / now["throughput"], rel=1e-9)
    assert row.best.fits == bool(best["fits"]) and row.now.fits == bool(now["fits"])


def test_the_table_has_the_columns_and_a_line_per_layout(row) -> None:
    text = bench.render([row], 6)
    header = next(line for line in text.splitlines() if line.startswith("config"))
    for column in bench.COLUMNS:
        assert column in header
    lines = bench.table_rows([row])
    assert [r[1] for r in lines][:2] == ["published", "tune best"]
    assert len(lines) == 2 + (row.ceiling_best is not None)
    assert all(len(r) == len(bench.COLUMNS) for r in lines)
    assert lines[1][bench.COLUMNS.index("speed-up")] == f"{row.speedup:.2f}x"
    assert len(lines[0][bench.COLUMNS.index("Mcycles/stage/mb")].split("/")) == 4
    data = json.loads(json.dumps(row.to_dict()))
    assert data["speedup"] == pytest.approx(row.speedup)
    assert data["now"]["splits"] == ["b2/0", "b3/0", "b4/0"]


def test_claims_above_the_threshold_are_flagged(row) -> None:
    flagged = row.flag.startswith(("claim >", "explained"))
    assert flagged == (row.speedup > bench.CLAIM and row.best.fits and row.now.fits)
    # the same row with the best made 1.2x faster than the published layout is flagged
    row.best.throughput, saved = row.now.throughput * 1.2, row.best.throughput
    try:
        assert row.best.fits and row.now.fits
        assert "model error or a named mechanism" in row.flag
    finally:
        row.best.throughput = saved


def test_a_claim_is_explained_only_when_tune_within_the_published_fill_is_under(row) -> None:
    """decompose() tunes again with no tile fuller than the published layout's fullest;
    the flag says 'explained' only when that claim is at or under the threshold."""
    program, options = bench.config_program(SMALL), bench.config_options(SMALL)
    probe = bench.Row("probe", "", 4, None, row.result, options)
    bench.decompose(probe, program, options, max_compiles=6)
    assert probe.ceiling == pytest.approx(max(row.now.max_tile_fill), abs=0.01)
    assert probe.ceiling_best is not None and probe.ceiling_best.fits
    assert max(probe.ceiling_best.max_tile_fill) <= probe.ceiling + 1e-9
    assert probe.ceiling_speedup == pytest.approx(probe.ceiling_best.throughput
                                                  / row.now.throughput)
    saved = row.best.throughput
    try:
        probe.result.best.throughput = row.now.throughput * 1.5
        probe.ceiling_best.throughput = row.now.throughput * 1.1
        assert probe.flag.startswith("explained") and "claims 1.10x" in probe.flag
        probe.ceiling_best.throughput = row.now.throughput * 1.2
        assert "model error or a named mechanism" in probe.flag
    finally:
        row.best.throughput = saved
    assert [r[1] for r in bench.table_rows([probe])][2].startswith("tune <= ")


def test_every_config_is_a_published_pipeline_with_its_source_copied() -> None:
    points = {p["id"]: p for p in load_points()}
    names = [c["name"] for c in bench.CONFIGS]
    assert len(set(names)) == len(names)
    for cfg in bench.CONFIGS:
        if cfg["point"]:
            assert cfg["source"] == points[cfg["point"]]["source"], cfg["name"]
        options = bench.config_options(cfg)
        assert len(options.splits) >= 1, cfg["name"]  # more than one IPU per replica


def test_a_config_needing_a_missing_package_is_skipped_with_a_reason(monkeypatch) -> None:
    cfg = next(c for c in bench.CONFIGS if "bert" in c["name"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))
    row = bench.run_config(cfg, max_compiles=2)
    assert row.result is None and row.skipped == "needs the optional package transformers"
    assert bench.table_rows([row])[0][:3] == [cfg["name"], "skipped", row.skipped]


def test_an_unknown_config_name_is_a_clear_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--only", "no-such-model"])
    assert exc.value.code == 2
    assert "invalid choice: 'no-such-model'" in capsys.readouterr().err


def test_a_flagged_claim_is_decomposed_into_layout_and_amp(row) -> None:
    program, options = bench.config_program(SMALL), bench.config_options(SMALL)
    bench.decompose(row, program, options, 6)
    assert row.layout_speedup is not None and row.amp_speedup is not None
    # AMP's share: the published splits compiled at the ladder's top AMP, over the published
    top = options.copy()
    top.set_available_memory_proportion(max(bench.AMP_LADDER))
    raised = compile(program, top).summary["throughput"]
    now = compile(program, options).summary["throughput"]
    assert row.amp_speedup == pytest.approx(raised / now, rel=1e-9)
    row.best.throughput, saved = row.now.throughput * 1.2, row.best.throughput
    try:
        assert f"layout at the published AMP {row.layout_speedup:.2f}x" in row.flag
        assert f"on the published splits {row.amp_speedup:.2f}x" in row.flag
        assert json.loads(json.dumps(row.to_dict()))["amp_speedup"] == pytest.approx(
            row.amp_speedup)
    finally:
        row.best.throughput = saved
