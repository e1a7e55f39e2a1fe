"""Profile format v1: round trip, layout, and every way a file can be wrong."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

import popviz
from popviz.format import schema
from popviz.format.writer import write_profile
from tests.profiles_util import tiny_arrays, tiny_meta, tiny_summary, tiny_tables, to_format_1_0


def write_tiny(path: Path, **overrides) -> Path:
    args = dict(meta=tiny_meta(), tables=tiny_tables(), arrays=tiny_arrays(),
                summary=tiny_summary(), kind="modelled", command_line="train.py --profile")
    args.update(overrides)
    return write_profile(path, **args)


def test_round_trip_tables_strings_and_attributes(tmp_path: Path) -> None:
    written = write_tiny(tmp_path / "run")
    assert written == tmp_path / "run" / "profile.h5"
    p = popviz.open(tmp_path / "run")
    tables = tiny_tables()
    for name, expected in tables.items():
        got = p.table(name)
        if name == "trace":
            expected = expected.sort_values(["ipu", "start"], kind="stable").reset_index(drop=True)
        assert list(got.columns) == list(expected.columns), name
        for column in expected.columns:
            assert got[column].tolist() == expected[column].tolist(), (name, column)
    assert p.meta["target"]["tiles_per_ipu"] == 2
    assert p.meta["options"]["splits"] == ["b1/2/relu"]
    assert p.meta["kind"] == "modelled" and p.kind == "modelled"
    assert p.summary == tiny_summary()
    assert p.command_line == "train.py --profile"
    assert p.format_version == schema.FORMAT_VERSION
    assert p.name == "run"
    np.testing.assert_array_equal(p.tile_liveness(1), tiny_arrays()["tile_liveness"][1])
    np.testing.assert_array_equal(p.tile_liveness(0, 1, 3),
                                  tiny_arrays()["tile_liveness"][0, 1:3])


def test_mixed_ipu_or_host_column_keeps_types(tmp_path: Path) -> None:
    p = popviz.open(write_tiny(tmp_path / "x.h5"))
    assert p.exchange["src"].tolist() == [0, "host", 1]
    assert isinstance(p.exchange["src"].iloc[0], int)


def _strings(h5: h5py.File) -> list[str]:
    blob, offsets = h5["strings/bytes"][()].tobytes(), h5["strings/offsets"][()]
    return [blob[a:b].decode() for a, b in itertools.pairwise(offsets)]


def test_strings_are_interned_once(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "x.h5")
    with h5py.File(path) as h5:
        strings = _strings(h5)
        assert len(strings) == len(set(strings))
        assert "compute" in strings
        kind = h5["tables/trace/kind"]
        assert kind.dtype == np.int32 and kind.attrs["encoding"] == b"string-ref"
        order = [c.decode() for c in h5["tables/trace"].attrs["column-order"]]
        assert order == list(tiny_tables()["trace"].columns)


def test_trace_sorted_with_per_ipu_offsets(tmp_path: Path) -> None:
    p = popviz.open(write_tiny(tmp_path / "x.h5"))
    assert p.trace["ipu"].tolist() == [0, 0, 1, 1]
    assert p.trace["start"].tolist() == [0, 100, 0, 50]
    one = p.trace_for(1)
    assert one["ipu"].tolist() == [1, 1] and one["start"].tolist() == [0, 50]
    assert p.trace_for(0, start=150)["start"].tolist() == [100]
    assert p.trace_for(7).empty


def test_columns_are_compressed_and_chunked(tmp_path: Path) -> None:
    n = 300_000
    tables = tiny_tables()
    tables["trace"] = pd.DataFrame({
        "ipu": np.repeat([0, 1], n // 2), "start": np.arange(n), "end": np.arange(n) + 1,
        "kind": ["compute"] * n, "stage": 0, "microbatch": 0, "pass": "F", "op": "x",
    })
    path = write_tiny(tmp_path / "x.h5", tables=tables,
                      arrays={"tile_liveness": np.zeros((2, 2000, 1472), dtype=np.uint32)})
    with h5py.File(path) as h5:
        start = h5["tables/trace/start"]
        assert start.compression == "gzip" and start.shuffle and start.fletcher32
        assert start.chunks[0] * start.dtype.itemsize <= schema.CHUNK_BYTES
        live = h5["arrays/tile_liveness"]
        assert live.chunks[0] == 1 and live.chunks[2] == 1472 and live.fletcher32
        assert 0.25 * schema.CHUNK_BYTES <= np.prod(live.chunks) * 4 <= schema.CHUNK_BYTES


@pytest.mark.skipif(shutil.which("h5dump") is None, reason="needs Debian's hdf5-tools")
def test_h5dump_reads_the_file(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "x.h5")
    out = subprocess.run(["h5dump", "-H", str(path)], capture_output=True, text=True,
                         check=True).stdout
    assert 'ATTRIBUTE "format_version"' in out
    assert 'GROUP "tables"' in out and 'GROUP "strings"' in out
    value = subprocess.run(["h5dump", "-a", "/format", str(path)], capture_output=True,
                           text=True, check=True).stdout
    assert '"popviz-profile"' in value


def test_plain_h5py_reads_without_popviz(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "x.h5")
    code = textwrap.dedent(f"""
        import sys, h5py
        sys.modules['popviz'] = None  # prove popviz is not needed
        with h5py.File({str(path)!r}) as h5:
            blob, offsets = h5['strings/bytes'][()].tobytes(), h5['strings/offsets'][()]
            codes = h5['tables/trace/kind'][()]
            print(sorted({{blob[offsets[c]:offsets[c + 1]].decode() for c in codes}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['compute', 'exchange', 'idle']"


def test_format_1_0_files_are_refused_with_a_regenerate_line(tmp_path: Path) -> None:
    """A 1.0 profile (vlen string table, no checksums) is refused before its strings are
    read, in one line that says what to do; a 1.1 file of the same tables opens."""
    assert popviz.open(write_tiny(tmp_path / "new.h5")).format_version == \
        schema.FORMAT_VERSION
    old = to_format_1_0(write_tiny(tmp_path / "old.h5"))
    with pytest.raises(popviz.ProfileError) as info:
        popviz.open(old)
    message = str(info.value)
    assert "\n" not in message and "1.0.0" in message and "regenerate" in message
    assert str(old) in message

def test_damaged_chunk_is_detected_by_its_checksum(tmp_path: Path) -> None:
    """Flip one byte inside a column's stored chunk: Fletcher-32 refuses it on read."""
    n = 50_000
    tables = tiny_tables()
    tables["ops"] = pd.DataFrame({"op_id": np.arange(n), "op": ["x"] * n,
                                  "phase": ["forward"] * n,
                                  "cycles": np.random.default_rng(0).integers(0, 9, n)})
    path = write_tiny(tmp_path / "x.h5", tables=tables)
    with h5py.File(path) as h5:
        data = h5["tables/ops/cycles"]
        offset = data.id.get_chunk_info(0).byte_offset
        size = data.id.get_chunk_info(0).size
    raw = bytearray(path.read_bytes())
    raw[offset + size - 1] ^= 0x10  # the stored checksum itself
    path.write_bytes(bytes(raw))
    with pytest.raises(popviz.ProfileError, match="table 'ops'"):
        popviz.open(path).ops  # noqa: B018 - the read is the test


# ---- errors ----

def expect_error(path: Path, fragment: str) -> None:
    with pytest.raises(popviz.ProfileError) as info:
        popviz.open(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert fragment in message


def test_missing_file(tmp_path: Path) -> None:
    expect_error(tmp_path / "nope.h5", "no such file")


def test_not_hdf5(tmp_path: Path) -> None:
    bad = tmp_path / "bad.h5"
    bad.write_text("hello, not hdf5\n" * 100)
    expect_error(bad, "not an HDF5 file")


def test_empty_file(tmp_path: Path) -> None:
    bad = tmp_path / "empty.h5"
    bad.touch()
    expect_error(bad, "empty file")


def test_truncated(tmp_path: Path) -> None:
    good = write_tiny(tmp_path / "good.h5")
    bad = tmp_path / "trunc.h5"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(popviz.ProfileError) as info:
        p = popviz.open(bad)
        p.trace  # noqa: B018 - a lazily read table may be where truncation shows
    assert str(bad) in str(info.value) and "\n" not in str(info.value)


def test_foreign_hdf5(tmp_path: Path) -> None:
    bad = tmp_path / "foreign.h5"
    with h5py.File(bad, "w") as h5:
        h5["x"] = np.arange(3)
    expect_error(bad, "not a popviz profile")


def test_missing_table(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "x.h5")
    with h5py.File(path, "a") as h5:
        del h5["tables/liveness"]
    expect_error(path, "table 'liveness' is missing")


def test_missing_column(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "x.h5")
    with h5py.File(path, "a") as h5:
        del h5["tables/trace/start"]
    expect_error(path, "lacks column 'start'")


def test_newer_major_version(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "x.h5")
    with h5py.File(path, "a") as h5:
        h5.attrs["format_version"] = "2.0.0"
    expect_error(path, "newer than this popviz reads")


def test_newer_minor_version_still_reads(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "x.h5")
    with h5py.File(path, "a") as h5:
        h5.attrs["format_version"] = "1.7.0"
    assert popviz.open(path).format_version == "1.7.0"


def test_directory_with_several_profiles(tmp_path: Path) -> None:
    write_tiny(tmp_path / "run" / "training")
    write_tiny(tmp_path / "run" / "inference")
    found = popviz.discover(tmp_path / "run")
    assert [p.parent.name for p in found] == ["inference", "training"]
    expect_error(tmp_path / "run", "holds 2 profiles")


def test_writer_refuses_incomplete_tables(tmp_path: Path) -> None:
    tables = tiny_tables()
    del tables["stages"]
    with pytest.raises(ValueError, match="stages"):
        write_tiny(tmp_path / "x.h5", tables=tables)
    assert not list(tmp_path.iterdir())


def test_killed_writer_leaves_no_profile(tmp_path: Path) -> None:
    """SIGKILL mid-write: no .h5 appears; only a temporary name that discover ignores."""
    script = textwrap.dedent(f"""
        import numpy as np, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from tests.profiles_util import tiny_meta, tiny_tables
        from popviz.format.writer import write_profile
        print("ready", flush=True)
        big = np.random.default_rng(0).integers(0, 2**31, size=(8, 6000, 1472), dtype=np.uint32)
        write_profile({str(tmp_path / "out")!r}, meta=tiny_meta(), tables=tiny_tables(),
                      arrays={{"tile_liveness": big}})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out_dir = tmp_path / "out"
        if out_dir.exists() and any(schema.TEMP_MARKER in p.name for p in out_dir.iterdir()):
            break
        time.sleep(0.005)
    else:
        proc.kill()
        pytest.fail("writer never started its temporary file")
    # at once: the writer builds the file in memory and only then writes the temporary
    # one (290 MB here, a few hundred ms), so a pause here could let it finish first
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    leftovers = list((tmp_path / "out").iterdir())
    assert not (tmp_path / "out" / "profile.h5").exists()
    assert all(schema.TEMP_MARKER in p.name for p in leftovers)
    assert popviz.discover(tmp_path) == []
