"""Checks a profile must pass before and after its data is read (schema.py sets the limits).

Everything here raises `ProfileError` with one line naming the file and the table: a
declared shape, row count or size is compared with the file before anything is allocated,
so a small file cannot make the reader allocate gigabytes, and values are checked against
the schema after reading, so a damaged file is refused rather than shown wrong.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from popviz.errors import ProfileError
from popviz.format import schema

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NUMERIC_KINDS = "biuf"


def text_attr(attrs: h5py.AttributeManager, key: str, label: str, default: str | None = None,
              limit: int = schema.MAX_ATTR_CHARS) -> str:
    """A scalar text attribute; `default` when absent (None: the attribute is required)."""
    if key not in attrs:
        if default is None:
            raise ProfileError(f"{label}: damaged profile (no '{key}' attribute)")
        return default
    value = attrs[key]
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, (bytes, np.bytes_)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise ProfileError(f"{label}: damaged profile (attribute '{key}' is not "
                               "UTF-8)") from None
    if not isinstance(value, str):
        raise ProfileError(f"{label}: damaged profile (attribute '{key}' is "
                           f"{type(value).__name__}, not text)")
    if len(value) > limit:
        raise ProfileError(f"{label}: damaged profile (attribute '{key}' is {len(value):,} "
                           f"characters, more than {limit:,})")
    return str(value)


def json_depth(text: str) -> int:
    """Deepest nesting of [ and { in a JSON text, ignoring brackets inside strings."""
    bare = _JSON_STRING.sub('""', text).encode("utf-8", "replace")
    codes = np.frombuffer(bare, dtype=np.uint8)
    step = np.isin(codes, (ord("["), ord("{"))).astype(np.int64) \
        - np.isin(codes, (ord("]"), ord("}"))).astype(np.int64)
    return int(np.cumsum(step).max()) if len(step) else 0


def json_object(text: str, key: str, label: str) -> dict[str, Any]:
    """Parse a JSON attribute that must be an object; size and depth checked first."""
    if len(text) > schema.MAX_JSON_CHARS:
        raise ProfileError(f"{label}: damaged profile ('{key}' is {len(text):,} characters, "
                           f"more than {schema.MAX_JSON_CHARS:,})")
    depth = json_depth(text)
    if depth > schema.MAX_JSON_DEPTH:
        raise ProfileError(f"{label}: damaged profile ('{key}' JSON nests {depth} deep, "
                           f"more than {schema.MAX_JSON_DEPTH})")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ProfileError(f"{label}: damaged profile ('{key}' is not JSON: "
                           f"{str(exc)[:120]})") from None
    if not isinstance(value, dict):
        raise ProfileError(f"{label}: damaged profile ('{key}' is JSON "
                           f"{type(value).__name__}, not an object)")
    return value


def check_meta(meta: dict[str, Any], label: str) -> None:
    """The parts of `meta` every reader relies on have the documented types."""
    for key in ("target", "options", "model"):
        if key in meta and not isinstance(meta[key], dict):
            raise ProfileError(f"{label}: damaged profile (meta '{key}' is "
                               f"{type(meta[key]).__name__}, not an object)")
    target = meta.get("target", {})
    for key in ("num_ipus", "tiles_per_ipu", "bytes_per_tile", "clock_hz"):
        if key not in target:
            continue
        value = target[key]
        whole = key != "clock_hz"
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value) and value >= 0 and (not whole or value == int(value))
        if not ok:
            raise ProfileError(f"{label}: damaged profile (meta target '{key}' is "
                               f"{str(value)[:40]!r}, not a {'count' if whole else 'rate'})")


def declared_bytes(dataset: h5py.Dataset) -> int:
    return int(np.prod(dataset.shape, dtype=object)) * int(dataset.dtype.itemsize)


def check_storage(dataset: h5py.Dataset, label: str, what: str, file_size: int) -> None:
    """The bytes a dataset declares must be backed by what the file stores for it."""
    declared = declared_bytes(dataset)
    if declared <= schema.SMALL_DATASET_BYTES:
        return
    layout = dataset.id.get_create_plist().get_layout()
    if layout == h5py.h5d.CONTIGUOUS:
        offset = dataset.id.get_offset()
        if offset is None or offset + declared > file_size:
            raise ProfileError(f"{label}: damaged {what} (declares {declared:,} bytes that "
                               "the file does not hold)")
        return
    stored = int(dataset.id.get_storage_size())
    if stored > file_size or declared > stored * schema.MAX_COMPRESSION_RATIO:
        raise ProfileError(f"{label}: damaged {what} (declares {declared:,} bytes but "
                           f"stores {stored:,})")


def numeric_dataset(dataset: h5py.Dataset, label: str, what: str) -> None:
    dtype = dataset.dtype
    if dtype.kind not in _NUMERIC_KINDS or dtype.itemsize > 8 or dtype.shape != ():
        raise ProfileError(f"{label}: damaged {what} (holds {dtype}, not numbers)")


@dataclass(frozen=True)
class TableSpec:
    """What a table group declares, checked against its datasets (nothing read yet)."""

    order: list[str]
    n_rows: int
    encodings: dict[str, str]


def table_spec(group: h5py.Group, name: str, label: str, file_size: int,
               required: tuple[str, ...] = ()) -> TableSpec:
    """Check a table's column list, row count, column datasets, dtypes and sizes."""
    what = f"table '{name}'"
    raw_order = group.attrs.get("column-order", None)
    if raw_order is None:
        raise ProfileError(f"{label}: damaged {what} (no column-order)")
    order_array = np.asarray(raw_order)
    if order_array.ndim != 1 or len(order_array) > schema.MAX_COLUMNS:
        raise ProfileError(f"{label}: damaged {what} (column-order is not a list of names)")
    order = [c.decode("utf-8", "replace") if isinstance(c, bytes) else str(c)
             for c in order_array.tolist()]
    if len(set(order)) != len(order):
        raise ProfileError(f"{label}: damaged {what} (column-order repeats a name)")
    if any(not c or len(c) > schema.MAX_NAME_CHARS for c in order):
        raise ProfileError(f"{label}: damaged {what} (a column name is empty or too long)")
    missing = [c for c in required if c not in order]
    if missing:
        raise ProfileError(f"{label}: damaged {what} (column-order lacks required column "
                           f"'{missing[0]}')")
    n_rows = group.attrs.get("n_rows", None)
    if isinstance(n_rows, np.ndarray) and n_rows.shape == ():
        n_rows = n_rows[()]
    if isinstance(n_rows, (bool, np.bool_)) or not isinstance(n_rows, (int, np.integer)) \
            or n_rows < 0:
        raise ProfileError(f"{label}: damaged {what} (n_rows is {str(n_rows)[:40]!r})")
    n_rows = int(n_rows)
    encodings: dict[str, str] = {}
    row_bytes = 0
    for column in order:
        where = f"{what} column '{column}'"
        dataset = group.get(column)
        if not isinstance(dataset, h5py.Dataset):
            raise ProfileError(f"{label}: damaged profile ({what} lacks column '{column}')")
        if dataset.shape != (n_rows,):
            raise ProfileError(f"{label}: damaged profile ({where} has shape "
                               f"{dataset.shape}, expected ({n_rows},) rows)")
        encoding = text_attr(dataset.attrs, "encoding", label, default="")
        if encoding not in schema.ENCODINGS:
            raise ProfileError(f"{label}: damaged {where} (unknown encoding {encoding!r})")
        numeric_dataset(dataset, label, where)
        if encoding in (schema.ENC_STRING_REF, schema.ENC_INT_OR_STRING) \
                and dataset.dtype.kind not in "iu":
            raise ProfileError(f"{label}: damaged {where} (string references are "
                               f"{dataset.dtype}, not integers)")
        check_storage(dataset, label, where, file_size)
        encodings[column] = encoding
        row_bytes += max(int(dataset.dtype.itemsize), 8 if encoding != schema.ENC_NUMERIC
                         else 0)
    _check_kinds(name, encodings, label)
    if n_rows * row_bytes > schema.READ_BUDGET_BYTES:
        raise ProfileError(f"{label}: {what} declares {n_rows:,} rows "
                           f"({n_rows * row_bytes:,} bytes), more than the reader's budget "
                           f"of {schema.READ_BUDGET_BYTES:,} (schema.READ_BUDGET_BYTES)")
    return TableSpec(order, n_rows, encodings)


def _check_kinds(name: str, encodings: dict[str, str], label: str) -> None:
    text = schema.TEXT_COLUMNS.get(name, ())
    for column in schema.CONTRACT_COLUMNS.get(name, ()):
        encoding = encodings.get(column)
        is_text = encoding in (schema.ENC_STRING_REF, schema.ENC_INT_OR_STRING)
        if column in text and not is_text and encoding != schema.ENC_NUMERIC:
            raise ProfileError(f"{label}: damaged table '{name}' column '{column}' "
                               f"(encoding {encoding!r}, expected text)")
        if column not in text and is_text:
            raise ProfileError(f"{label}: damaged table '{name}' column '{column}' "
                               f"(holds text, expected numbers)")


def check_values(name: str, column: str, values: np.ndarray, label: str) -> None:
    """Columns the schema says are ids, times or sizes hold finite numbers >= 0."""
    if column not in schema.NON_NEGATIVE.get(name, ()) or not len(values):
        return
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        raise ProfileError(f"{label}: damaged table '{name}' column '{column}' "
                           "(NaN or infinite where a number is required)")
    if values.dtype.kind in "if" and values.min() < 0:
        raise ProfileError(f"{label}: damaged table '{name}' column '{column}' "
                           f"(negative value {values.min()})")


def check_array(dataset: h5py.Dataset, name: str, label: str, file_size: int) -> None:
    """An n-D array: numbers, at most 4 axes, one leading-axis slice within the budget."""
    what = f"array '{name}'"
    numeric_dataset(dataset, label, what)
    if dataset.ndim > 4:
        raise ProfileError(f"{label}: damaged {what} ({dataset.ndim} axes)")
    shape = dataset.shape
    slice_bytes = int(np.prod(shape[1:], dtype=object)) * dataset.dtype.itemsize \
        if len(shape) > 1 else declared_bytes(dataset)
    if slice_bytes > schema.READ_BUDGET_BYTES:
        raise ProfileError(f"{label}: {what} declares shape {shape} ({slice_bytes:,} bytes "
                           f"per slice), more than the reader's budget of "
                           f"{schema.READ_BUDGET_BYTES:,} (schema.READ_BUDGET_BYTES)")
    check_storage(dataset, label, what, file_size)


def check_trace_index(ipus: np.ndarray, offsets: np.ndarray, n_rows: int, label: str) -> None:
    """Per-IPU offsets: one more than IPUs, from 0 to n_rows, never decreasing."""
    ok = (ipus.ndim == 1 and offsets.ndim == 1 and len(offsets) == len(ipus) + 1
          and ipus.dtype.kind in "iu" and offsets.dtype.kind in "iu"
          and int(offsets[0]) == 0 and int(offsets[-1]) == n_rows
          and bool((np.diff(offsets.astype(np.int64)) >= 0).all()))
    if not ok:
        raise ProfileError(f"{label}: damaged index of table 'trace' (per-IPU offsets do "
                           "not cover the rows in order)")
