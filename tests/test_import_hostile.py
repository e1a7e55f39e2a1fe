"""Hostile traces and snapshots (issue 22): the import reader stays linear, bounds what it
allocates, drops or refuses values outside the profile format, and every failure is one
line naming the file (exit 1), never a traceback or a usage error."""

from __future__ import annotations

import gzip
import json
import pickle
import time
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

import popviz
from popviz.cli.main import main
from popviz.format.isolated import read_everything
from popviz.ingest import import_limits as limits
from popviz.ingest import kineto
from popviz.ingest.import_checks import check_tables
from popviz.measure.merge import _check
from tests.import_fixtures import PIPELINE, SNAPSHOT

RESNET_TRACE = Path(__file__).parent / "fixtures" / "kineto_resnet50_b64.json.gz"


def synthetic(events: int, name: str = "aten::add") -> dict[str, Any]:
    """A CPU trace of `events` top-level ops, in torch.profiler's key order."""
    evs = [{"ph": "X", "cat": "cpu_op", "name": name if i == events // 2 else "aten::mm",
            "pid": 1, "tid": 1, "ts": 1000.0 + 10 * i, "dur": 5.0,
            "args": {"External id": i, "Input Dims": [[64, 64], [64, 64]]}}
           for i in range(events)]
    return {"traceEvents": evs, "baseTimeNanoseconds": 1_700_000_000_000_000_000}


def write(path: Path, doc: dict[str, Any] | bytes) -> Path:
    path.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return path


def one_line_error(capsys: pytest.CaptureFixture[str], args: list[str],
                   name: str) -> str:
    assert main(["import", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and name in err, err
    return err


def test_a_bad_escape_in_a_large_trace_is_refused_in_linear_time(tmp_path: Path) -> None:
    text = json.dumps(synthetic(60_000, "PLACEHOLDER")).encode()  # ~9 MB: slices of 4 MiB
    assert len(text) > 2 * kineto.CHUNK_BYTES
    bad = write(tmp_path / "bad.json", text.replace(b'"PLACEHOLDER"', b'"aten::a\\qdd"'))
    began = time.monotonic()
    with pytest.raises(popviz.ProfileError, match=r"bad\.json: not valid JSON in "
                       r"traceEvents near byte [\d,]+: Invalid \\escape"):
        popviz.import_trace([bad], tmp_path / "out")
    assert time.monotonic() - began < 15  # was 31 s at 8.8 MB, quadratic in the size
    assert not (tmp_path / "out").exists()


def test_a_long_backslash_run_and_huge_numbers_stay_linear(tmp_path: Path,
                                                           capsys: Any) -> None:
    run = "\\" * 400_000  # 800,000 in the file, inside a name: under the string bound
    began = time.monotonic()
    path = popviz.import_trace([write(tmp_path / "slashes.json", synthetic(2000, run))],
                               tmp_path / "a")
    assert time.monotonic() - began < 15  # the old escape scan stepped once per backslash
    with popviz.open(path) as p:
        assert p.ops["op"].str.len().max() == len(run)
    digits = json.dumps(synthetic(2000)).encode().replace(b'"dur": 5.0', b'"dur": '
                                                          + b"7" * 5000, 1)
    err = one_line_error(capsys, [str(write(tmp_path / "digits.json", digits)), "--to",
                                  str(tmp_path / "b")], "digits.json")
    assert "not valid JSON" in err and "5000 digits" in err


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity", b"1e308",
                                   b"9223372036854775808", b'"soon"', b"1" * 300])
def test_a_time_outside_the_format_is_dropped_with_a_counted_warning(
        value: bytes, tmp_path: Path) -> None:
    text = json.dumps(synthetic(200)).encode().replace(b'"dur": 5.0', b'"dur": ' + value, 1)
    warnings: list[str] = []
    path = popviz.import_trace([write(tmp_path / "t.json", text)], tmp_path / "out",
                               on_warning=warnings.append)
    assert warnings == ["t.json: 1 event(s) whose ts or dur is not a finite number of µs "
                        f"within {limits.MAX_TIME_NS // 1000:,} dropped"]
    with popviz.open(path) as p:
        read_everything(p)
        assert len(p.ops) == 199 and p.trace["end"].min() >= 0
        assert p.trace["end"].max() < 10**12  # no -2**63 wrapped into the times


def test_declared_sizes_are_bounded_before_anything_is_built(tmp_path: Path,
                                                             capsys: Any) -> None:
    raw = gzip.decompress(PIPELINE.read_bytes())
    cases = {"world": (b'"world_size": 1', b'"world_size": 1000000000000',
                       "world_size 1000000000000 is not a count of ranks"),
             "rank": (b'"rank": 0', b'"rank": -1', "rank -1 is not a rank of its world"),
             "base": (b'"baseTimeNanoseconds": 1', b'"baseTimeNanoseconds": -1',
                      "baseTimeNanoseconds -1")}
    for name, (old, new, why) in cases.items():
        assert old in raw
        path = write(tmp_path / f"{name}.json", raw.replace(old, new, 1))
        began = time.monotonic()
        err = one_line_error(capsys, [str(path), "--to", str(tmp_path / name)],
                             f"{name}.json")
        assert why in err and time.monotonic() - began < 10
    deep = raw.replace(b'"args": {', b'"args": {"d": ' + b"[" * 50_000 + b"]" * 50_000
                       + b",", 1)
    err = one_line_error(capsys, [str(write(tmp_path / "deep.json", deep)), "--to",
                                  str(tmp_path / "deep")], "deep.json")
    assert "nests more than 64 brackets deep" in err


def test_a_long_string_and_too_many_events_are_refused(tmp_path: Path,
                                                       monkeypatch: Any) -> None:
    monkeypatch.setattr(limits, "MAX_STRING_BYTES", 1000)
    with pytest.raises(popviz.ProfileError, match=r"long\.json: a string in traceEvents is "
                       r"longer than 1,000 bytes"):
        popviz.import_trace([write(tmp_path / "long.json", synthetic(50, "x" * 2000))],
                            tmp_path / "a")
    monkeypatch.setattr(limits, "MAX_EVENTS", 100)
    for doc in (synthetic(150), synthetic(150, "a\\qb")):  # fast reader, general one
        with pytest.raises(popviz.ProfileError, match=r"many\.json: more than 100 events"):
            popviz.import_trace([write(tmp_path / "many.json", doc)], tmp_path / "b")


def test_gzip_bombs_stop_at_the_ratio_bound(tmp_path: Path, capsys: Any) -> None:
    def bomb(head: bytes, filler: bytes) -> bytes:
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        body = [z.compress(head)] + [z.compress(filler * (1 << 20)) for _ in range(100)]
        return b"".join([*body, z.flush()])

    trace = write(tmp_path / "bomb.json.gz", bomb(b'{"traceEvents": [', b" "))
    snap = write(tmp_path / "bomb.pickle.gz", bomb(pickle.dumps({})[:-1], b"\0"))
    for args, name in (([str(trace)], "bomb.json.gz"),
                       ([str(RESNET_TRACE), "--memory-snapshot", str(snap)],
                        "bomb.pickle.gz")):
        began = time.monotonic()
        err = one_line_error(capsys, [*args, "--to", str(tmp_path / "out")], name)
        assert "a gzip bomb?" in err and time.monotonic() - began < 20
    assert not (tmp_path / "out").exists()


def test_snapshot_values_are_checked(tmp_path: Path, capsys: Any) -> None:
    snap = pickle.loads(gzip.decompress(SNAPSHOT.read_bytes()))
    alloc = next(e for e in snap["device_traces"][0] if e["action"] == "alloc")
    for name, value, why in (("negative", -alloc["size"], "below 0 or above 1 PiB"),
                             ("text", "many", "not a number"),
                             ("huge", 10**40, "out of range")):
        bad = dict(snap, device_traces=[[dict(e, size=value) if e is alloc else e
                                         for e in snap["device_traces"][0]]])
        path = write(tmp_path / f"{name}.pickle", pickle.dumps(bad))
        err = one_line_error(capsys, [str(RESNET_TRACE), "--memory-snapshot", str(path),
                                      "--to", str(tmp_path / name)], f"{name}.pickle")
        assert why in err
    junk = write(tmp_path / "junk.pickle", b"\x80\x04\x95" + b"\xff" * 64)
    one_line_error(capsys, [str(RESNET_TRACE), "--memory-snapshot", str(junk), "--to",
                            str(tmp_path / "junk")], "junk.pickle")


def test_text_the_string_table_cannot_hold_is_replaced(tmp_path: Path) -> None:
    text = json.dumps(synthetic(100, "PLACEHOLDER")).encode()
    path = write(tmp_path / "s.json", text.replace(b'"PLACEHOLDER"', b'"\\ud800aten::x"'))
    with popviz.open(popviz.import_trace([path], tmp_path / "out")) as p:
        read_everything(p)
        assert "?aten::x" in set(p.ops["op"])


def test_tables_the_reader_would_refuse_are_never_written() -> None:
    trace = pd.DataFrame({"ipu": [0], "start": [5], "end": [-2**63]})
    with pytest.raises(popviz.ProfileError, match=r"t\.json: damaged table 'trace' column "
                       r"'end' .*nothing written"):
        check_tables({"trace": trace}, {}, "t.json")
    live = pd.DataFrame({"ipu": [0], "step": [0], "always_live_bytes": [np.nan],
                         "not_always_live_bytes": [0.0]})
    with pytest.raises(popviz.ProfileError, match="NaN or infinite"):
        check_tables({"liveness": live}, {}, "t.json")


def test_merge_bounds_the_world_a_rank_profile_declares() -> None:
    def rank(r: Any, world: Any) -> SimpleNamespace:
        return SimpleNamespace(kind="measured", path=Path(f"r{r}.h5"), meta={
            "measure": {"rank": r, "world_size": world, "run_id": "x"}})

    began = time.monotonic()
    with pytest.raises(popviz.ProfileError, match=r"r0.h5: meta.measure.world_size "
                       r"1000000000000 is not a whole number in 1..65,536"):
        _check([rank(0, 10**12), rank(1, 10**12)])
    assert time.monotonic() - began < 1
    with pytest.raises(popviz.ProfileError, match=r"r-1\.h5: meta\.measure\.rank -1"):
        _check([rank(0, 2), rank(-1, 2)])
    with pytest.raises(popviz.ProfileError, match=r"rank\(s\) 2, 3, 4, 5, 6, 7, 8, 9, 10, "
                       r"11, \.\.\. \(998 in all\) of 1000 missing"):
        _check([rank(0, 1000), rank(1, 1000)])


def test_fields_after_the_events_with_many_lists_still_read(tmp_path: Path) -> None:
    doc = synthetic(50)
    doc["otherData"] = {"lists": [[i] for i in range(200)]}  # 200 `]` after the array
    trace = kineto.read_trace(write(tmp_path / "after.json", doc))
    assert len(trace.spans) == 50 and len(trace.meta["otherData"]["lists"]) == 200
