"""measure: real 2-rank gloo pipelines of the tutorial CNN on torch.distributed.pipelining,
the rank files, `popviz merge`, and the app on a merged measured profile."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import popviz
from popviz.cli.main import main
from popviz.measure import tables
from popviz.measure.runner import MeasureConfig, measure
from popviz.measure.split import check_splits, default_splits

MICRO, MICROBATCHES, STEPS = 2, 4, 2


def _run(root: Path, schedule: str) -> Path:
    out = root / schedule
    paths = measure(MeasureConfig(model="tutorial", ranks=2, microbatches=MICROBATCHES,
                                  micro_batch_size=MICRO, schedule=schedule, steps=STEPS,
                                  profile_dir=str(out), merge=str(out / "merged")))
    assert [p.relative_to(out).as_posix() for p in paths] == \
        ["rank0/profile.h5", "rank1/profile.h5"]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("measure")
    return {s: _run(root, s) for s in ("1F1B", "GPipe", "Interleaved1F1B")}


@pytest.fixture(scope="module")
def merged(runs: dict[str, Path]) -> Any:
    with popviz.open(runs["1F1B"] / "merged") as profile:
        yield profile


def test_rank_files_are_measured_profiles_of_one_rank(runs: dict[str, Path]) -> None:
    for rank in (0, 1):
        with popviz.open(runs["1F1B"] / f"rank{rank}") as p:
            assert p.kind == "measured" and p.meta["measure"]["rank"] == rank
            assert set(p.trace["ipu"]) == {rank}
            assert p.meta["target"] == {"name": "cpu-gloo", "num_ipus": 2, "tiles_per_ipu": 1,
                                        "bytes_per_tile": 0, "clock_hz": 1e9}
            assert p.meta["options"]["schedule"] == "1F1B"
            assert p.meta["options"]["microbatches"] == MICROBATCHES
            assert p.tile_memory.empty  # no tiles on a CPU rank (docs/measure.md)


def test_merged_profile_has_every_microbatch_on_both_ranks(merged: Any) -> None:
    trace = merged.trace
    assert merged.kind == "measured" and merged.meta["measure"]["ranks"] == [0, 1]
    assert merged.meta["ranks"] == [0, 1] and merged.meta["target"]["num_ipus"] == 2
    assert sorted(trace["ipu"].unique()) == [0, 1]
    compute = trace[trace["kind"] == "compute"]
    for rank in (0, 1):
        for step in range(STEPS):
            on = compute[(compute["ipu"] == rank) & (compute["step"] == step)]
            for pass_ in ("F", "B"):
                assert sorted(on.loc[on["pass"] == pass_, "microbatch"].unique()) == \
                    list(range(MICROBATCHES)), (rank, step, pass_)
            assert (on["pass"] == "WU").any()
    assert len(merged.meta["measure"]["losses"]) == 1 + STEPS  # warm-up step too
    assert all(0 < loss < 10 for loss in merged.meta["measure"]["losses"])


def test_compute_follows_the_schedule_order(runs: dict[str, Path]) -> None:
    """The timed actions come in the order torch's schedules run them."""
    expected = {
        "1F1B": {0: "F0 F1 B0 F2 B1 F3 B2 B3", 1: "F0 B0 F1 B1 F2 B2 F3 B3"},
        "GPipe": {r: "F0 F1 F2 F3 B0 B1 B2 B3" for r in (0, 1)},
    }
    for schedule, orders in expected.items():
        with popviz.open(runs[schedule] / "merged") as p:
            comp = p.trace[(p.trace["kind"] == "compute") & p.trace["pass"].isin(["F", "B"])
                           & (p.trace["op"] != "loss")]
            for (rank, _step), events in comp.groupby(["ipu", "step"]):
                got = " ".join(f"{r.pass_}{r.microbatch}" for r in events.sort_values(
                    "start").rename(columns={"pass": "pass_"}).itertuples())
                assert got == orders[rank], (schedule, rank)


def test_no_two_events_of_one_rank_overlap(merged: Any) -> None:
    for _rank, events in merged.trace.groupby("ipu"):
        events = events.sort_values("start")
        assert (events["end"] >= events["start"]).all()
        assert (events["start"].to_numpy()[1:] >= events["end"].to_numpy()[:-1]).all()


def test_sends_on_rank0_match_recvs_on_rank1(merged: Any) -> None:
    ex = merged.trace[(merged.trace["kind"] == "exchange") & (merged.trace["bytes"] > 0)]
    key = ["step", "microbatch"]
    sent = ex[(ex["ipu"] == 0) & ex["op"].str.startswith("send")].set_index(key)["bytes"]
    got = ex[(ex["ipu"] == 1) & ex["op"].str.startswith("recv")].set_index(key)["bytes"]
    assert len(sent) == STEPS * MICROBATCHES
    pd.testing.assert_series_equal(sent.sort_index(), got.sort_index())
    # B2's output: 20 channels of 4x4 float32 per sample
    assert set(sent) == {MICRO * 20 * 4 * 4 * 4}
    # the exchange table holds each transfer once: activations 0->1, gradients 1->0
    table = merged.exchange
    assert len(table) == 2 * STEPS * MICROBATCHES
    assert set(zip(table["src"], table["dst"], table["kind"])) == \
        {(0, 1, "activation"), (1, 0, "gradient")}
    assert (table["end"] >= table["start"]).all()


def test_waiting_is_separated_from_transfer(merged: Any) -> None:
    p2p = merged.table("p2p")
    assert p2p["matched"].all()
    blocked = p2p["wait_end"] - p2p["wait_start"]
    assert (p2p["waiting_ns"] + p2p["transfer_ns"] == blocked).all()
    expected = (p2p["peer_post"] - p2p["wait_start"]).clip(lower=0).clip(upper=blocked)
    assert (p2p["waiting_ns"] == expected).all()
    # one clock for both ranks: no data arrives before its sender posted it
    recv = p2p[p2p["direction"] == "recv"]
    assert (recv["wait_end"] >= recv["peer_post"]).all()
    # causality on one clock: rank 1 cannot receive micro-batch 0 before rank 0 has
    # computed its forward (whether rank 1 waited depends on when the OS ran it)
    first = p2p[(p2p["rank"] == 1) & (p2p["direction"] == "recv") & (p2p["microbatch"] == 0)
                & (p2p["step"] == 0)]
    trace = merged.trace
    forward0 = trace[(trace["ipu"] == 0) & (trace["kind"] == "compute")
                     & (trace["pass"] == "F") & (trace["microbatch"] == 0)]
    assert len(first) == 1 and len(forward0)
    assert int(first["wait_end"].iloc[0]) >= int(forward0["end"].min())
    idle = merged.trace[merged.trace["kind"] == "idle"]
    assert idle["op"].str.startswith("wait: ").all() and len(idle) > 0
    stages = merged.stages.set_index("stage")
    per_step = idle.assign(d=idle["end"] - idle["start"]).groupby("stage")["d"].sum() / STEPS
    per_step = per_step.reindex(stages.index, fill_value=0.0)
    assert stages["idle_cycles"].to_dict() == pytest.approx(per_step.to_dict())


def test_stash_follows_the_schedule(runs: dict[str, Path]) -> None:
    """1F1B keeps (stages - stage) micro-batches in flight, GPipe all of them; interleaved
    1F1B puts 2 stages on each rank (stage i on rank i mod 2) and keeps 4 - stage."""
    depth = {}
    for schedule, out in runs.items():
        with popviz.open(out / "merged") as p:
            stages = p.stages.sort_values("stage")
            depth[schedule] = stages["stash_depth"].tolist()
            assert stages["ipu"].tolist() == [s % 2 for s in stages["stage"]]
            live = p.liveness
            assert (live["always_live_bytes"] > 0).all()
            if schedule != "Interleaved1F1B":  # one stage per rank: its stash is the curve
                rank0 = live[live["ipu"] == 0]
                assert rank0["not_always_live_bytes"].max() == stages["stash_bytes"].iloc[0]
            compute = p.trace[p.trace["kind"] == "compute"]
            for stage in stages["stage"]:  # every stage runs F and B for every micro-batch
                on = compute[(compute["stage"] == stage) & (compute["step"] == 0)]
                assert sorted(on.loc[on["pass"] == "B", "microbatch"]) == \
                    list(range(MICROBATCHES)), (schedule, stage)
    assert depth == {"1F1B": [2, 1], "GPipe": [MICROBATCHES, MICROBATCHES],
                     "Interleaved1F1B": [4, 3, 2, 1]}


def test_stashes_are_the_variables_live_at_each_step(merged: Any) -> None:
    """Clicking a liveness step lists the micro-batch stashes held there; on the first
    stage (no loss added after its forward) they add up to the curve."""
    from popviz.analysis.liveness import variables_live_at

    live = merged.liveness[merged.liveness["ipu"] == 0]
    variables = merged.variables
    assert set(variables["category"]) == {"stash"}
    assert len(variables[variables["ipu"] == 0]) == STEPS * MICROBATCHES
    for row in live.itertuples(index=False):
        held = variables_live_at(variables, 0, int(row.step))
        assert int(held["bytes"].sum()) == int(row.not_always_live_bytes), row.label
        assert len(held) == int(row.stashed_microbatches)


def test_summary_cli_on_merged_profile(runs: dict[str, Path], capsys: Any) -> None:
    import json

    assert main(["summary", "--json", str(runs["1F1B"] / "merged")]) == 0
    facts = json.loads(capsys.readouterr().out)
    # a rank has no tiles: whether it fits is unknown, not "yes"
    assert facts["kind"] == "measured" and facts["num_ipus"] == 2 and facts["fits"] is None
    assert facts["step_ns"] > 0 and facts["throughput"] > 0
    assert len(facts["stages"]) == 2
    assert main(["summary", str(runs["1F1B"] / "merged")]) == 0
    out = capsys.readouterr().out
    assert "cpu-gloo x2" in out and "fits: unknown" in out


def _one_error(capsys: Any) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_merge_cli_and_its_errors(runs: dict[str, Path], tmp_path: Path, capsys: Any) -> None:
    one, other = runs["1F1B"], runs["GPipe"]
    out = tmp_path / "m.h5"
    assert main(["merge", str(one / "rank0"), str(one / "rank1"), "--out", str(out)]) == 0
    capsys.readouterr()
    with popviz.open(out) as p, popviz.open(one / "merged") as q:
        assert len(p.trace) == len(q.trace) and p.summary["ranks"] == [0, 1]
    # a directory holding an earlier merge of the run still merges
    assert main(["merge", str(one), "--out", str(tmp_path / "again")]) == 0
    capsys.readouterr()
    cases = {
        "missing": [str(one / "rank0")],
        "another run": [str(one / "rank0"), str(other / "rank1")],
        "modelled": [str(one / "rank0"), str(one / "rank1"), _modelled(tmp_path)],
        "given twice": [str(one / "rank0"), str(one / "rank1"), _copy(one, tmp_path)],
        "already merged": [str(one / "merged" / "profile.h5")],
    }
    for why, inputs in cases.items():
        assert main(["merge", *inputs, "--out", str(tmp_path / "bad.h5")]) == 1, why
        assert why in _one_error(capsys)
    assert not (tmp_path / "bad.h5").exists()


def _modelled(tmp_path: Path) -> str:
    from popviz.format import write_report
    from popviz.testing.synthetic import synthetic_report

    return str(write_report(synthetic_report(num_ipus=2, events=50, steps=5),
                            tmp_path / "modelled.h5"))


def _copy(run: Path, tmp_path: Path) -> str:
    dup = tmp_path / "dup.h5"
    shutil.copy(run / "rank1" / "profile.h5", dup)
    return str(dup)


def test_app_pages_render_the_measured_profile(runs: dict[str, Path], tmp_path: Path) -> None:
    from popviz_app import create_app, render
    from popviz_app.pages import PAGES

    shutil.copy(runs["1F1B"] / "merged" / "profile.h5", tmp_path / "m.h5")
    app = create_app(tmp_path)
    for page in [p for p in PAGES if p.NEEDS_PROFILE]:
        body = render(app.popviz_context, page.PATH, "?profile=m.h5")[1]
        assert "message error" not in repr(body), page.PATH
    trace = next(c for c in _walk(render(app.popviz_context, "/trace", "?profile=m.h5")[1])
             if type(c).__name__ == "Graph").figure
    assert trace.layout.xaxis.title.text == "time (ns)" and len(trace.data) > 0
    live = [c for c in _walk(render(app.popviz_context, "/liveness", "?profile=m.h5")[1])
            if type(c).__name__ == "Graph"]
    assert live and len(live[0].figure.data) > 0


def _walk(component: Any) -> list[Any]:
    children = getattr(component, "children", None)
    kids = children if isinstance(children, (list, tuple)) else \
        [] if children is None or isinstance(children, (str, int, float)) else [children]
    return [component, *[c for k in kids for c in _walk(k)]]


# ---- fast, no processes ----
def test_p2p_split_at_the_peers_post() -> None:
    def rec(rank: int, direction: str, post: int, ws: int, we: int) -> dict[str, Any]:
        return {"rank": rank, "peer": 1 - rank, "direction": direction, "kind": "activation",
                "stage": rank, "microbatch": 0, "step": 0, "seq": 0, "bytes": 64,
                "post": post, "post_end": post + 1, "wait_start": ws, "wait_end": we,
                "batch": 1, "works": 1}

    send, recv = rec(0, "send", 500, 510, 520), rec(1, "recv", 100, 110, 600)
    got = tables.match_p2p([recv], [send, recv]).iloc[0]
    assert (got["waiting_ns"], got["transfer_ns"], got["peer_post"]) == (390, 100, 500)
    got = tables.match_p2p([send], [send, recv]).iloc[0]  # receiver was already posted
    assert (got["waiting_ns"], got["transfer_ns"]) == (0, 10)
    lonely = tables.match_p2p([recv], [recv]).iloc[0]
    assert not lonely["matched"] and lonely["waiting_ns"] == 0
    trace = tables.trace_table([], tables.match_p2p([recv], [send, recv]))
    assert trace["kind"].tolist() == ["exchange", "idle", "exchange"]  # post, wait, data
    assert trace["end"].tolist() == [101, 500, 600]


def test_splits_and_config_errors(capsys: Any) -> None:
    from popviz import models
    from popviz.measure.__main__ import main as measure_main

    tutorial = models.build("tutorial")
    assert default_splits(tutorial, 2) == ["B3"]
    assert default_splits(tutorial, 4) == ["B2", "B3", "B4"]
    assert check_splits(tutorial, ["B4", "B2", "B3"], 4) == ["B2", "B3", "B4"]
    with pytest.raises(ValueError, match="valid names: B2, B3, B4"):
        check_splits(tutorial, ["B9"], 2)
    with pytest.raises(ValueError, match="2 stages need 1 split"):
        check_splits(tutorial, ["B2", "B3"], 2)
    # errors a user can cause end before any process starts, in one line, exit 2
    for argv, why in ((["--pipeline-splits", "B7"], "unknown split name"),
                      (["--microbatches", "1"], "at least 2 micro-batches"),
                      (["--schedule", "Interleaved1F1B", "--microbatches", "3"],
                       "at least 4 micro-batches")):
        assert measure_main(argv) == 2
        assert why in _one_error(capsys)


def test_committed_example_is_made_by_the_makefile_line() -> None:
    root = Path(__file__).resolve().parents[1]
    with popviz.open(root / "profiles" / "tutorial_measured_2ranks") as p:
        assert p.kind == "measured" and p.meta["measure"]["ranks"] == [0, 1]
        assert p.path.stat().st_size < 1e6
        command = p.command_line.split(" --profile-dir ")[0]
    assert command.startswith("python -m popviz.measure --model tutorial --ranks 2")
    makefile = (root / "Makefile").read_text()
    assert f"$(PY) -m {command.removeprefix('python -m ')} --profile-dir" in makefile
    assert "--merge profiles/tutorial_measured_2ranks" in makefile


def test_train_py_measure_flags_map_to_a_pipeline(monkeypatch: Any, tmp_path: Path,
                                                  capsys: Any) -> None:
    """train.py --measure: the CNN app's flags become the real pipeline's shape (the run
    itself is replaced here; the runs above cover it)."""
    import importlib.util

    from popviz.measure import runner, train_flags

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("popviz_train_measure", root / "train.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    seen: list[MeasureConfig] = []
    monkeypatch.setattr(runner, "measure", lambda config: seen.append(config.validate()))
    monkeypatch.setattr(train_flags, "run_from_train_args", lambda args: runner.measure(
        train_flags.config_from_train_args(args)) or 0)
    out = str(tmp_path / "p")
    assert script.main(["--model", "resnet", "--model-size", "18", "--shards", "2",
                        "--pipeline", "--pipeline-splits", "b3/0", "--pipeline-schedule",
                        "Grouped", "--gradient-accumulation-count", "6", "--batch-size", "3",
                        "--iterations", "2", "--measure", "--profile-dir", out]) == 0
    config = seen[0]
    assert (config.model, config.model_size, config.ranks, config.schedule) == \
        ("resnet", 18, 2, "GPipe")
    assert (config.microbatches, config.micro_batch_size, config.steps, config.splits) == \
        (6, 3, 2, ["b3/0"])
    assert config.merge == out and config.profile_dir == str(Path(out, "ranks"))
    assert script.main(["--measure", "--batch-size", "4", "--gradient-accumulation", "4",
                        "--profile-dir", out]) == 0
    assert seen[1].ranks == 4 and seen[1].splits == ["B2", "B3", "B4"]  # the tutorial's blocks
    assert script.main(["--model", "resnet", "--model-size", "18", "--measure"]) == 2
    assert "--shards N >= 2" in _one_error(capsys)
    assert script.main(["--model", "resnet", "--model-size", "18", "--shards", "2",
                        "--pipeline", "--pipeline-splits", "b3/0", "--pipeline-schedule",
                        "Sequential", "--measure"]) == 2
    assert "Sequential has no torch.distributed.pipelining schedule" in _one_error(capsys)
