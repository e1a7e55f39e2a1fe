"""Semantic mutants of a profile: well-formed files whose VALUES are hostile (issue 34).

A byte mutant (tooling.testing.fuzz) damages the file; these leave it valid HDF5 with a
valid popviz layout and change what a column says: an IPU of 10^9, a step of -1, a NaN
tile, one 30 MB string. Used by tests/test_value_bounds*.py and bench/bench_fuzz_serve.py.

    set_column(path, "liveness", "ipu", 10**9)          # every row, in place
    set_column(path, "liveness", "ipu", float("nan"))    # rewritten as float64
    huge_string(path, 30 << 20)                          # the most used string grows
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from popviz.format import schema

NAN = float("nan")
VALUES: tuple[float, ...] = (10**9, -1, NAN)


@dataclass(frozen=True)
class Mutation:
    """One change: `column` of `table` set to `value` (all rows, or only row `row`), or
    (table "strings") one string made `value` bytes long."""

    table: str
    column: str
    value: float
    row: int | None = None

    @property
    def label(self) -> str:
        where = "" if self.row is None else f"[{self.row}]"
        if self.table == "strings":
            return f"strings: one of {int(self.value):,} bytes"
        return f"{self.table}.{self.column}{where}={_show(self.value)}"

    def apply(self, path: Path) -> None:
        if self.table == "strings":
            huge_string(path, int(self.value))
        else:
            set_column(path, self.table, self.column, self.value, self.row)


def _show(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{int(value):d}" if float(value).is_integer() else repr(value)


def numeric_columns(path: Path) -> list[tuple[str, str]]:
    """(table, column) of every numeric (not text, not bool) column with rows."""
    found = []
    with h5py.File(path, "r") as h5:
        for table, group in sorted(h5[schema.TABLES_GROUP].items()):
            if not int(group.attrs["n_rows"]):
                continue
            for column in group.attrs["column-order"]:
                name = column.decode() if isinstance(column, bytes) else str(column)
                data = group[name]
                encoding = data.attrs.get("encoding", b"")
                encoding = encoding.decode() if isinstance(encoding, bytes) else str(encoding)
                if encoding == schema.ENC_NUMERIC and data.dtype.kind in "iuf":
                    found.append((table, name))
    return found


def set_column(path: Path, table: str, column: str, value: float,
               row: int | None = None) -> None:
    """Set `column` of `table` to `value` in every row (or row `row`), in place. A value
    the column's dtype cannot hold (NaN, a fraction, a negative in an unsigned column)
    rewrites the column as float64, as a hostile writer could."""
    with h5py.File(path, "a") as h5:
        group = h5[schema.TABLES_GROUP][table]
        data = group[column]
        values = data[()]
        fits = values.dtype.kind == "f" or (
            not math.isnan(value) and float(value).is_integer()
            and np.iinfo(values.dtype).min <= value <= np.iinfo(values.dtype).max)
        if not fits:
            values = values.astype(np.float64)
        where = slice(None) if row is None else row
        values[where] = value
        if fits:
            data[...] = values
            return
        attrs = dict(data.attrs)
        del group[column]
        new = group.create_dataset(column, data=values)
        for key, item in attrs.items():
            new.attrs[key] = item


def huge_string(path: Path, nbytes: int) -> None:
    """Make the string most cells refer to `nbytes` long (the string table rewritten)."""
    with h5py.File(path, "a") as h5:
        counts: dict[int, int] = {}
        for group in h5[schema.TABLES_GROUP].values():
            for data in group.values():
                encoding = data.attrs.get("encoding", b"")
                encoding = encoding.decode() if isinstance(encoding, bytes) else str(encoding)
                if encoding in (schema.ENC_STRING_REF, schema.ENC_INT_OR_STRING):
                    codes, n = np.unique(data[()], return_counts=True)
                    for code, k in zip(codes.tolist(), n.tolist(), strict=True):
                        counts[code] = counts.get(code, 0) + k
        target = max(counts, key=lambda c: counts[c]) if counts else 0
        strings = h5[schema.STRINGS_DATASET]
        blob = strings["bytes"][()].tobytes()
        offsets = strings["offsets"][()].astype(np.int64)
        texts = [blob[a:b] for a, b in itertools.pairwise(offsets.tolist())]
        if not texts:
            texts = [b""]
        texts[target] = (b"x" * nbytes)
        lengths = np.array([len(t) for t in texts], dtype=np.int64)
        del strings["bytes"], strings["offsets"]
        strings.create_dataset("bytes", data=np.frombuffer(b"".join(texts), dtype=np.uint8),
                               chunks=True, compression="gzip", fletcher32=True)
        strings.create_dataset("offsets", data=np.concatenate([[0], np.cumsum(lengths)]),
                               chunks=True, compression="gzip", fletcher32=True)
