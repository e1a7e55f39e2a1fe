"""popviz.analysis.find: the /trace search box's matches, checked against a plain walk
over the bundled profiles' rows and a real CUDA recording's kernels."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import popviz
from popviz.analysis.find import Query, find_kernels, find_ops, parse_query
from popviz.analysis.links import LAUNCH_REACH, kernel_window, op_window
from tests.import_fixtures import RESNET

PROFILES = Path(__file__).resolve().parents[1] / "profiles"


def test_parse_query_reads_text_pass_and_microbatch() -> None:
    assert parse_query("  conv   pass:B mb:2 ") == Query("conv", ("B",), 2)
    assert parse_query("pass:forward micro-batch:10") == Query("", ("F",), 10)
    assert parse_query("mb:x layer1") == Query("mb:x layer1")  # not a number: text
    assert parse_query("").empty and parse_query(None).empty


def test_a_modelled_profiles_ops_by_module_and_phase() -> None:
    with popviz.open(PROFILES / "rn50_pipeline") as p:
        ops = p.ops
    rows = ops.to_dict("records")
    found, total = find_ops(ops, parse_query("Layer3.0.DOWNSAMPLE"), limit=5)
    want = [r["op_id"] for r in rows if "layer3.0.downsample" in str(r["module"]).lower()
            or "layer3.0.downsample" in str(r["op"]).lower()]
    assert total == len(want) > 5 and found["op_id"].tolist() == want[:5]
    backward, count = find_ops(ops, parse_query("layer3.0.downsample pass:B"))
    assert count == sum(1 for r in rows if r["op_id"] in want and r["phase"] == "backward")
    assert set(backward["phase"]) == {"backward"}
    assert find_ops(ops, parse_query("no-such-op"))[1] == 0


def test_a_measured_runs_ops_by_pass_in_time_order() -> None:
    with popviz.open(PROFILES / "tutorial_measured_2ranks") as p:
        ops, trace = p.ops, p.trace
    found, total = find_ops(ops, parse_query("aten::mm pass:backward"))
    want = [r for r in ops.to_dict("records") if "aten::mm" in r["op"] and r["pass"] == "B"]
    assert total == len(want) > 0
    assert found["start"].is_monotonic_increasing and set(found["pass"]) == {"B"}
    # a CPU run's compute events are its ops: not listed again as kernels
    assert find_kernels(trace, parse_query("aten::mm"))[1] == 0


def test_mb_narrows_to_one_micro_batch() -> None:
    ops = pd.DataFrame({"op_id": [1, 2, 3], "op": ["mm", "mm", "add"],
                        "module": ["a", "a", "a"], "pass": ["F", "F", "F"],
                        "microbatch": [0, 1, 1], "start": [5, 9, 12]})
    found, total = find_ops(ops, parse_query("mm mb:1"))
    assert total == 1 and found["op_id"].tolist() == [2]


@pytest.fixture(scope="module")
def cuda(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with popviz.open(popviz.import_trace(RESNET, tmp_path_factory.mktemp("rn50"))) as p:
        yield p.trace


def test_an_imports_kernels_by_name(cuda: Any) -> None:
    with gzip.open(RESNET, "rt") as f:
        events = json.load(f)["traceEvents"]
    named = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"
             and "nchwtonhwc" in e["name"].lower()]
    found, total = find_kernels(cuda, parse_query("NCHWtoNHWC"))
    assert total == len(named) > 0
    assert found["start"].is_monotonic_increasing and len(found) == min(total, 20)
    assert all("nchwtonhwc" in op.lower() for op in found["op"])


@pytest.fixture(scope="module")
def cuda_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("found")
    popviz.import_trace(RESNET, root / "rn")
    return root


def test_a_found_kernel_links_to_the_op_that_launched_it(cuda_root: Path) -> None:
    """A kernel found on /trace linked to its time alone, so nothing was outlined: its
    link carries the op that launched it (the innermost op named as its host_op around
    its launch), with the launch inside the window."""
    from urllib.parse import parse_qs, urlparse

    from popviz_app import ProfileCache
    from popviz_app.common import AppContext
    from popviz_app.trace_find import found_list

    from popviz.analysis.links import kernel_ops, op_slices
    from tests.dash_util import find_components

    rel = next(cuda_root.rglob("*.h5")).relative_to(cuda_root).as_posix()
    entry = AppContext(root=cuda_root, cache=ProfileCache(cuda_root)).cache.get(rel)
    p = entry.profile
    kernels, _ = find_kernels(p.trace, parse_query("NCHWtoNHWC"))
    slices = p.table("host_slices")
    launched = kernel_ops(kernels, p.ops, slices)
    assert len(launched) == len(kernels) and all(x is not None for x in launched)
    for (op_id, (a, b)), row in zip(launched, kernels.to_dict("records"), strict=True):
        op = p.ops[p.ops["op_id"] == op_id].iloc[0]
        assert op["op"] == row["host_op"] and op["start"] <= a <= b <= op["end"]
        inner = p.ops[(p.ops["ipu"] == op["ipu"]) & (p.ops["start"] > op["start"])
                      & (p.ops["start"] <= a) & (p.ops["end"] >= b)]
        assert not (inner["op"] == row["host_op"]).any()  # the innermost such op
        assert len(op_slices(p.ops, slices, op_id)) == 1  # what /trace outlines
    from dash import html

    found = html.Div(found_list(entry, "NCHWtoNHWC"))
    hrefs = [link.href for link in find_components(found, "Link")
             if str(link.id).startswith("trace-found-kernel-")]
    assert len(hrefs) == len(kernels)
    near = 0
    for href, (op_id, launch), row in zip(hrefs, launched, kernels.to_dict("records"),
                                          strict=True):
        q = {k: v[0] for k, v in parse_qs(urlparse(href).query).items()}
        t0, t1 = float(q["t0"]), float(q["t1"])
        assert q["op"] == str(op_id)
        kernel = (float(row["start"]), float(row["end"]))
        assert t0 <= kernel[0] and kernel[1] <= t1  # the kernel always in view
        own = op_window(kernel, p.trace)
        # readable: never the whole run because the GPU ran behind the host
        assert t1 - t0 <= 1.2 * LAUNCH_REACH * (own[1] - own[0]) + 1
        if t0 <= launch[0] and launch[1] <= t1:
            near += 1
    assert near > 0  # where the launch is near, it is in the window too


def test_a_kernel_far_behind_its_launch_opens_on_the_kernel() -> None:
    """The GPU runs behind the host: a window taking in a launch 20 ms before its 20 us
    kernel would shrink the kernel to a pixel, so the kernel's own window is kept; a
    launch just before it is taken in, padded."""
    trace = pd.DataFrame({"start": [0.0], "end": [50e6]})
    kernel = (30e6, 30e6 + 20e3)
    own = op_window(kernel, trace)
    assert kernel_window(kernel, (10e6, 10e6 + 5e3), trace) == own
    assert kernel_window(kernel, None, trace) == own
    near = kernel_window(kernel, (kernel[0] - 600e3, kernel[0] - 590e3), trace)
    assert near[0] <= kernel[0] - 600e3 and kernel[1] <= near[1]
    assert near[1] - near[0] == pytest.approx(1.2 * (kernel[1] - (kernel[0] - 600e3)))


def _app_entry(root: Path, rel: str) -> Any:
    from popviz_app import ProfileCache
    from popviz_app.common import AppContext

    return AppContext(root=root, cache=ProfileCache(root)).cache.get(rel)


def _found(entry: Any, typed: str) -> tuple[str, list[dict[str, str]]]:
    """What /trace's Find box shows for `typed`: its text, and each op link's query."""
    from urllib.parse import parse_qs, urlparse

    from dash import html
    from popviz_app.trace_find import found_list

    from tests.dash_util import component_text, find_components

    shown = html.Div(found_list(entry, typed))
    queries = [{k: v[0] for k, v in parse_qs(urlparse(link.href).query).items()}
               for link in find_components(shown, "Link")
               if str(link.id).startswith("trace-found-op-")]
    return component_text(shown), queries


def _unnarrowed(ops: pd.DataFrame, q: Query) -> pd.DataFrame:
    """The ops the query's text and passes match (every op for `mb:` alone)."""
    plain = Query(q.text, q.passes)
    return ops if plain.empty else find_ops(ops, plain, limit=len(ops))[0]


@pytest.mark.parametrize("typed", ["mb:2", "pass:B mb:2 layer4"])
def test_mb_on_a_modelled_profile_links_into_that_micro_batch(typed: str) -> None:
    """A modelled op runs once per micro-batch (the ops table has no micro-batch): `mb:2`
    matched all 1,440 ops and each link opened micro-batch 0's run. It keeps the ops whose
    pass runs in micro-batch 2 (an optimiser's update runs once, in none) and each link
    opens the op where it runs in micro-batch 2's run of its stage and pass."""
    from popviz.analysis.trace_detail import op_occurrences, pass_ops

    entry = _app_entry(PROFILES, "rn50_pipeline/profile.h5")
    ops, trace = entry.profile.ops, entry.profile.trace
    compute = trace[trace["kind"] == "compute"]
    runs = compute[compute["microbatch"] == 2]
    ran = {(r["ipu"], r["stage"], r["pass"]) for r in runs.to_dict("records")}
    q = parse_query(typed)
    plain = _unnarrowed(ops, q)
    want = [r["op_id"] for r in plain.to_dict("records")
            if (r["ipu"], r["stage"], r["pass"]) in ran]
    assert 0 < len(want) < len(plain) or q.passes  # the update's ops are left out
    text, queries = _found(entry, typed)
    assert f"{len(want):,} op(s) match" in text, text
    assert [int(x["op"]) for x in queries] == want[:len(queries)] and len(queries) == 20
    templates = pass_ops(ops)
    for link in queries:
        op = ops[ops["op_id"] == int(link["op"])].iloc[0]
        t0, t1 = float(link["t0"]), float(link["t1"])
        assert int(link["ipu"]) == op["ipu"]
        mine = compute[(compute["ipu"] == op["ipu"]) & (compute["stage"] == op["stage"])
                       & (compute["pass"] == op["pass"])]
        # the window overlaps micro-batch 2's run of the op's stage and pass, no other's
        over = mine[(mine["start"] < t1) & (mine["end"] > t0)]
        assert set(over["microbatch"]) == {2}, (link, over)
        at = op_occurrences(over, templates, int(op["op_id"]))
        assert len(at) == 1 and t0 <= at["start"][0] <= at["end"][0] <= t1
    assert ", mb 2, " in text


def test_mb_beyond_the_runs_micro_batches_says_so_in_one_line() -> None:
    """`mb:99999` matched every op of a modelled run; now one line names the run's
    micro-batches instead (a measured run's too)."""
    for rel in ("rn50_pipeline/profile.h5", "tutorial_measured_2ranks/profile.h5"):
        entry = _app_entry(PROFILES, rel)
        mb = entry.profile.trace["microbatch"]
        last = int(mb.max())
        assert sorted(set(mb[mb >= 0])) == list(range(last + 1))
        for typed in ("mb:99999", f"pass:B mb:{last + 1} conv"):
            text, queries = _found(entry, typed)
            n = typed.split("mb:")[1].split()[0]
            assert text == f"micro-batch {n}: this run has micro-batches 0-{last}.", text
            assert queries == []


def _holding(ops: pd.DataFrame, trace: pd.DataFrame) -> list[int]:
    """A plain walk: per op, the micro-batch of the latest-starting trace event on its
    device that names one, is the host's own time (not a kernel) and holds the op's
    start; -1 where none does."""
    ev = trace[(trace["microbatch"] >= 0)
               & ((trace["host_op"] == "") | (trace["host_op"] == trace["op"]))]
    by_ipu = {ipu: g.to_dict("records") for ipu, g in ev.groupby("ipu")}
    out = []
    for r in ops.to_dict("records"):
        if r.get("microbatch", -1) >= 0:
            out.append(int(r["microbatch"]))
            continue
        held = [e for e in by_ipu.get(r["ipu"], [])
                if e["start"] <= r["start"] < e["end"] or e["start"] == e["end"] == r["start"]]
        best = max(held, key=lambda e: (e["start"], e["start"] - e["end"]), default=None)
        out.append(-1 if best is None else int(best["microbatch"]))
    return out


@pytest.mark.parametrize("typed", ["mb:1", "pass:B mb:1", "aten::mm mb:3"])
def test_mb_on_a_measured_run_keeps_the_ops_that_ran_in_it(typed: str) -> None:
    """A CPU-measured run's ops carry no micro-batch (-1), so `mb:1` said 'Nothing
    matches': an op is matched by the micro-batch of the trace's event its time falls in
    (its own top-level op's, a transfer's or a wait's)."""
    entry = _app_entry(PROFILES, "tutorial_measured_2ranks/profile.h5")
    ops, trace = entry.profile.ops, entry.profile.trace
    assert set(ops["microbatch"]) == {-1}  # the ops table cannot tell
    q = parse_query(typed)
    plain = _unnarrowed(ops, q).sort_values(["start", "op_id"], kind="stable")
    mbs = dict(zip(ops["op_id"], _holding(ops, trace), strict=True))
    want = [i for i in plain["op_id"] if mbs[i] == q.microbatch]
    assert want
    # every top-level op that is itself a trace event of that micro-batch is among them
    tops = ops[ops["top_level"]].merge(
        trace[(trace["kind"] == "compute") & (trace["microbatch"] == q.microbatch)],
        on=["ipu", "start", "end"], suffixes=("", "_event"))
    assert set(tops["op_id"]) & set(plain["op_id"]) <= set(want)
    text, queries = _found(entry, typed)
    assert "Nothing matches" not in text and f"{len(want):,} op(s) match" in text, text
    assert [int(x["op"]) for x in queries] == want[:20]  # in time order
    start = dict(zip(ops["op_id"], ops["start"], strict=True))
    for link in queries:  # the op itself in view
        assert float(link["t0"]) <= start[int(link["op"])] <= float(link["t1"])


def test_op_microbatches_takes_the_event_that_holds_an_ops_start() -> None:
    """Nested and overlapping events: the latest to start that still holds the op."""
    from popviz.analysis.find import op_microbatches

    trace = pd.DataFrame({"ipu": [0, 0, 0, 1], "start": [0, 10, 40, 0],
                          "end": [100, 20, 50, 100], "microbatch": [0, 1, 2, 3],
                          "op": ["wait", "x", "y", "z"], "host_op": ["", "x", "y", "k"]})
    ops = pd.DataFrame({"op_id": range(6), "ipu": [0, 0, 0, 0, 1, 0],
                        "start": [5, 12, 30, 45, 50, 200], "end": [6, 13, 31, 46, 51, 201],
                        "microbatch": [-1, -1, -1, -1, -1, 7]})
    # 30: event 1 (10-20) has ended, event 0 (0-100) holds it; rank 1's event is a kernel
    assert op_microbatches(ops, trace).tolist() == [0, 1, 0, 2, -1, 7]


def test_mb_where_the_profile_cannot_tell_says_so(cuda_root: Path) -> None:
    """A recording without micro-batches (an import of one training step): `mb:1` says
    the profile cannot tell, not 'Nothing matches', and the rest of what was typed is
    answered (`mb:2 pass:F` gave the note alone: the pass was dropped unsaid)."""
    rel = next(cuda_root.rglob("*.h5")).relative_to(cuda_root).as_posix()
    entry = _app_entry(cuda_root, rel)
    assert (entry.profile.trace["microbatch"] < 0).all()
    text, queries = _found(entry, "mb:1 conv")
    plain_text, plain = _found(entry, "conv")
    assert text.startswith("micro-batch 1: this profile cannot tell which micro-batch its "
                           "ops ran in. Found without mb:1:")
    assert "op(s)" in plain_text and queries == plain  # as if mb:1 was not typed
    passed, forward = _found(entry, "mb:2 pass:F")
    assert "Found without mb:2" in passed and forward == _found(entry, "pass:F")[1]
    assert forward and all(entry.profile.ops.set_index("op_id").loc[int(q["op"]), "pass"]
                           == "F" for q in forward)


def test_a_found_kernel_is_named_by_its_function(cuda_root: Path) -> None:
    """Find 'conv' listed a template kernel by its whole name, 1,200 characters over 12
    lines: its function now, the whole name on hover."""
    from dash import html
    from popviz_app.trace_find import found_list

    from tests.dash_util import find_components

    rel = next(cuda_root.rglob("*.h5")).relative_to(cuda_root).as_posix()
    shown = html.Div(found_list(_app_entry(cuda_root, rel), "cudnn"))
    kernels = [li for li in find_components(shown, "Li") if getattr(li, "title", None)]
    assert kernels
    longest = max(kernels, key=lambda li: len(li.title))
    assert len(longest.title) > 200 and longest.title not in str(longest.children)
    text = str(find_components(longest, "Link")[0].children)
    assert text.startswith("kernel ") and len(text) < 200
