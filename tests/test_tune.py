"""The advisor (`popviz tune`) on a ResNet-18 step recorded here at 32x32, batch 2."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import popviz
from popviz.advise.tune import AMP_LADDER, load_program, tune
from popviz.advise.tune_layers import Segments, balanced_bounds, segments, split_positions
from popviz.analysis import pipeline_plan
from popviz.cli.main import main
from popviz.compiler import compile
from popviz.errors import ProfileError
from popviz.format.writer import write_profile, write_report
from popviz.models import build
from popviz.models.training import train_step
from popviz.options import Options
from popviz.recorder import record_program
from popviz.target.machines import register_target
from tests.profiles_util import tiny_meta, tiny_tables

SPLITS = ["b2/0", "b3/0", "b4/0"]


@pytest.fixture(scope="module")
def program():
    torch.manual_seed(0)
    model = build("resnet", 18, num_classes=10, image_size=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    return record_program(train_step, model, opt, x, y, model=model, progress=False)


@pytest.fixture(scope="module")
def options():
    return Options(splits=SPLITS, num_ipus=4, gradient_accumulation=8, recomputation=True,
                   available_memory_proportion={0: 0.3, 1: 0.2}, micro_batch_size=2)


@pytest.fixture(scope="module")
def recorded(program, options, tmp_path_factory):
    report = compile(program, options)
    path = write_report(report, tmp_path_factory.mktemp("r18") / "pipeline")
    return path, report


def test_load_program_round_trip_reproduces_the_stored_tables(program, options, recorded):
    path, report = recorded
    rebuilt, opts = load_program(path)
    assert opts.to_meta() == options.to_meta()
    assert rebuilt.model == program.model
    for got, want in ((rebuilt.ops, program.ops), (rebuilt.tensors, program.tensors)):
        assert got.columns.tolist() == want.columns.tolist()
        pd.testing.assert_frame_equal(got, want.reset_index(drop=True), check_dtype=False)
    again = compile(rebuilt, opts)
    stored = popviz.open(path)
    for name in report.tables:
        pd.testing.assert_frame_equal(again.tables[name].reset_index(drop=True),
                                      stored.table(name).reset_index(drop=True),
                                      check_dtype=False, obj=name)
    assert json.dumps(again.summary, sort_keys=True) == json.dumps(report.summary,
                                                                   sort_keys=True)
    for ipu in range(4):
        np.testing.assert_array_equal(again.arrays["tile_liveness"][ipu],
                                      stored.tile_liveness(ipu))


def test_profiles_without_a_program_are_refused(tmp_path):
    measured = write_profile(tmp_path / "measured", meta=tiny_meta(), tables=tiny_tables(),
                             kind="measured")
    with pytest.raises(ProfileError, match="measured profile holds no recorded program"):
        load_program(measured)
    bare = write_profile(tmp_path / "bare", meta=tiny_meta(), tables=tiny_tables())
    with pytest.raises(ProfileError, match="cannot be rebuilt"):
        load_program(bare)


def test_balanced_bounds_minimise_the_largest_stage_exactly():
    rng = np.random.default_rng(3)
    for trial in range(30):
        n = int(rng.integers(3, 9))
        f, b = rng.uniform(0, 10, n), rng.uniform(0, 20, n)
        segs = Segments([f"s{i}" for i in range(1, n)], [[f"l{i}"] for i in range(n)], f, b,
                        np.zeros(n), rng.uniform(0, 1, n))
        stages = int(rng.integers(2, n + 1))
        rc = bool(trial % 2)

        def worst(bounds: tuple[int, ...], rc: bool = rc, stages: int = stages,
                  segs: Segments = segs, n: int = n) -> float:
            edges = [0, *bounds, n]
            return max(segs.stage_cost(edges[k], edges[k + 1], rc, k == stages - 1)
                       for k in range(stages))

        brute = min(worst(c) for c in itertools.combinations(range(1, n), stages - 1))
        got = balanced_bounds(segs, stages, rc)
        assert len(got) == stages - 1 and got == sorted(set(got))
        assert worst(tuple(got)) == pytest.approx(brute)


def test_the_advice_and_tune_cost_a_layout_with_one_planner(program, options, recorded):
    """The summary's advice reads a stored profile, tune a fresh compile: both go through
    analysis.pipeline_plan, so the same layout gets the same segment and stage costs, and
    those equal the compiled stage table (recompute copies added by the planner's rule)."""
    path, report = recorded
    p = popviz.open(path)
    from_profile = pipeline_plan.segments(p.ops, p.meta)
    from_program = segments(program, report.tables["ops"], options.gradient_accumulation)
    assert from_profile is not None and from_profile.names == from_program.names
    for part in ("forward", "backward", "recompute", "update"):
        np.testing.assert_allclose(getattr(from_profile, part), getattr(from_program, part))
    bounds = from_profile.bounds(SPLITS)
    assert bounds is not None
    st = p.stages.sort_values("stage")
    compiled = (st["forward_cycles_per_microbatch"] + st["recompute_cycles_per_microbatch"]
                + st["backward_cycles_per_microbatch"]
                + st["optimiser_cycles"] / options.gradient_accumulation)
    assert pipeline_plan.stage_costs(from_profile, bounds, True) == pytest.approx(
        compiled.tolist(), rel=1e-6)


def test_recommended_split_balances_better_than_a_bad_one(program, options):
    names, _ = split_positions(program)
    bad = options.copy(splits=names[:3], available_memory_proportion={})
    result = tune(program, bad, 4, max_compiles=20)
    base, best = result.baseline, result.best
    assert best is not None and best.fits and best.num_ipus == 4
    assert max(best.stage_cycles) < 0.8 * max(base.stage_cycles)
    assert best.imbalance < base.imbalance
    assert best.throughput > base.throughput and best.throughput_ratio > 1
    assert result.compiles <= 20
    for c in result.candidates:  # valid names, in forward order
        assert [names.index(s) for s in c.splits] == sorted(names.index(s) for s in c.splits)
    ranked = [c for c in result.candidates if c.fits]
    assert [c.throughput for c in ranked] == sorted((c.throughput for c in ranked),
                                                    reverse=True)


def test_amp_is_the_highest_rung_that_fits(program, options):
    # 120 KiB tiles and micro-batch 64: stage temporaries overflow at AMP 0.6 (96 KiB
    # before code was counted per vertex type: about 10 types x 1 KiB on every tile; 128
    # KiB before 1 x 1 passes ran on PopLibs' 1x1 vertex, whose fastest weight-update
    # plans here are leaner)
    register_target({"base": "mk2", "name": "tune-test-120k", "bytes_per_tile": 120 * 1024},
                    replace=True)
    opts = options.copy(micro_batch_size=64, target="tune-test-120k",
                        available_memory_proportion={})
    assert not compile(program, opts.copy(available_memory_proportion=0.6)).summary["fits"]
    best = tune(program, opts, 4, max_compiles=30).best
    assert best is not None and best.fits
    lowered = [i for i, a in enumerate(best.amp) if a < AMP_LADDER[0]]
    assert lowered, best.amp
    for i in lowered:  # one rung higher on that IPU alone: it no longer fits there
        higher = list(best.amp)
        higher[i] = AMP_LADDER[AMP_LADDER.index(best.amp[i]) - 1]
        trial = opts.copy(splits=best.splits, recomputation=best.recomputation,
                          schedule=best.schedule, available_memory_proportion=higher)
        assert i in compile(program, trial).summary["oom_ipus"]


def test_one_ipu_uses_checkpoints_among_split_names(program, options):
    names, _ = split_positions(program)
    result = tune(program, options, 1, max_compiles=12, top=10)
    assert result.num_ipus == 1 and result.candidates
    assert all(c.num_ipus == 1 and len(c.amp) == 1 for c in result.candidates)
    checkpointed = [c for c in result.candidates if c.recomputation]
    assert checkpointed and all(c.splits and set(c.splits) <= set(names)
                                for c in checkpointed)
    assert any(not c.recomputation and not c.splits for c in result.candidates)


def test_a_tile_fill_ceiling_keeps_headroom_on_every_ipu(program, options):
    free = tune(program, options, 4, max_compiles=12)
    now_fill = max(free.baseline.max_tile_fill)
    assert free.baseline.fits and free.max_tile_fill == 1.0
    # at the current layout's own fullest tile, it still fits, and so does every layout
    # called fitting: none is fuller anywhere
    held = tune(program, options, 4, max_compiles=12, max_tile_fill=now_fill + 1e-6)
    assert held.baseline.fits and held.baseline.throughput == free.baseline.throughput
    fitting = [c for c in held.candidates if c.fits]
    assert fitting and all(max(c.max_tile_fill) <= now_fill + 1e-6 for c in fitting)
    assert any("--max-tile-fill" in n for n in held.notes)
    # the page says the same in its own controls' words, never a command-line flag
    from popviz_app.pages.tune import page_words

    budgeted = tune(program, options, 4, max_compiles=2, max_tile_fill=now_fill + 1e-6)
    assert any("--max-compiles" in n for n in budgeted.notes)
    assert not any("--" in page_words(n) for n in [*held.notes, *budgeted.notes])
    # below it, the current layout no longer fits: its tiles over the ceiling are counted
    # from the tile table, on the IPUs that hold them
    below = tune(program, options, 4, max_compiles=2, max_tile_fill=now_fill * 0.9)
    b = below.baseline
    assert not b.fits and b.oom_tiles > 0
    assert b.oom_ipus == [i for i, f in enumerate(b.max_tile_fill) if f > now_fill * 0.9]
    with pytest.raises(ValueError, match="max-tile-fill"):
        tune(program, options, 4, max_tile_fill=1.2)


def test_a_faster_layout_that_spends_headroom_says_so(program, options):
    from dataclasses import replace

    from popviz.advise.tune import _headroom_note

    now = tune(program, options, 4, max_compiles=2).baseline
    assert now.fits
    fill = max(now.max_tile_fill)
    fuller = replace(now, throughput=now.throughput * 1.2,
                     max_tile_fill=[f + 0.10 for f in now.max_tile_fill])
    note = _headroom_note(fuller, now)
    assert f"--max-tile-fill {math.ceil(fill * 100 - 1e-9) / 100:g} " in note
    assert f"{fill + 0.10:.0%} where the current one stops at {fill:.0%}" in note
    # no note: as full as now (within 5 points), slower, or not fitting
    assert _headroom_note(replace(fuller, max_tile_fill=[f + 0.04 for f in
                                                         now.max_tile_fill]), now) == ""
    assert _headroom_note(replace(fuller, throughput=now.throughput * 0.9), now) == ""
    assert _headroom_note(replace(fuller, fits=False), now) == ""


def test_cli_text_names_the_ceiling(recorded, capsys):
    path, _ = recorded
    assert main(["tune", str(path), "--no-progress", "--max-compiles", "3",
                 "--max-tile-fill", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "does NOT fit (every tile at most 1% full)" in out
    assert "tiles > 1%)" in out


def test_tune_is_deterministic(program, options):
    a = tune(program, options, 2, max_compiles=8).to_dict()
    b = tune(program, options, 2, max_compiles=8).to_dict()
    a.pop("seconds"), b.pop("seconds")
    assert a == b


def test_side_by_side_fits_give_the_same_search(program, options):
    """With two worker processes the independent layouts (and the next moves of the local
    search) are fitted side by side; the search takes the same path, finds the same
    layouts and counts the same compiles as one fit after another."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    class Counted:  # the pool, counting the layouts sent to it
        def __init__(self, pool: ProcessPoolExecutor) -> None:
            self.pool, self.sent, self._max_workers = pool, 0, 2

        def submit(self, *args):  # type: ignore[no-untyped-def]
            self.sent += 1
            return self.pool.submit(*args)

    a = tune(program, options, 2, max_compiles=24).to_dict()
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        counted = Counted(pool)
        b = tune(program, options, 2, max_compiles=24, executor=counted).to_dict()
    a.pop("seconds"), b.pop("seconds")
    assert counted.sent >= 4 and a["compiles"] >= 8 and a == b


class InProcess:
    """An executor that runs each job at once here, in a fresh Search as a worker does:
    the side-by-side path without processes."""

    def __init__(self, width: int, broken: bool = False) -> None:
        self._max_workers, self.sent, self.broken = width, 0, broken

    def submit(self, fn, *args):  # type: ignore[no-untyped-def]
        from concurrent.futures import Future
        from concurrent.futures.process import BrokenProcessPool

        self.sent += 1
        future: Future = Future()
        if self.broken:
            future.set_exception(BrokenProcessPool("a process in the pool was terminated"))
        else:
            future.set_result(fn(*args))
        return future


@pytest.mark.parametrize("budget", [2, 4, 8, 24])
@pytest.mark.parametrize("layout", ["four", "current is balanced"])
def test_side_by_side_stops_at_the_budget_where_one_at_a_time_does(program, options,
                                                                   budget, layout):
    """At every budget the same layouts, compiles and best (a batch runs side by side only
    when the budget holds all of it; moves after the one taken are forgotten), also when
    the current splits are the balanced ones (one layout under two names: fitted once)."""
    if layout != "four":
        options = options.copy(splits=["b3/0"], num_ipus=2, available_memory_proportion={})
    a = tune(program, options, 2, max_compiles=budget).to_dict()
    executor = InProcess(3)
    b = tune(program, options, 2, max_compiles=budget, executor=executor).to_dict()
    a.pop("seconds"), b.pop("seconds")
    assert a == b
    assert executor.sent > 0 or budget < 24  # (a small budget holds no batch)


def test_a_worker_that_dies_is_one_line(program, options):
    with pytest.raises(ProfileError) as err:
        tune(program, options, 2, max_compiles=24, executor=InProcess(2, broken=True))
    assert "a tune worker failed" in str(err.value) and "BrokenProcessPool" in str(err.value)
    assert len(str(err.value).splitlines()) == 1


def test_cli_on_a_local_dask_cluster_gives_the_same_json(recorded, capsys):
    pytest.importorskip("distributed")
    path, _ = recorded
    args = ["tune", str(path), "--ipus", "2", "--json", "--no-progress", "--max-compiles", "12"]
    assert main(args) == 0
    here = json.loads(capsys.readouterr().out)
    assert main([*args, "--scheduler", "local", "--workers", "2"]) == 0
    there = json.loads(capsys.readouterr().out)
    here.pop("seconds"), there.pop("seconds")
    assert here == there


def test_cli_json_has_the_evidence_and_writes_the_best(recorded, tmp_path, capsys):
    path, _ = recorded
    out = tmp_path / "best"
    rc = main(["tune", str(path), "--ipus", "2", "--top", "2", "--json", "--no-progress",
               "--max-compiles", "15", "--write", str(out), "--write-now", str(tmp_path / "now")])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_ipus"] == 2 and data["compiles"] <= 15 and 1 <= len(data["candidates"]) <= 2
    fields = {"splits", "amp", "recomputation", "schedule", "fits", "throughput",
              "throughput_per_ipu", "step_ms", "idle_fraction", "peak_bytes", "stage_cycles",
              "max_tile_fill", "throughput_ratio", "throughput_per_ipu_ratio", "train_args"}
    assert fields <= set(data["baseline"])
    best = data["candidates"][0]
    assert fields <= set(best)
    assert len(best["splits"]) == 1 and len(best["amp"]) == len(best["peak_bytes"]) == 2
    assert data["baseline"]["num_ipus"] == 4
    assert best["throughput_ratio"] == pytest.approx(
        best["throughput"] / data["baseline"]["throughput"])
    written = popviz.open(data["written"])
    assert written.meta["options"]["splits"] == best["splits"]
    assert written.summary["throughput"] == pytest.approx(best["throughput"])
    now = popviz.open(data["written_now"])
    assert now.meta["options"]["splits"] == SPLITS
    assert now.summary["throughput"] == pytest.approx(data["baseline"]["throughput"])


@pytest.mark.parametrize(("args", "code", "message"), [
    (["--ipus", "99"], 2, "needs 98 split points"),
    (["--ipus", "0"], 2, "--ipus must be >= 1"),
    (["--amp-ladder", "0.5", "1.5"], 2, "AMP ladder values must be in (0, 1]"),
    (["--amp-steps", "0.2", "0"], 2, "--amp-steps: every value must be in (0, 1]"),
    (["--max-tile-fill", "1.5"], 2, "--max-tile-fill must be in (0, 1]"),
    (["--max-tile-fill", "0"], 2, "--max-tile-fill must be in (0, 1]"),
    (["--target", "h100", "--max-tile-fill", "0.5"], 2, "--max-tile-fill is an IPU option"),
    (["--workers", "-1"], 2, "--workers must be >= 0, got -1"),
    (["--scheduler", "nowhere"], 2, "--scheduler must be none, local or a scheduler's"),
])
def test_cli_usage_errors(recorded, capsys, args, code, message):
    path, _ = recorded
    assert main(["tune", str(path), "--no-progress", *args]) == code
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cli_measured_profile_is_a_one_line_error(tmp_path, capsys):
    measured = write_profile(tmp_path / "m", meta=tiny_meta(), tables=tiny_tables(),
                             kind="measured")
    assert main(["tune", str(measured), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert "no recorded program" in err and len(err.splitlines()) == 1


def test_bundled_profile_program_round_trip():
    """The bundled ResNet-50 pipeline: its program and placement come back exactly (the
    cycle columns follow the cost model, which may be newer than the file)."""
    stored = popviz.open(Path(__file__).resolve().parents[1] / "profiles" / "rn50_pipeline")
    program, opts = load_program(stored)
    assert opts.splits == ["b1/2/relu", "b2/3/relu", "b3/3/relu"] and opts.recomputation
    again = compile(program, opts)
    # a profile written before a column existed (kernel_path) compares on the ones it has
    placed = [c for c in [*program.ops.columns, "stage", "section", "source_op", "ipu"]
              if c in stored.ops.columns]
    pd.testing.assert_frame_equal(again.tables["ops"][placed], stored.ops[placed],
                                  check_dtype=False)
    pd.testing.assert_frame_equal(again.tables["tensors"], stored.tensors, check_dtype=False)


def test_one_ipu_puts_every_block_in_one_stage():
    """A model annotated with Blocks on IPUs 0-3 re-planned for one IPU: the candidate
    without checkpoints is one stage on one IPU, not the Blocks' own four IPUs."""
    torch.manual_seed(0)
    model = build("tutorial", None, num_classes=10, image_size=28)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    tutorial = record_program(train_step, model, opt, x, y, model=model, progress=False)
    result = tune(tutorial, Options(gradient_accumulation=4), 1, max_compiles=10, top=10)
    assert result.baseline.num_ipus == 4
    assert all(c.num_ipus == 1 and len(c.stage_cycles) == 1 for c in result.candidates)
    plain = [c for c in result.candidates if not c.recomputation]
    assert len(plain) == 1 and plain[0].splits == [] and plain[0].fits
    assert result.best is plain[0]  # it fits, so not recomputing is fastest


def test_cli_text_gives_each_layout_as_flags_and_python(recorded, capsys):
    """The Python lines printed for a layout set the same Options as its train.py flags."""
    path, _ = recorded
    assert main(["tune", str(path), "--ipus", "2", "--top", "2", "--no-progress",
                 "--max-compiles", "15"]) == 0
    text = capsys.readouterr().out
    assert "Each layout as train.py flags and as Python" in text
    plans = text.split("Each layout as train.py flags and as Python")[1]
    assert plans.count("train.py ... --shards") >= 2
    # run the Python of the best layout and compare with the candidate
    rc = main(["tune", str(path), "--ipus", "2", "--top", "1", "--no-progress",
               "--max-compiles", "15", "--json"])
    assert rc == 0
    best = json.loads(capsys.readouterr().out)["candidates"][0]
    scope = {"popviz": popviz}
    exec("\n".join(best["python"]), scope)
    options = scope["options"]
    assert options.num_ipus == 2 and options.splits == best["splits"]
    assert options.recomputation == best["recomputation"]
    assert options.schedule == best["schedule"]
    assert [options.amp_for(i) for i in range(2)] == pytest.approx(best["amp"])
    assert all(line in plans for line in best["python"])
    # the gradient accumulation it was planned with is stated: train.py's own default for
    # a pipeline (2 x shards) would give another throughput
    with popviz.open(path) as recorded_profile:
        planned = recorded_profile.meta["options"]["gradient_accumulation"]
    assert options.gradient_accumulation == best["gradient_accumulation"] == planned
    assert f"--gradient-accumulation {planned}" in best["train_args"]


def test_text_says_keep_the_layout_when_nothing_faster_fits(program, options):
    """A fitting current layout is kept when the best other one is not faster; a faster
    one is the 'Best'."""
    import dataclasses

    from popviz.reporters.tune import _render_text

    r = tune(program, options, 4, max_compiles=6)
    assert r.baseline.fits and r.best is not None
    slower = dataclasses.replace(r.best, throughput_ratio=0.99, throughput_per_ipu_ratio=0.5)
    text = _render_text(dataclasses.replace(r, candidates=[slower]), "r18", "pipelined")
    assert "Keep the current layout: no faster one was found" in text
    assert "\nBest:" not in text
    faster = dataclasses.replace(r.best, throughput_ratio=1.2, throughput_per_ipu_ratio=1.2)
    text = _render_text(dataclasses.replace(r, candidates=[faster]), "r18", "pipelined")
    assert "\nBest: 1.20x the current throughput" in text and "Keep the current" not in text
