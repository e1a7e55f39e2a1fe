"""Write a profile: one HDF5 file, tables as 1-D column datasets, written atomically.

The file is built under a temporary name in the destination folder and renamed only when
complete, so a crash or Ctrl-C never leaves a valid-looking half profile behind.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd

from popviz._version import __version__
from popviz.format import schema
from popviz.vocab import MODELLED_KIND


def profile_path(path: str | os.PathLike[str]) -> Path:
    """A `.h5` path is used as is; anything else is a directory that gets profile.h5."""
    target = Path(path)
    if target.suffix == schema.PROFILE_SUFFIX:
        return target
    return target / schema.PROFILE_FILENAME


def write_report(report: Any, path: str | os.PathLike[str], *,
                 command_line: str | None = None) -> Path:
    """Write a compiled `popviz.compiler.Report` (or anything with the same fields)."""
    return write_profile(
        path,
        meta=report.meta,
        tables=report.tables,
        arrays=report.arrays,
        summary=report.summary,
        kind=report.meta.get("kind", MODELLED_KIND),
        command_line=command_line,
    )


def write_profile(
    path: str | os.PathLike[str],
    *,
    meta: Mapping[str, Any],
    tables: Mapping[str, pd.DataFrame],
    arrays: Mapping[str, np.ndarray] | None = None,
    summary: Mapping[str, Any] | None = None,
    kind: str = MODELLED_KIND,
    command_line: str | None = None,
) -> Path:
    """Write one profile file and return its path. See docs/profile-format.md."""
    if kind not in schema.KINDS:
        raise ValueError(f"profile kind {kind!r} is not one of {', '.join(schema.KINDS)}")
    missing = [name for name in schema.REQUIRED_TABLES if name not in tables]
    if missing:
        raise ValueError(f"cannot write a profile without tables: {', '.join(missing)}")
    for name, columns in schema.CONTRACT_COLUMNS.items():
        absent = [c for c in columns if c not in tables[name].columns]
        if absent:
            raise ValueError(f"table {name!r} lacks contract columns: {', '.join(absent)}")

    final = profile_path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = final.with_name(f"{final.name}{schema.TEMP_MARKER}{os.getpid()}")
    try:
        with h5py.File(temp, "w", libver="earliest") as h5:
            _write_root_attrs(h5, meta, summary or {}, kind, command_line)
            strings = _StringTable()
            tables_group = h5.create_group(schema.TABLES_GROUP)
            index_group = h5.create_group(schema.INDEX_GROUP)
            for name in sorted(tables):
                frame = tables[name]
                if name == "trace":
                    frame = sort_trace(frame)
                    _write_trace_index(index_group, frame)
                _write_table(tables_group, name, frame, strings)
            arrays_group = h5.create_group(schema.ARRAYS_GROUP)
            for name, array in sorted((arrays or {}).items()):
                _write_array(arrays_group, name, np.asarray(array))
            strings.write(h5)
        with open(temp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
    return final


def sort_trace(trace: pd.DataFrame) -> pd.DataFrame:
    """Events sorted by (ipu, start): the order the per-IPU offsets index."""
    return trace.sort_values(["ipu", "start"], kind="stable").reset_index(drop=True)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def to_json(value: Any) -> str:
    return json.dumps(value, default=_json_default, sort_keys=True, allow_nan=True)


def _torch_version() -> str:
    """torch's version without importing torch when nothing has (importing it takes
    seconds and hundreds of MB, e.g. for `popviz import`); "" when it is absent."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(torch.__version__)
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # pragma: no cover - torch is a dependency
        return ""


def _write_root_attrs(h5: h5py.File, meta: Mapping[str, Any], summary: Mapping[str, Any],
                      kind: str, command_line: str | None) -> None:
    torch_version = _torch_version()
    attrs = h5.attrs
    attrs["format"] = schema.FORMAT_NAME
    attrs["format_version"] = schema.FORMAT_VERSION
    attrs["creator"] = f"popviz {__version__}"
    attrs["torch_version"] = torch_version
    attrs["command_line"] = command_line if command_line is not None else " ".join(sys.argv)
    attrs["kind"] = kind
    attrs["created_utc"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    attrs["meta"] = to_json(dict(meta, kind=kind))
    attrs["summary"] = to_json(dict(summary))


class _StringTable:
    """Interns every string of every table once; columns store int32 codes into it."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}

    def encode(self, values: Iterable[str]) -> np.ndarray:
        items = np.asarray(list(values), dtype=object)
        if pd.api.types.infer_dtype(items, skipna=False) == "string":
            # all str already: hash them (sorted uniques, as np.unique would give) without
            # a fixed-width copy of the column (300k op names: ~70 MB of UCS-4)
            inverse, uniques = pd.factorize(items, sort=True)
        else:
            uniques, inverse = np.unique(items.astype(str), return_inverse=True)
        lookup = np.array([self._code(u) for u in uniques.tolist()], dtype=np.int32)
        return lookup[inverse] if len(uniques) else np.zeros(0, dtype=np.int32)

    def _code(self, text: str) -> int:
        code = self._codes.get(text)
        if code is None:
            code = self._codes[text] = len(self._codes)
        return code

    def write(self, h5: h5py.File) -> None:
        texts = list(self._codes)  # dict order is code order
        h5.create_dataset(schema.STRINGS_DATASET, data=np.array(texts, dtype=object),
                          dtype=h5py.string_dtype("utf-8"))


def _chunked(group: h5py.Group, name: str, data: np.ndarray) -> h5py.Dataset:
    if data.size == 0:
        return group.create_dataset(name, data=data)
    rows_per_chunk = max(1, schema.CHUNK_BYTES // max(1, data.itemsize))
    chunks = (min(len(data), rows_per_chunk),)
    return group.create_dataset(name, data=data, chunks=chunks, compression="gzip",
                                compression_opts=schema.GZIP_LEVEL, shuffle=True)


def _column_kind(series: pd.Series) -> str:
    if pd.api.types.is_bool_dtype(series.dtype):
        return schema.ENC_BOOL
    if pd.api.types.is_numeric_dtype(series.dtype):
        return schema.ENC_NUMERIC
    if pd.api.types.infer_dtype(series, skipna=True) in ("string", "empty"):
        return schema.ENC_STRING_REF  # no int among them (checked in C, not per value)
    values = series.dropna().tolist()
    has_int = any(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values)
    return schema.ENC_INT_OR_STRING if has_int else schema.ENC_STRING_REF


def _write_table(parent: h5py.Group, name: str, frame: pd.DataFrame,
                 strings: _StringTable) -> None:
    group = parent.create_group(name)
    columns = [str(c) for c in frame.columns]
    group.attrs["encoding-type"] = "dataframe"
    group.attrs["encoding-version"] = "0.1.0"
    group.attrs.create("column-order", data=np.array(columns, dtype=object),
                       dtype=h5py.string_dtype("utf-8"))
    group.attrs["n_rows"] = len(frame)
    for column in columns:
        series = frame[column]
        kind = _column_kind(series)
        if kind == schema.ENC_BOOL:
            data = series.to_numpy(dtype=np.uint8)
        elif kind == schema.ENC_NUMERIC:
            data = series.to_numpy()
        else:
            data = strings.encode(series.fillna("").tolist())
        dataset = _chunked(group, column, data)
        dataset.attrs["encoding"] = kind


def _write_trace_index(index: h5py.Group, trace: pd.DataFrame) -> None:
    """Per-IPU row ranges of the sorted trace, so one IPU's events read alone."""
    ipus = trace["ipu"].to_numpy()
    values, starts = np.unique(ipus, return_index=True)
    offsets = np.append(starts, len(ipus)).astype(np.int64)
    index.create_dataset("trace_ipus", data=values.astype(np.int64))
    index.create_dataset("trace_offsets", data=offsets)


def _write_array(parent: h5py.Group, name: str, array: np.ndarray) -> None:
    if array.size == 0 or array.ndim == 0:
        parent.create_dataset(name, data=array)
        return
    # One chunk = one IPU (leading axis) x a range of steps x every tile, ~1 MiB, so a
    # single IPU or a step range is read without touching the rest.
    shape = array.shape
    row_bytes = int(np.prod(shape[2:], dtype=np.int64)) * array.itemsize if array.ndim > 2 \
        else array.itemsize
    if array.ndim >= 2:
        steps = max(1, min(shape[1], schema.CHUNK_BYTES // max(1, row_bytes)))
        chunks = (1, steps, *shape[2:])
    else:
        chunks = (min(shape[0], schema.CHUNK_BYTES // array.itemsize or 1),)
    parent.create_dataset(name, data=array, chunks=chunks, compression="gzip",
                          compression_opts=schema.GZIP_LEVEL, shuffle=True)
