"""A kernel's launch (grid, block, registers, shared memory, CUPTI's occupancy estimates)
from torch.profiler's kernel events into the `kernels` table (format 1.4) and the stream
lanes' hover, checked against the H100 recording read with json alone."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import popviz
from popviz.figures.trace_threads import launch_lines
from popviz.ingest import kineto, kineto_fast
from popviz.ingest.kineto_launch import dimensions, dimensions_text, number_text
from tests.import_fixtures import RESNET, trace_events


def test_every_kernel_of_the_recording_keeps_its_launch(resnet: Any) -> None:
    kernels = resnet.table("kernels").set_index("correlation")
    events = [e for e in trace_events(RESNET) if e.get("cat") == "kernel"]
    assert len(kernels) == len(events) > 700 and kernels.index.is_unique
    for event in events:
        args = event["args"]
        row = kernels.loc[args["correlation"]]
        assert row["grid"] == ",".join(map(str, args["grid"]))
        assert row["block"] == ",".join(map(str, args["block"]))
        assert row["registers"] == args["registers per thread"]
        assert row["shared_bytes"] == args["shared memory"]
        assert row["occupancy_pct"] == args["est. achieved occupancy %"]
        assert row["blocks_per_sm"] == pytest.approx(args["blocks per SM"], rel=1e-12)
        assert row["warps_per_sm"] == pytest.approx(args["warps per SM"], rel=1e-12)
    # every kernel row of the trace finds its launch
    trace = resnet.trace
    assert set(kernels.index) <= set(trace["correlation"])


def test_the_hover_says_the_launch_in_words(resnet: Any) -> None:
    trace, kernels = resnet.trace, resnet.table("kernels")
    first = next(e for e in trace_events(RESNET) if e.get("cat") == "kernel")["args"]
    row = trace[trace["correlation"] == first["correlation"]]
    grid = "×".join(map(str, first["grid"]))
    block = "×".join(map(str, first["block"]))
    want = (f"grid {grid} · block {block}<br>{first['registers per thread']} registers a "
            f"thread · {first['shared memory']:,} B shared memory<br>occupancy "
            f"{first['est. achieved occupancy %']:.0f}% (CUPTI's estimate) · grid over the "
            f"SMs: {first['blocks per SM']:,.1f} blocks and {first['warps per SM']:,.1f} "
            "warps each")
    assert launch_lines(row, kernels).tolist() == [want]
    # a kernel the table does not hold, or no table (a 1.3 profile): nothing added
    assert launch_lines(row, kernels.iloc[:0]).tolist() == [""]
    assert launch_lines(row, None).tolist() == [""]
    partial = kernels.assign(grid="", registers=np.nan, blocks_per_sm=np.nan)
    assert launch_lines(row, partial).tolist() == [
        f"block {block}<br>{first['shared memory']:,} B shared memory<br>occupancy "
        f"{first['est. achieved occupancy %']:.0f}% (CUPTI's estimate) · "
        f"grid over the SMs: {first['warps per SM']:,.1f} warps each"]
    # Kineto's 0% is CUPTI failing to estimate (one block, opt-in shared memory), and its
    # per-SM figures are the grid's share: 95 warps a SM is no resident count (64 at most)
    zero = kernels.assign(occupancy_pct=0.0)
    assert "occupancy not estimated (CUPTI gives 0%)" in launch_lines(row, zero)[0]


ODD = [  # (args of a kernel event) -> what both readers keep
    ({"grid": [4, 2, 1], "block": [128], "registers per thread": 255}, ("4,2,1", "128", 255.0)),
    ({"grid": [0, -1], "registers per thread": 10**400}, ("0,-1", "", math.nan)),
    ({"grid": "4,2,1", "block": [1.5, 1, 1], "shared memory": "48"}, ("", "", math.nan)),
    ({"grid": [1, 2, 3, 4], "est. achieved occupancy %": 1e999}, ("", "", math.nan)),
    ({"grid": [True, 1, 1], "warps per SM": -3.25}, ("", "", math.nan)),
]


def _trace(tmp_path: Path, args: dict[str, Any]) -> Path:
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
               "ts": 10.0, "dur": 5.0, "args": {"External id": 1}},
              {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 12.0,
               "dur": 2.0, "args": {"stream": 7, "correlation": 9, **args}},
              {"ph": "X", "cat": "kernel", "name": "bare", "pid": 0, "tid": 7, "ts": 15.0,
               "dur": 1.0, "args": {"stream": 7, "correlation": 10}}]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": events}, indent=1))
    return path


@pytest.mark.parametrize(("args", "want"), ODD)
def test_both_readers_keep_the_same_launch_of_odd_values(
        tmp_path: Path, args: dict[str, Any], want: tuple) -> None:
    path = _trace(tmp_path, args)
    data = kineto.read_bytes(path)
    general, _, _ = kineto.read_general(data, path)
    begin = kineto._KEY.search(data).end() - 1
    fast, _ = kineto_fast.fast_frames(data, begin, kineto.array_end(data, begin, path)[0])
    for spans in (general, fast):
        launch = spans["launch"].tolist()
        assert launch[0] is None and launch[2] is None  # a CPU op; a kernel without args
        assert launch[1][:2] == want[:2]
        assert launch[1][2] == want[2] or (math.isnan(launch[1][2]) and math.isnan(want[2]))
    assert pd.Series(general["launch"]).astype(str).tolist() == \
        pd.Series(fast["launch"]).astype(str).tolist()


def test_raw_text_reads_as_the_decoded_value() -> None:
    for value in ([1568, 1, 64], [7], [], [1, 2, 3, 4], [-1, 0, 2], "1,2", None):
        raw = (json.dumps(value, indent=1) + ",\n}").encode()
        assert dimensions_text(raw) == dimensions(value), value
    assert number_text(b"760.242432,\n") == 760.242432
    assert dimensions_text(b"[--1],") == dimensions_text(b"[01],") == ""  # not JSON ints
    assert math.isnan(number_text(b'"32",')) and math.isnan(number_text(b"null}"))


def test_a_trace_without_launch_fields_has_no_kernels_table(tmp_path: Path) -> None:
    path = _trace(tmp_path, {})
    with popviz.open(popviz.import_trace([path], tmp_path / "out")) as profile:
        assert "kernels" not in profile.table_names
        assert profile.table("kernels").empty  # read back empty, as from a 1.3 file


def test_the_chrome_trace_export_gives_each_kernel_its_launch_back(resnet: Any) -> None:
    from popviz.format.export import chrome_trace

    source = {e["args"]["correlation"]: e["args"] for e in trace_events(RESNET)
              if e.get("cat") == "kernel"}
    exported = [e for e in chrome_trace(resnet)["traceEvents"] if "grid" in e.get("args", {})]
    assert len(exported) == len(source)
    trace = resnet.trace
    by_time = {round(s / 1e3, 3): c for s, c in zip(trace["start"], trace["correlation"])}
    for event in exported:
        args = source[by_time[round(event["ts"], 3)]]
        for key in ("grid", "block", "registers per thread", "shared memory",
                    "est. achieved occupancy %", "blocks per SM", "warps per SM"):
            assert event["args"][key] == args[key], key


def test_a_key_that_shares_a_launch_keys_first_16_bytes_is_not_it(tmp_path: Path) -> None:
    """The vectorised reader confirms a key past 16 bytes on all of it: "registers per
    thumbs" is not "registers per thread" (same length, same first 16 bytes)."""
    path = _trace(tmp_path, {"grid": [1, 1, 1]})
    text = path.read_text().replace('"grid"', '"registers per thumbs": 77, "grid"')
    path.write_text(text)
    data = kineto.read_bytes(path)
    general, _, _ = kineto.read_general(data, path)
    begin = kineto._KEY.search(data).end() - 1
    fast, _ = kineto_fast.fast_frames(data, begin, kineto.array_end(data, begin, path)[0])
    for spans in (general, fast):
        assert math.isnan(spans["launch"][1][2])  # no registers read from the look-alike


def test_kernels_sharing_a_correlation_get_no_launch(tmp_path: Path) -> None:
    """Kernels replayed from one CUDA graph share their launch's correlation id: the table
    keeps no launch for them rather than a neighbour's, and a copy without an id borrows
    none."""
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7,
               "ts": 10.0 + i, "dur": 0.5,
               "args": {"stream": 7, "grid": [i + 1, 1, 1], **corr}}
              for i, corr in enumerate([{"correlation": 9}, {"correlation": 9}, {},
                                        {"correlation": 11}])]
    events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0,
                   "tid": 7, "ts": 20.0, "dur": 1.0, "args": {"stream": 7, "bytes": 64}})
    path = tmp_path / "graph.json"
    path.write_text(json.dumps({"traceEvents": events}))
    with popviz.open(popviz.import_trace([path], tmp_path / "out")) as profile:
        kernels, trace = profile.table("kernels"), profile.trace
    assert kernels["correlation"].tolist() == [11] and kernels["grid"].tolist() == ["4,1,1"]
    gpu = trace[trace["stream"] >= 0]
    lines = dict(zip(gpu["op"].astype(str), launch_lines(gpu, kernels), strict=True))
    assert lines["k3"].startswith("grid 4×1×1")
    assert lines["k0"] == lines["k1"] == lines["k2"] == lines["Memcpy HtoD"] == ""
