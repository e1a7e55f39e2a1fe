"""Links between views (issue 21): a liveness step, an op and a program-tree box placed on
the trace; a trace range followed by /operations and /liveness. Analysis on the bundled
modelled profile and an imported H100 trace; the callbacks called directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from popviz_app import create_app

import popviz
from popviz.analysis import links
from tests.dash_util import component_text

ROOT = Path(__file__).resolve().parents[1] / "profiles"
REL = "rn50_recompute/profile.h5"
Q = f"?profile={REL}"


@pytest.fixture(scope="module")
def prof() -> Any:
    with popviz.open(ROOT / REL) as p:
        yield p


@pytest.fixture(scope="module")
def cb() -> Any:
    return create_app(ROOT, vetter=False).popviz_callbacks


def _query(component: Any, id_: str) -> dict[str, str]:
    """The query of the link `id_` inside a rendered component."""
    found: list[str] = []

    def walk(c: Any) -> None:
        if getattr(c, "id", None) == id_:
            found.append(c.href)
        kids = getattr(c, "children", None)
        for k in kids if isinstance(kids, list) else [kids] if kids is not None else []:
            walk(k)
    for c in component if isinstance(component, list) else [component]:
        walk(c)
    assert found, f"no link {id_}"
    return {k: v[0] for k, v in parse_qs(urlparse(found[0]).query).items()}


def test_step_span_is_the_pass_of_the_step(prof: Any) -> None:
    live = prof.liveness
    row = live[(live["pass"] == "B") & (live["ipu"] == 0)].iloc[3]
    span = links.step_span(live, prof.trace, 0, int(row["step"]))
    tr = prof.trace
    # a modelled program is one micro-batch's: the first pass of any micro-batch
    ev = tr[(tr["kind"] == "compute") & (tr["ipu"] == 0) & (tr["stage"] == row["stage"])
            & (tr["pass"] == "B")].sort_values("start")
    assert span == (float(ev["start"].iloc[0]), float(ev["end"].iloc[0]))
    # and back: the steps of that range hold the step
    found = links.steps_in_range(live, tr, *span)
    assert found[0][0] <= int(row["step"]) <= found[0][1]


def test_a_measured_step_spans_its_neighbours_times() -> None:
    """A live run's liveness is torch.profiler's memory events, each with its own time: a
    step opens the trace from the event before it to the one after it."""
    with popviz.open(ROOT / "tutorial_measured_2ranks") as p:
        live, tr = p.liveness, p.trace
        on = live[live["ipu"] == 1].sort_values("step", kind="stable").reset_index(drop=True)
        k = len(on) // 2
        span = links.step_span(live, tr, 1, int(on["step"].iloc[k]))
        assert span == (float(on["time"].iloc[k - 1]), float(on["time"].iloc[k + 1]))
        assert span[0] <= float(on["time"].iloc[k]) <= span[1] and span[0] < span[1]


def test_ops_in_range_are_those_whose_pass_overlaps(prof: Any) -> None:
    tr = prof.trace
    first = tr[(tr["kind"] == "compute") & (tr["pass"] == "F")].sort_values("start").iloc[0]
    mask = links.ops_in_range(prof.ops, tr, float(first["start"]), float(first["start"]) + 1)
    hit = prof.ops[mask]
    assert len(hit) and set(hit["pass"]) == {"F"} and set(hit["stage"]) == {first["stage"]}
    assert not links.ops_in_range(prof.ops, tr, -10.0, -5.0).any()


def test_measured_ops_and_steps_by_their_own_times(resnet: Any) -> None:
    ops, tr, live = resnet.ops, resnet.trace, resnet.liveness
    op = ops[ops["start"] > 0].iloc[len(ops) // 2]
    ipu, span = links.op_span(ops, tr, int(op["op_id"]))
    assert ipu == int(op["ipu"]) and span == (float(op["start"]), float(op["end"]))
    mask = links.ops_in_range(ops, tr, *span)
    assert mask[ops["op_id"].to_numpy() == op["op_id"]].all()
    inside = ops[mask]
    assert ((inside["start"] <= span[1]) & (inside["end"] >= span[0])).all()
    t = live["time"].to_numpy()
    found = links.steps_in_range(live, tr, float(t[10]), float(t[20]))
    assert found == {0: (int(live["step"].iloc[10]), int(live["step"].iloc[20]))}


def test_liveness_click_links_to_the_trace_there(cb: Any, prof: Any) -> None:
    live = prof.liveness
    step = int(live[(live["ipu"] == 0)]["step"].iloc[50])
    panel = cb["liveness.to_trace"]({"points": [{"x": step, "customdata": ["", "", 0, 0]}]},
                                    Q)
    q = _query(panel, "live-trace-link")
    span = links.step_span(live, prof.trace, 0, step)
    assert q["ipu"] == "0" and float(q["t0"]) <= span[0] and float(q["t1"]) >= span[1]
    # /trace opens on it
    fig, _status, window, *_ = cb["trace.focus"](None, f"{Q}&t0={q['t0']}&t1={q['t1']}&ipu=0")
    lo, hi = window["range"]
    assert window["how"].startswith("Linked range on ")
    assert list(fig.layout.meta["range"]) == [lo, hi]
    assert lo >= float(q["t0"]) - 1 and hi <= float(q["t1"]) + 1


def test_operations_row_links_to_the_trace(cb: Any, prof: Any) -> None:
    rows, _, _ = cb["operations.refresh"](0, 25, [], "", Q)
    assert all(r["id"] == r["op_id"] for r in rows)
    op = rows[3]
    q = _query(cb["operations.to_trace"]({"row": 3, "column": 0, "row_id": op["id"]}, Q),
               "ops-trace-link")
    assert q["ipu"] == str(op["ipu"]) and float(q["t1"]) > float(q["t0"])
    assert q["op"] == str(op["op_id"])
    # the window is centred on the op itself, not on its whole pass
    from popviz.analysis.trace_detail import pass_ops

    _, span = links.op_span(prof.ops, prof.trace, int(op["op_id"]), pass_ops(prof.ops))
    _, whole = links.op_span(prof.ops, prof.trace, int(op["op_id"]))
    assert whole[0] <= span[0] <= span[1] <= whole[1] and span[1] - span[0] < whole[1] - whole[0]
    # the op's own window (its width 20 times over), shifted inside the run: this early
    # op is 18k cycles nearer the start than half that width (no negative t0)
    t0, t1 = float(q["t0"]), float(q["t1"])
    assert 0 <= t0 <= span[0] <= span[1] <= t1
    assert abs((t1 - t0) - 20 * (span[1] - span[0])) <= 2
    # /trace opens there with the op outlined
    fig, _status, _window, *_ = cb["trace.focus"](None, f"{Q}&t0={q['t0']}&t1={q['t1']}"
                                                    f"&ipu={q['ipu']}&op={q['op']}")
    lit = [t for t in fig.data if str(t.name).endswith("(selected op)")]
    assert lit and any(int(c[8]) == int(op["op_id"]) for t in lit for c in t.customdata)


def test_tree_box_links_to_its_first_pass(cb: Any, prof: Any) -> None:
    panel, _, _ = cb["tree.pick"]({"points": [{"id": "layer2"}]}, "model", Q)
    q = _query(panel, "tree-to-trace")
    assert q["module"] == "layer2"
    ipu, span = links.module_span(prof.ops, prof.trace, "layer2")
    assert q["ipu"] == str(ipu) and float(q["t0"]) <= span[0] <= span[1] <= float(q["t1"])


def test_trace_range_drives_operations_and_liveness(cb: Any, prof: Any) -> None:
    tr = prof.trace
    comp = tr[(tr["kind"] == "compute") & (tr["ipu"] == 0)].sort_values("start")
    t0, t1 = float(comp["start"].iloc[1]), float(comp["end"].iloc[2])
    panel = cb["trace.follow"]([t0, t1], None, Q)
    q = _query(panel, "trace-to-ops")
    assert float(q["t0"]) <= t0 and float(q["t1"]) >= t1
    search = f"{Q}&t0={q['t0']}&t1={q['t1']}"
    rows, _pages, note = cb["operations.refresh"](0, 500, [], "", search)
    want = links.ops_in_range(prof.ops, tr, float(q["t0"]), float(q["t1"]))
    assert "linked from the trace" in note and note.startswith(f"{int(want.sum()):,} of ")
    assert set(r["op_id"] for r in rows) <= set(prof.ops["op_id"][want])
    # the page opens on them (its first page)
    first, _pages, opening = cb["operations.linked"](None, search)
    assert opening == note and [r["id"] for r in first] == [r["id"] for r in rows[:len(first)]]
    fig, ranges, text = cb["liveness.from_trace"](None, search)
    found = links.steps_in_range(prof.liveness, tr, float(q["t0"]), float(q["t1"]))
    assert ranges == {str(i): [lo - 0.5, hi + 0.5] for i, (lo, hi) in found.items()}
    assert "linked from the trace" in text and fig is not None
    assert "Liveness" in " ".join(component_text(c) for c in panel)


MEASURED_REL = "tutorial_measured_2ranks/profile.h5"
MQ = f"?profile={MEASURED_REL}"


def test_op_window_keeps_inside_the_run() -> None:
    """An op near either end of the run: the window shifts inside it (never a negative
    t0, issue: the link to a CPU run's first op asked for t0=-310,990), keeps its width
    and holds the op; in the middle it is centred on the op."""
    import pandas as pd

    tr = pd.DataFrame({"start": [100.0, 5_000.0], "end": [200.0, 10_000.0]})
    assert links.run_span(tr) == (100.0, 10_000.0)
    a, b = links.op_window((110.0, 150.0), tr)  # 40 long: 800 wide
    assert (a, b) == (100.0, 900.0)
    a, b = links.op_window((9_900.0, 9_990.0), tr)
    assert (a, b) == (10_000.0 - 1_800.0, 10_000.0)
    a, b = links.op_window((5_000.0, 5_010.0), tr)
    assert (a + b) / 2 == 5_005.0 and b - a == 200.0
    # a run shorter than the window: the whole run (the op inside it)
    assert links.op_window((100.0, 200.0), tr.iloc[:1]) == (100.0, 2_100.0)
    # the run as the page draws it (a measured run's host slices start at 0, before
    # its first device event)
    assert links.op_window((110.0, 150.0), tr, run=(0.0, 10_000.0)) == (0.0, 800.0)


def test_a_measured_op_is_its_host_slice() -> None:
    with popviz.open(ROOT / MEASURED_REL) as p:
        ops, slices = p.ops, p.table("host_slices")
        for op_id in (0, len(ops) // 2, int(ops["op_id"].iloc[-1])):
            op = ops[ops["op_id"] == op_id].iloc[0]
            lit = slices.loc[links.op_slices(ops, slices, op_id)]
            assert len(lit) == 1
            assert (int(lit["ipu"].iloc[0]), lit["start"].iloc[0], lit["end"].iloc[0],
                    lit["name"].iloc[0]) == (int(op["ipu"]), op["start"], op["end"], op["op"])
        assert len(links.op_slices(ops, slices, 10**9)) == 0  # no such op
        assert links.run_span(p.trace, slices) == (
            float(slices["start"].min()), max(float(slices["end"].max()),
                                              float(p.trace["end"].max())))


def test_modelled_ops_have_no_host_slice(prof: Any) -> None:
    import pandas as pd

    slices = pd.DataFrame({"ipu": [0], "start": [0], "end": [10], "name": ["x"]})
    assert len(links.op_slices(prof.ops, slices, int(prof.ops["op_id"].iloc[0]))) == 0


@pytest.mark.parametrize("pick", ["first", "middle", "last"])
def test_measured_operations_row_opens_the_trace_at_the_op_outlined(cb: Any, pick: str
                                                                    ) -> None:
    """A CPU-measured run (ranks, ns from its first recorded step, Perfetto's thread
    lanes): the link from /operations opens /trace on the op, inside the run, on the op's
    rank, with the op's own host slice outlined, as an IPU plan's op is."""
    with popviz.open(ROOT / MEASURED_REL) as p:
        ops, slices = p.ops, p.table("host_slices")
    op = ops.iloc[{"first": 0, "middle": len(ops) // 2, "last": len(ops) - 1}[pick]]
    q = _query(cb["operations.to_trace"]({"row": 0, "column": 0,
                                          "row_id": int(op["op_id"])}, MQ),
               "ops-trace-link")
    t0, t1 = float(q["t0"]), float(q["t1"])
    assert q["op"] == str(op["op_id"]) and q["ipu"] == str(op["ipu"])
    assert float(slices["start"].min()) <= t0 <= float(op["start"])
    assert float(op["end"]) <= t1 <= float(slices["end"].max())
    fig, _status, window, *_ = cb["trace.focus"](None, f"{MQ}&t0={q['t0']}&t1={q['t1']}"
                                                     f"&ipu={q['ipu']}&op={q['op']}")
    lit = [t for t in fig.data if str(t.name).endswith("(selected op)")]
    assert len(lit) == 1 and list(lit[0].base) == [float(op["start"])]
    assert window["range"] == [t0, t1] and fig.layout.meta["highlighted"] == 1
    assert list(lit[0].x) == [float(op["end"] - op["start"])]
    assert lit[0].customdata[0][0] == op["op"]
    # it stays outlined when the user zooms out to the whole run, in either layout
    for mode in ("flame", "flat"):
        fig = cb["trace.mode"](mode, {"range": [None, None]}, f"{MQ}&op={q['op']}")[0]
        assert fig.layout.meta["highlighted"] == 1
