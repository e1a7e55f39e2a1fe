"""One number, one definition (issue 21): the stash per IPU on /liveness, /stages and
/compare; the pipeline bubbles on the summary page and in `summary --json`; an import's
exchange time on /trace and /exchange; a one-device run is not called balanced."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

import popviz
from popviz.analysis.advice import advise
from popviz.analysis.compare import compare
from popviz.analysis.exchange import trace_traffic
from popviz.analysis.insights import insights
from popviz.analysis.stash import stash_line, stash_variable_name, stash_words
from popviz.cli.main import main
from popviz.metrics import stash, stash_per_ipu
from popviz.units import MiB
from popviz.vocab import ipu_label
from tests.dash_util import component_text

ROOT = Path(__file__).resolve().parent.parent / "profiles"
PIPELINE = ROOT / "rn50_pipeline" / "profile.h5"


def test_stash_is_depth_times_bytes_per_microbatch() -> None:
    stages = pd.DataFrame({"stage": [0, 1, 2], "ipu": [0, 1, 1], "stash_bytes": [70, 9, 0],
                           "stash_depth": [7, 3, 0],
                           "stash_bytes_per_microbatch": [10, 3, 55]})
    table = stash(stages)
    assert table["stash_bytes"].tolist() == [70, 9, 0]
    assert table["per_microbatch_bytes"].tolist() == [10, 3, 0]  # no stash, nothing held
    assert stash_per_ipu(stages).to_dict() == {0: 70, 1: 9}
    # an older stage table without depth keeps its bytes, depth unknown
    old = stash(stages[["stage", "ipu", "stash_bytes"]])
    assert old["stash_bytes"].tolist() == [70, 9, 0] and (old["depth"] == -1).all()
    assert stash_words(-1, 0, 3 * MiB) == "3.0 MiB"
    assert stash_words(7, 10 * MiB, 70 * MiB) == "7 micro-batches x 10.0 MiB = 70.0 MiB"
    assert stash_words(0, 0, 0) == "none"


def test_liveness_stash_variables_add_up_to_the_stages_stash() -> None:
    """/liveness lists the copies beyond the current micro-batch as one variable per IPU;
    with the current micro-batch's own copy they are the stage table's stash."""
    with popviz.open(PIPELINE) as p:
        table = stash(p.stages).set_index("ipu")
        extra = p.variables[p.variables["category"] == "stash"]
        assert len(extra)
        for ipu, group in extra.groupby("ipu"):
            row = table.loc[int(ipu)]
            assert int(group["bytes"].sum()) + int(row["per_microbatch_bytes"]) \
                == int(row["stash_bytes"])
            for name in group["name"]:
                said = stash_variable_name(name)
                depth = int(re.search(r"stash depth (\d+)", said)[1])
                assert depth == int(row["depth"]), said
        line = stash_line(p.stages, ipu_label)
        for ipu, row in table[table["stash_bytes"] > 0].iterrows():
            assert f"{ipu_label(int(ipu))} {int(row['depth'])} micro-batches" in line
        # /compare's stash per IPU is the same definition
        comp = compare(p, p)
        assert comp.metrics.set_index("metric").loc["stash_bytes", "a"] \
            == pytest.approx(float(table["stash_bytes"].sum()))


def test_stash_variable_name_leaves_other_names() -> None:
    assert stash_variable_name("aten.relu#4") == "aten.relu#4"
    assert stash_variable_name("stash of x#1 x1") == \
        "stash of x#1: 1 more micro-batch in flight (stash depth 2)"


def test_liveness_and_stages_pages_say_the_same_stash(tmp_path: Path) -> None:
    from popviz_app import create_app, render

    shutil.copytree(ROOT / "rn50_pipeline", tmp_path / "p")
    ctx = create_app(tmp_path).popviz_context
    live = component_text(render(ctx, "/liveness", "?profile=p%2Fprofile.h5")[1])
    with popviz.open(PIPELINE) as p:
        row = stash(p.stages).iloc[0]
    words = stash_words(int(row.depth), int(row.per_microbatch_bytes), int(row.stash_bytes))
    assert words in live
    assert _table(render(ctx, "/stages", "?profile=p%2Fprofile.h5")[1],
                  "stages-table")[0]["stash"] == words
    names = [r["name"] for r in _table(render(ctx, "/liveness", "?profile=p%2Fprofile.h5")[1],
                                       "live-vars")]
    stashed = [n for n in names if n.startswith("stash of")]
    assert stashed and all(re.search(r"in flight \(stash depth \d+\)$", n) for n in stashed)


def _table(component: object, id_: str) -> list[dict]:
    """The rows of the DataTable `id_` in a Dash component tree."""
    todo = [component]
    while todo:
        node = todo.pop()
        if getattr(node, "id", None) == id_:
            return list(node.data)
        kids = getattr(node, "children", None)
        todo += kids if isinstance(kids, (list, tuple)) else [kids] if kids is not None \
            and not isinstance(kids, (str, int, float)) else []
    raise AssertionError(f"no table {id_}")


def test_summary_json_bubble_fraction_is_the_summary_pages(
        capsys: pytest.CaptureFixture) -> None:
    assert main(["summary", str(PIPELINE), "--json", "--no-vet"]) == 0
    facts = json.loads(capsys.readouterr().out)
    with popviz.open(PIPELINE) as p:
        page = insights(p)["bubble_fraction"]
    assert facts["bubble_fraction"] == pytest.approx(page)
    assert facts["bubble_fraction"] == pytest.approx(facts["idle_fraction"])
    # the bottleneck's own idle share is named as such, not a second "bubble_fraction"
    assert "bubble_fraction" not in facts["bottleneck"]
    assert main(["summary", str(PIPELINE), "--no-vet"]) == 0
    assert f"pipeline bubbles: {page:.0%} idle" in capsys.readouterr().out


def test_exchange_time_of_the_trace_is_listed_by_name() -> None:
    trace = pd.DataFrame({"ipu": [0, 0, 0, 0], "start": [0, 10, 20, 40],
                          "end": [5, 12, 30, 41], "kind": ["exchange", "exchange", "compute",
                                                           "host_io"],
                          "op": ["Memset (Device)", "Memset (Device)", "gemm", "Memcpy HtoD"],
                          "bytes": [4, 4, 0, 64]})
    out = trace_traffic(trace)
    assert out.to_dict("records") == [
        {"kind": "exchange", "op": "Memset (Device)", "events": 2, "bytes": 8, "time": 7},
        {"kind": "host_io", "op": "Memcpy HtoD", "events": 1, "bytes": 64, "time": 1}]
    assert trace_traffic(trace[trace["kind"] == "compute"]).empty


def test_one_device_is_not_told_its_stages_are_balanced() -> None:
    one = pd.DataFrame({"stage": [0], "ipu": [0], "forward_cycles": [10],
                        "backward_cycles": [20], "idle_cycles": [0], "exchange_cycles": [0]})
    tiles = pd.DataFrame({"ipu": [0], "tile": [0], "capacity_bytes": [100], "total_bytes": [5]})
    text = " ".join(a.text for a in advise({}, one, tiles))
    assert "balanced" not in text and "one device" in text.lower()
    two = pd.concat([one, one.assign(stage=1, ipu=1)], ignore_index=True)
    assert "balanced: the busiest is within" in " ".join(a.text for a in advise({}, two, tiles))


def test_summary_of_a_project_folder_skips_venvs_and_foreign_files(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`popviz summary .` does not walk into .venv (or a venv by any name) and names a
    foreign .h5 on stderr, then goes on (issue 21)."""
    from tests.test_format import write_tiny

    write_tiny(tmp_path / "runs" / "a")
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / ".venv" / "lib" / "h5py_test.h5").write_bytes(b"not ours")
    (tmp_path / "env2" / "pyvenv.cfg").parent.mkdir()
    (tmp_path / "env2" / "pyvenv.cfg").write_text("home = /usr\n")
    (tmp_path / "env2" / "x.h5").write_bytes(b"not ours")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "foreign.h5").write_bytes(b"not hdf5 at all")
    found = popviz.discover(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in found] == \
        ["data/foreign.h5", "runs/a/profile.h5"]
    assert main(["summary", str(tmp_path), "--json", "--no-vet"]) == 0
    out = capsys.readouterr()
    assert [f["name"] for f in json.loads(out.out)] == ["a"]
    assert "skipped" in out.err and "foreign.h5" in out.err and len(out.err.splitlines()) == 1
    # nothing readable at all: an error, exit 1
    assert main(["summary", str(tmp_path / "data"), "--no-vet"]) == 1


@pytest.mark.parametrize("name", ["rn50_pipeline", "effnet_b4_pipeline"])
def test_compare_calls_stages_unbalanced_as_the_stages_page_does(name: str) -> None:
    """/compare's verdict said rn50_pipeline's 'stages are unbalanced' (its idle shares
    differ by 22 points) while /stages titled the same stages 'balanced within 15%' (the
    busiest is 1.14x the mean): one judgement now, the busiest over the mean."""
    from popviz.analysis.compare.build import build
    from popviz.analysis.compare.sides import load_side
    from popviz.analysis.compare.verdict import _idlest_ipu
    from popviz.figures.stages import stage_load_figure

    with popviz.open(ROOT / name / "profile.h5") as p:
        side = load_side(p, "A")
        red = "#c53a32" in list(stage_load_figure(p.stages).data[0].marker.color)
    comp = build(side, side)
    assert ("stages are unbalanced" in _idlest_ipu(comp, side)) == red


def test_amp_advice_off_the_bottleneck_says_the_step_hardly_shortens() -> None:
    """rn50_pipeline's only advice raised AMP on IPU2 and IPU3 (cycles -0.9% / -0.8%),
    the two least loaded IPUs, while IPU1 sets the pace: said so now. A sharded run's
    IPUs all add to the step: no such note there."""
    with popviz.open(ROOT / "rn50_pipeline" / "profile.h5") as p:
        texts = {a.ipu: a.text for a in advise(p.meta, p.stages, p.tile_memory, p.ops)
                 if a.topic == "amp"}
        busiest = p.stages.groupby("ipu")[["forward_cycles", "backward_cycles",
                                           "recompute_cycles"]].sum().sum(axis=1).idxmax()
    assert texts and busiest not in texts
    assert all(t.endswith(f"{ipu_label(busiest)}, the busiest, sets the step's pace: the "
                          "step hardly shortens.") for t in texts.values())
    with popviz.open(ROOT / "tutorial_sharded" / "training" / "profile.h5") as p:
        assert not any("pace" in a.text for a in advise(p.meta, p.stages, p.tile_memory,
                                                          p.ops))


def test_a_measured_bottleneck_says_how_much_of_its_step_is_untraced() -> None:
    """The tutorial run's advice called rank 0 'compute-bound (84% compute, 16%
    exchange)': shares of its busy time, while 46% of its step is Python between traced
    ops. The advice says both, from the same timed stages /stages shows."""
    from popviz.analysis.balance import stage_balance, timed_stages

    with popviz.open(ROOT / "tutorial_measured_2ranks" / "profile.h5") as p:
        text = " ".join(a["text"] if isinstance(a, dict) else a.text
                        for a in insights(p)["advice"])
        bal = stage_balance(timed_stages(p.stages, p.trace, True)).set_index("stage")
    top = bal["busy_cycles"].idxmax()
    untraced = bal.loc[top, "untraced_cycles"] / bal.loc[top, "total_cycles"]
    assert untraced > 0.1
    assert f"of its busy time). That busy time is {bal.loc[top, 'busy_fraction']:.0%} of " \
        f"its step; {untraced:.0%} is untraced" in text
