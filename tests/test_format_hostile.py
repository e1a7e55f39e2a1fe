"""Hostile and damaged profiles: every way a file can be wrong ends in one ProfileError.

Each case tampers with a valid tiny profile the way the fuzzing of issue 10 found escapes
(IndexError, KeyError, TypeError, RecursionError, MemoryError, pandas errors) or the way an
attacker would (declared sizes far beyond what the file holds), and checks the reader
refuses it with one line naming the file and the table, before allocating anything big.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

import popviz
from popviz.format import schema
from popviz.format.isolated import read_everything
from tests.test_format import write_tiny

Mutate = Callable[[h5py.File], None]


def tampered(tmp_path: Path, mutate: Mutate) -> Path:
    path = write_tiny(tmp_path / "bad.h5")
    with h5py.File(path, "a") as h5:
        mutate(h5)
    return path


def refused(path: Path, *fragments: str) -> str:
    """Open and read everything; the one ProfileError's message."""
    with pytest.raises(popviz.ProfileError) as info, popviz.open(path) as profile:
        read_everything(profile)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def _set_code(table: str, column: str, code: int) -> Mutate:
    def mutate(h5: h5py.File) -> None:
        data = h5[f"tables/{table}/{column}"]
        values = data[()]
        values[0] = code
        data[...] = values
    return mutate


@pytest.mark.parametrize("code", [10**6, -1])
def test_string_reference_outside_the_table(tmp_path: Path, code: int) -> None:
    path = tampered(tmp_path, _set_code("trace", "kind", code))
    refused(path, "table 'trace' column 'kind'", f"string reference {code}")


def test_int_or_string_reference_outside_the_table(tmp_path: Path) -> None:
    refused(tampered(tmp_path, _set_code("exchange", "src", -5)), "table 'exchange'")


def _attr(key: str, value: object) -> Mutate:
    def mutate(h5: h5py.File) -> None:
        h5.attrs[key] = value
    return mutate


@pytest.mark.parametrize(("key", "value", "fragment"), [
    ("meta", "42", "'meta' is JSON int, not an object"),
    ("meta", "[" * 100_000 + "]" * 100_000, "nests 100000 deep"),
    ("meta", "{not json", "'meta' is not JSON"),
    ("meta", '{"target": [1, 2]}', "meta 'target' is list"),
    ("meta", '{"target": {"num_ipus": -3}}', "meta target 'num_ipus'"),
    ("meta", '{"model": "resnet"}', "meta 'model' is str"),
    ("summary", '"x"', "'summary' is JSON str"),
    ("meta", np.arange(3), "attribute 'meta' is ndarray"),
    ("format_version", 7, "attribute 'format_version' is int64, not text"),
    ("kind", np.float64(1.5), "attribute 'kind' is float64"),
])
def test_root_attributes_checked(tmp_path: Path, key: str, value: object,
                                 fragment: str) -> None:
    refused(tampered(tmp_path, _attr(key, value)), fragment)


def test_meta_deleted(tmp_path: Path) -> None:
    def mutate(h5: h5py.File) -> None:
        del h5.attrs["meta"]
    refused(tampered(tmp_path, mutate), "no 'meta' attribute")


def test_column_is_a_group(tmp_path: Path) -> None:
    def mutate(h5: h5py.File) -> None:
        del h5["tables/ops/op"]
        h5["tables/ops"].create_group("op")
    refused(tampered(tmp_path, mutate), "table 'ops' lacks column 'op'")


def test_duplicate_column_order(tmp_path: Path) -> None:
    def mutate(h5: h5py.File) -> None:
        order = [c.decode() for c in h5["tables/stages"].attrs["column-order"]]
        h5["tables/stages"].attrs["column-order"] = np.array(order + order[:1], dtype=object)
    refused(tampered(tmp_path, mutate), "table 'stages'", "repeats a name")


@pytest.mark.parametrize("value", ["many", -4, True, 2.5])
def test_n_rows_not_a_count(tmp_path: Path, value: object) -> None:
    def mutate(h5: h5py.File) -> None:
        h5["tables/liveness"].attrs["n_rows"] = value
    refused(tampered(tmp_path, mutate), "table 'liveness'", "n_rows")


def test_text_where_numbers_are_required(tmp_path: Path) -> None:
    def mutate(h5: h5py.File) -> None:
        h5["tables/stages/forward_cycles"].attrs["encoding"] = schema.ENC_STRING_REF
    refused(tampered(tmp_path, mutate), "column 'forward_cycles'", "expected numbers")


def test_strings_stored_in_a_numeric_column(tmp_path: Path) -> None:
    def mutate(h5: h5py.File) -> None:
        del h5["tables/stages/peak_bytes"]
        data = h5["tables/stages"].create_dataset("peak_bytes", data=np.array([b"a", b"b"]))
        data.attrs["encoding"] = schema.ENC_NUMERIC
    refused(tampered(tmp_path, mutate), "column 'peak_bytes'", "not numbers")


def test_unknown_encoding(tmp_path: Path) -> None:
    def mutate(h5: h5py.File) -> None:
        h5["tables/trace/start"].attrs["encoding"] = "pickle"
    refused(tampered(tmp_path, mutate), "column 'start'", "unknown encoding")


@pytest.mark.parametrize(("table", "column", "value", "fragment"), [
    ("stages", "forward_cycles", np.nan, "NaN"),
    ("stages", "idle_cycles", -1.0, "negative"),
    ("tile_memory", "total_bytes", -7, "negative"),
    ("liveness", "always_live_bytes", np.inf, "NaN or infinite"),
])
def test_values_outside_the_schema(tmp_path: Path, table: str, column: str, value: float,
                                   fragment: str) -> None:
    def mutate(h5: h5py.File) -> None:
        old = h5[f"tables/{table}/{column}"]
        values = old[()].astype(np.float64)
        values[-1] = value
        del h5[f"tables/{table}/{column}"]
        new = h5[f"tables/{table}"].create_dataset(column, data=values)
        new.attrs["encoding"] = schema.ENC_NUMERIC
    refused(tampered(tmp_path, mutate), f"table '{table}' column '{column}'", fragment)


def _huge_column(rows: int) -> Mutate:
    """Every liveness column declares `rows` rows, with no data behind them."""
    def mutate(h5: h5py.File) -> None:
        group = h5["tables/liveness"]
        group.attrs["n_rows"] = rows
        for column in [c.decode() for c in group.attrs["column-order"]]:
            encoding = group[column].attrs["encoding"]
            dtype = group[column].dtype
            del group[column]
            data = group.create_dataset(column, shape=(rows,), dtype=dtype,
                                        chunks=(1 << 16,), compression="gzip")
            data.attrs["encoding"] = encoding
    return mutate


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_huge_declared_rows_refused_without_allocating(tmp_path: Path) -> None:
    path = tampered(tmp_path, _huge_column(10**8))
    assert path.stat().st_size < 1 << 20
    before = _peak_rss_mb()
    refused(path, "table 'liveness'", "declares")
    assert _peak_rss_mb() - before < 100


def test_huge_declared_rows_within_budget_still_need_their_bytes(tmp_path: Path) -> None:
    path = tampered(tmp_path, _huge_column(10**6))  # 8 MB a column, stored in ~0
    refused(path, "table 'liveness'", "stores")


def test_tile_liveness_declared_beyond_budget(tmp_path: Path) -> None:
    def mutate(h5: h5py.File) -> None:
        del h5["arrays/tile_liveness"]
        h5["arrays"].create_dataset("tile_liveness", shape=(2, 2**31, 1472), dtype=np.uint32,
                                    chunks=(1, 64, 1472), compression="gzip")
    before = _peak_rss_mb()
    refused(tampered(tmp_path, mutate), "array 'tile_liveness'", "budget")
    assert _peak_rss_mb() - before < 100


def test_tile_liveness_of_the_wrong_rank(tmp_path: Path) -> None:
    def mutate(h5: h5py.File) -> None:
        del h5["arrays/tile_liveness"]
        h5["arrays"].create_dataset("tile_liveness", data=np.zeros((2, 3), dtype=np.uint32))
    refused(tampered(tmp_path, mutate), "array 'tile_liveness'", "shape")


def test_trace_index_out_of_order(tmp_path: Path) -> None:
    def mutate(h5: h5py.File) -> None:
        del h5["index/trace_offsets"]
        h5["index"].create_dataset("trace_offsets", data=np.array([0, 9, 4], dtype=np.int64))
    path = tampered(tmp_path, mutate)
    with popviz.open(path) as profile, pytest.raises(popviz.ProfileError, match="offsets"):
        profile.trace_for(0)


def test_summary_cli_is_one_line_exit_1(tmp_path: Path) -> None:
    path = tampered(tmp_path, _attr("meta", "42"))
    out = subprocess.run([sys.executable, "-m", "popviz.cli.main", "summary", "--json",
                          str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("popviz: error: ") and str(path) in lines[0]




@pytest.mark.parametrize(("name", "make", "fragment"), [
    ("strings/offsets", lambda off: off[::-1].copy(), "offsets are not increasing"),
    ("strings/offsets", lambda off: off + 10**9, "offsets are not increasing"),
    ("strings/offsets", lambda off: off[:0], "offsets 1-D"),
    ("strings/bytes", lambda blob: np.full(len(blob), 0xFF, dtype=np.uint8), "not UTF-8"),
    ("strings/bytes", lambda blob: blob.astype(np.int64), "uint8"),
])
def test_damaged_string_table(tmp_path: Path, name: str,
                              make: Callable[[np.ndarray], np.ndarray], fragment: str) -> None:
    path = write_tiny(tmp_path / "bad.h5")
    with h5py.File(path, "a") as h5:
        data = make(h5[name][()])
        del h5[name]
        h5.create_dataset(name, data=data)
    refused(path, "string table", fragment)


def test_column_order_lacks_a_required_column(tmp_path: Path) -> None:
    def mutate(h5: h5py.File) -> None:
        order = [c.decode() for c in h5["tables/trace"].attrs["column-order"]]
        h5["tables/trace"].attrs["column-order"] = np.array(order[1:], dtype=object)
    refused(tampered(tmp_path, mutate), "table 'trace'", "lacks required column 'ipu'")


def test_text_attributes_are_fixed_length(tmp_path: Path) -> None:
    """1.1 keeps attribute text out of HDF5's global heap (damage there loops)."""
    path = write_tiny(tmp_path / "x.h5")
    with h5py.File(path) as h5:
        for obj in (h5, h5["tables/trace"], h5["tables/trace/kind"]):
            for key in obj.attrs:
                dtype = obj.attrs.get_id(key).dtype
                assert dtype.kind in "iuf" or h5py.check_string_dtype(dtype).length, key


@pytest.mark.parametrize(("patch", "fragment"), [
    (lambda raw, at: raw.__setitem__(slice(at + 8, at + 16), (2**40).to_bytes(8, "little")),
     "size"),
    (lambda raw, at: raw.__setitem__(slice(at, at + 4), b"XXXX"), "no collection signature"),
    (lambda raw, at: raw.__setitem__(slice(at + 16, at + 18), (999).to_bytes(2, "little")),
     "points at no heap object"),
])
def test_format_1_0_damaged_global_heap_is_refused_not_followed(
        tmp_path: Path, patch: Callable[[bytearray, int], None], fragment: str) -> None:
    """1.0 files are refused by their version before the string table is read: a damaged
    vlen heap, which made libhdf5 loop for ever in the fuzzing, is never followed."""
    from tests.profiles_util import to_format_1_0

    path = to_format_1_0(write_tiny(tmp_path / "old.h5"))
    raw = bytearray(path.read_bytes())
    at = raw.find(b"GCOL")
    assert at > 0
    patch(raw, at)
    path.write_bytes(bytes(raw))
    message = refused(path)
    # the heap also holds the 1.0 text attributes, which libhdf5 itself may reject first
    assert "regenerate it" in message or "damaged profile" in message, message
    assert fragment not in message  # the heap's own damage is never reached
