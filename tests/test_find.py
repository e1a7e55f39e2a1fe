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
