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
