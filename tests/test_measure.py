"""measure: real 2-rank gloo pipelines of the tutorial CNN on torch.distributed.pipelining,
timed by torch.profiler and read through the importer's path (popviz.ingest); the profile
rank 0 writes equals `popviz import` of the traces the run saved; the app on it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import popviz
from popviz.cli.main import main
from popviz.ingest import clocks, p2p, waits
from popviz.measure.launch import measure
from popviz.measure.runner import MeasureConfig
from popviz.measure.split import check_splits, default_splits

MICRO, MICROBATCHES, STEPS = 2, 4, 2


def _run(root: Path, schedule: str) -> Path:
    out = root / schedule
    paths = measure(MeasureConfig(model="tutorial", ranks=2, microbatches=MICROBATCHES,
                                  micro_batch_size=MICRO, schedule=schedule, steps=STEPS,
                                  profile_dir=str(out)))
    assert paths == [out / "profile.h5"]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("measure")
    return {s: _run(root, s) for s in ("1F1B", "GPipe", "Interleaved1F1B")}


@pytest.fixture(scope="module")
def merged(runs: dict[str, Path]) -> Any:
    with popviz.open(runs["1F1B"]) as profile:
        yield profile


def test_one_profile_from_every_rank_and_a_trace_per_rank(runs: dict[str, Path]) -> None:
    """Rank 0 writes the one profile; each rank leaves only its torch.profiler trace."""
    out = runs["1F1B"]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == \
        ["profile.h5", "traces/rank0.json", "traces/rank1.json"]
    with popviz.open(out) as p:
        assert p.kind == "measured" and p.meta["measure"]["ranks"] == [0, 1]
        assert p.meta["measure"]["live"] is True and p.meta["measure"]["imported"] is False
        assert p.meta["target"] == {"name": "cpu-gloo", "num_ipus": 2, "tiles_per_ipu": 1,
                                    "bytes_per_tile": 0, "clock_hz": 1e9}
        assert p.meta["options"]["schedule"] == "1F1B"
        assert p.meta["measure"]["schedule_seen"] is None  # Schedule1F1B annotates nothing
        assert p.meta["options"]["microbatches"] == MICROBATCHES
        assert p.meta["measure"]["clock_sync"]["one_host"] is True
        assert p.tile_memory.empty  # no tiles on a CPU rank (docs/measure.md)


def test_every_microbatch_on_both_ranks_in_every_step(merged: Any) -> None:
    trace = merged.trace
    assert merged.meta["ranks"] == [0, 1] and merged.meta["target"]["num_ipus"] == 2
    assert sorted(trace["ipu"].unique()) == [0, 1]
    compute = trace[trace["kind"] == "compute"]
    assert sorted(compute["step"].unique()) == list(range(STEPS))  # ProfilerStep#N
    for rank in (0, 1):
        for step in range(STEPS):
            on = compute[(compute["ipu"] == rank) & (compute["step"] == step)]
            for pass_ in ("F", "B"):
                mbs = on.loc[(on["pass"] == pass_) & (on["microbatch"] >= 0), "microbatch"]
                assert sorted(mbs.unique()) == list(range(MICROBATCHES)), (rank, step, pass_)
            assert (on["pass"] == "WU").any()
    assert (merged.stages["steps"] == STEPS).all()
    assert len(merged.meta["measure"]["losses"]) == 1 + STEPS  # warm-up step too
    assert all(0 < loss < 10 for loss in merged.meta["measure"]["losses"])


def _order(events: pd.DataFrame) -> str:
    """F / B and micro-batch of a rank's compute, each run of one action once."""
    events = events[(events["microbatch"] >= 0) & events["pass"].isin(["F", "B"])]
    seq = (events.sort_values("start")["pass"] + events["microbatch"].astype(str)).tolist()
    return " ".join(a for i, a in enumerate(seq) if i == 0 or seq[i - 1] != a)


def test_compute_follows_the_schedule_order(runs: dict[str, Path]) -> None:
    """The first stage's actions come in the order torch's schedules run them; on every
    rank a micro-batch's forward starts before its backward."""
    expected = {"1F1B": "F0 F1 B0 F2 B1 F3 B2 B3", "GPipe": "F0 F1 F2 F3 B0 B1 B2 B3"}
    for schedule, order in expected.items():
        with popviz.open(runs[schedule]) as p:
            comp = p.trace[p.trace["kind"] == "compute"]
            for (rank, _step), events in comp.groupby(["ipu", "step"]):
                got = _order(events)
                if rank == 0:  # (ops after the schedule, outside any annotation, may
                    # take the next micro-batch 0: docs/import.md, Limits)
                    assert got.split()[:8] == order.split(), schedule
                words = got.split()
                for mb in range(MICROBATCHES):
                    assert words.index(f"F{mb}") < words.index(f"B{mb}"), (schedule, rank)


def test_sends_on_rank0_match_recvs_on_rank1(merged: Any) -> None:
    ex = merged.trace[(merged.trace["kind"] == "exchange") & (merged.trace["bytes"] > 0)]
    key = ["step", "microbatch"]
    sent = ex[(ex["ipu"] == 0) & ex["op"].str.startswith("send")].set_index(key)["bytes"]
    got = ex[(ex["ipu"] == 1) & ex["op"].str.startswith("recv")].set_index(key)["bytes"]
    assert len(sent) == STEPS * MICROBATCHES
    pd.testing.assert_series_equal(sent.sort_index(), got.sort_index())
    # B2's output: 20 channels of 4x4 float32 per sample
    assert set(sent) == {MICRO * 20 * 4 * 4 * 4}
    assert merged.stages.set_index("stage").loc[0, "boundary_bytes"] == MICRO * 20 * 4 * 4 * 4
    # the exchange table holds each transfer once: activations 0->1, gradients 1->0
    table = merged.exchange
    assert len(table) == 2 * STEPS * MICROBATCHES
    assert set(zip(table["src"], table["dst"], table["kind"])) == \
        {(0, 1, "activation"), (1, 0, "gradient")}
    assert (table["end"] >= table["start"]).all()


def test_waiting_is_separated_from_transfer(merged: Any) -> None:
    table = merged.table("p2p")
    assert table["matched"].all() and len(table) == 4 * STEPS * MICROBATCHES
    blocked = table["end"] - table["post"]
    assert (table["waiting_ns"] + table["transfer_ns"] == blocked).all()
    expected = (table["peer_post"] - table["post"]).clip(lower=0).clip(upper=blocked)
    assert (table["waiting_ns"] == expected).all()
    # one clock for both ranks: no data arrives before its sender posted it
    recv = table[table["direction"] == "recv"]
    assert (recv["end"] >= recv["peer_post"]).all()
    # causality on one clock: rank 1 cannot receive micro-batch 0 before rank 0 has
    # started its forward
    first = recv[(recv["rank"] == 1) & (recv["microbatch"] == 0) & (recv["step"] == 0)]
    trace = merged.trace
    forward0 = trace[(trace["ipu"] == 0) & (trace["kind"] == "compute") & (trace["step"] == 0)
                     & (trace["pass"] == "F") & (trace["microbatch"] == 0)]
    assert len(first) == 1 and len(forward0)
    assert int(first["end"].iloc[0]) >= int(forward0["start"].min())
    idle = trace[trace["kind"] == "idle"]
    assert len(idle) > 0 and idle["op"].str.startswith("wait: ").all()


def test_interleaved_stages_and_liveness(runs: dict[str, Path]) -> None:
    """Interleaved 1F1B puts 2 stages on each rank (stage i on rank i mod 2), each running
    F and B for every micro-batch; liveness comes from torch.profiler's memory events."""
    with popviz.open(runs["Interleaved1F1B"]) as p:
        stages = p.stages.sort_values("stage")
        assert stages["stage"].tolist() == [0, 1, 2, 3]
        assert stages["ipu"].tolist() == [s % 2 for s in stages["stage"]]
        assert p.meta["options"]["schedule"] == "Interleaved1F1B"
        assert p.meta["measure"]["schedule_seen"] == "Interleaved1F1B"  # its PP: actions
        compute = p.trace[p.trace["kind"] == "compute"]
        for stage in stages["stage"]:
            on = compute[(compute["stage"] == stage) & (compute["step"] == 0)]
            assert sorted(on.loc[on["pass"] == "B", "microbatch"].unique()) == \
                list(range(MICROBATCHES)), stage
        assert (p.liveness["not_always_live_bytes"] > 0).any()


def test_interleaved_stage_boundaries_are_stages_not_ranks(runs: dict[str, Path]) -> None:
    """Two ranks, four stages: /exchange's rank matrix has one link each way, its stage
    links the three boundaries, each with every micro-batch of every step once, and
    together they carry what the exchange table does."""
    from popviz.analysis.exchange import stage_links

    with popviz.open(runs["Interleaved1F1B"]) as p:
        links, exchange = stage_links(p.table("p2p"), p.exchange), p.exchange
    assert [(r.src_stage, r.dst_stage, r.kind) for r in links.itertuples()] == [
        (0, 1, "activation"), (1, 0, "gradient"), (1, 2, "activation"),
        (2, 1, "gradient"), (2, 3, "activation"), (3, 2, "gradient")]
    assert (links["transfers"] == MICROBATCHES * STEPS).all()
    assert links["bytes"].sum() == exchange["bytes"].sum()
    assert links["transfer_ns"].sum() == exchange["transfer_ns"].sum()
    assert set(zip(exchange["src"].astype(str), exchange["dst"].astype(str))) == \
        {("0", "1"), ("1", "0")}


def test_live_run_equals_the_import_of_its_traces(runs: dict[str, Path],
                                                   tmp_path: Path) -> None:
    """One measured path: `popviz import` of the traces the live run saved gives the live
    profile's tables (the run adds only what it knows beyond them: stage layers)."""
    for schedule in ("1F1B", "Interleaved1F1B"):
        out = runs[schedule]
        traces = sorted(str(t) for t in (out / "traces").glob("rank*.json"))
        assert main(["import", *traces, "--to", str(tmp_path / schedule)]) == 0
        with popviz.open(out) as live, popviz.open(tmp_path / schedule) as imported:
            assert set(live.table_names) == set(imported.table_names)
            for name in sorted(live.table_names):
                a, b = live.table(name), imported.table(name)
                if name == "stages":
                    a, b = (t.drop(columns=["first_layer", "last_layer"]) for t in (a, b))
                pd.testing.assert_frame_equal(a, b, obj=f"{schedule} {name}")
            assert live.meta["measure"]["origin_ns"] == imported.meta["measure"]["origin_ns"]
            assert live.stages["first_layer"].tolist()[0] == "B1"


def test_summary_cli_on_the_profile(runs: dict[str, Path], capsys: Any) -> None:
    import json

    assert main(["summary", "--json", str(runs["1F1B"])]) == 0
    facts = json.loads(capsys.readouterr().out)
    # a rank has no tiles: whether it fits is unknown, not "yes"
    assert facts["kind"] == "measured" and facts["num_ipus"] == 2 and facts["fits"] is None
    assert facts["step_ns"] > 0 and facts["throughput"] > 0
    assert facts["samples_per_step"] == MICRO * MICROBATCHES and facts["recorded_steps"] == 2
    assert len(facts["stages"]) == 2
    assert main(["summary", str(runs["1F1B"])]) == 0
    out = capsys.readouterr().out
    assert "cpu-gloo x2" in out and "fits: unknown" in out


def _one_error(capsys: Any) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_app_pages_render_the_measured_profile(runs: dict[str, Path], tmp_path: Path) -> None:
    from popviz_app import create_app, render
    from popviz_app.pages import PAGES

    shutil.copy(runs["1F1B"] / "profile.h5", tmp_path / "m.h5")
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
def _calls(rank: int, direction: str, start: int, end: int, nbytes: int = 64) -> pd.DataFrame:
    return pd.DataFrame({"rank": [rank], "direction": [direction], "peer": [1 - rank],
                         "start": [start], "end": [end], "bytes": [nbytes], "stage": [rank],
                         "pass": ["F"], "microbatch": [0], "seq": [0], "step": [0]})


def test_p2p_split_at_the_peers_post() -> None:
    send, recv = _calls(0, "send", 500, 520), _calls(1, "recv", 100, 600)
    table = waits.p2p_table(p2p.match_p2p([send, recv])).set_index("rank")
    # the recv waits until the send is posted, then the data moves
    assert (table.loc[1, "waiting_ns"], table.loc[1, "transfer_ns"],
            table.loc[1, "peer_post"]) == (400, 100, 500)
    assert (table.loc[0, "waiting_ns"], table.loc[0, "transfer_ns"]) == (0, 20)
    assert table["matched"].all()
    lonely = waits.p2p_table(p2p.match_p2p([recv])).iloc[0]
    assert not lonely["matched"] and lonely["waiting_ns"] == 0 and lonely["peer_post"] == -1
    other = waits.p2p_table(p2p.match_p2p([send, _calls(1, "recv", 100, 600, 32)]))
    assert not other["matched"].any()  # the pair disagrees on bytes
    events = waits.p2p_events(p2p.match_p2p([send, recv]), ["ipu", "start", "end", "kind"])
    assert sorted(map(tuple, events.to_numpy().tolist())) == \
        [(0, 500, 520, "exchange"), (1, 100, 500, "idle"), (1, 500, 600, "exchange")]
    assert waits.split_at(np.array([10]), np.array([20]), np.array([99])).tolist() == [20]


class FakeClock:
    """A host's wall clock: its own offset, advancing by `tick` ns at each reading."""

    def __init__(self, offset: int, tick: int = 1_000) -> None:
        self.now, self.tick = offset, tick

    def __call__(self) -> int:
        self.now += self.tick
        return self.now


class FakeRank:
    def __init__(self, rank: int, base_ns: int, first_ns: int) -> None:
        self.rank, self.base_ns, self.first_ns = rank, base_ns, first_ns
        self.events = pd.DataFrame({"start": [first_ns]})

    def shift(self, origin: int) -> None:
        self.events["start"] += self.base_ns - origin


def test_clock_offsets_from_barrier_readings_with_a_fake_clock() -> None:
    """Two hosts whose clocks differ by 5 s (and a barrier releasing them 0-3 us apart):
    the live path's readings give rank 1's offset, and aligning takes it off, so an
    event both ranks stamp at the same instant lands at the same time."""
    from popviz.measure.live import clock_readings

    skew, release = 5_000_000_000, [0, 3_000, 0, 2_000, 0]
    host0, host1 = FakeClock(10**18), FakeClock(10**18 + skew)
    mine0 = clock_readings(None, None, 5, host0)
    mine1 = [r + d for r, d in zip(clock_readings(None, None, 5, host1), release)]
    offsets, info = clocks.clock_offsets([mine0, mine1], ["node-a", "node-b"])
    assert offsets == {0: 0, 1: skew} and info["spread_ns"] == 3_000
    assert not info["one_host"]
    same_host, _ = clocks.clock_offsets([mine0, mine1], ["node-a", "node-a"])
    assert same_host == {0: 0, 1: 0}  # one host, one clock: nothing to take off
    ranks = [FakeRank(0, 10**18, 700), FakeRank(1, 10**18 + skew, 700)]
    assert clocks.align(ranks, offsets) == 10**18 + 700  # t = 0: the first event
    assert [r.events["start"].iloc[0] for r in ranks] == [0, 0]
    with pytest.raises(ValueError, match="same number"):
        clocks.clock_offsets([[1, 2], [1]], ["a", "b"])


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
    assert "--out profiles/tutorial_measured_2ranks" in makefile


def test_train_py_measure_flags_map_to_a_pipeline(monkeypatch: Any, tmp_path: Path,
                                                  capsys: Any) -> None:
    """train.py --measure: the CNN app's flags become the real pipeline's shape (the run
    itself is replaced here; the runs above cover it)."""
    import importlib.util

    from popviz.measure import launch, train_flags

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("popviz_train_measure", root / "train.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    seen: list[MeasureConfig] = []
    monkeypatch.setattr(launch, "measure", lambda config: seen.append(config.validate()))
    monkeypatch.setattr(train_flags, "run_from_train_args", lambda args: launch.measure(
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
    assert config.out is None and config.profile_dir == out
    assert script.main(["--measure", "--batch-size", "4", "--gradient-accumulation", "4",
                        "--profile-dir", out]) == 0
    assert seen[1].ranks == 4 and seen[1].splits == ["B2", "B3", "B4"]  # the tutorial's blocks
    assert script.main(["--model", "resnet", "--model-size", "18", "--measure"]) == 2
    assert "--shards N >= 2" in _one_error(capsys)
    assert script.main(["--model", "resnet", "--model-size", "18", "--shards", "2",
                        "--pipeline", "--pipeline-splits", "b3/0", "--pipeline-schedule",
                        "Sequential", "--measure"]) == 2
    assert "Sequential has no torch.distributed.pipelining schedule" in _one_error(capsys)


def test_record_in_one_process_with_a_fake_clock(tmp_path: Path) -> None:
    """Without a process group `record` times the one process: its clock is read once per
    round (no barrier to wait at) and the profile is written from the saved trace."""
    import torch

    from popviz.measure.live import record

    fake = FakeClock(10**18)
    model = torch.nn.Linear(8, 8)
    with record(tmp_path / "one", clock=fake, command_line="test") as rec:
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
            rec.step()
    assert fake.now == 10**18 + 5 * 1_000  # five rounds of readings
    assert rec.profile_path == tmp_path / "one" / "profile.h5"
    assert rec.trace_path == tmp_path / "one" / "traces" / "rank0.json"
    with popviz.open(rec.profile_path) as p:
        assert p.meta["measure"]["ranks"] == [0] and p.meta["measure"]["live"]
        assert p.meta["measure"]["clock_sync"] == {"offsets_ns": {"0": 0}, "spread_ns": 0,
                                                   "rounds": 5, "one_host": True}
        compute = p.trace[p.trace["kind"] == "compute"]
        assert sorted(compute["step"].unique()) == [0, 1]  # one per rec.step()
        assert p.table("p2p").empty and p.command_line == "test"


def test_a_trace_that_cannot_be_read_is_one_error_and_no_profile(tmp_path: Path,
                                                                 monkeypatch: Any) -> None:
    import torch

    from popviz.errors import ProfileError
    from popviz.ingest import import_rank
    from popviz.measure.live import record

    def unreadable(path: Any) -> Any:
        raise ProfileError(f"{path}: cannot import it (test)")

    monkeypatch.setattr(import_rank, "rank_part", unreadable)
    with pytest.raises(ProfileError, match=r"rank0\.json: cannot import it \(test\)"), \
            record(tmp_path / "bad", clock=FakeClock(0)) as rec:
        torch.nn.Linear(4, 4)(torch.ones(2, 4)).sum().backward()
        rec.step()
    assert not (tmp_path / "bad" / "profile.h5").exists()
