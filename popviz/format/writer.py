"""Write a profile: one HDF5 file, tables as 1-D column datasets, written atomically.

The file is built in memory, then written under a temporary name in the destination folder
(unique per process, thread and call) and renamed only when complete, so a crash or Ctrl-C
never leaves a valid-looking half profile behind; Ctrl-C during a write removes the
temporary file and raises KeyboardInterrupt (tempfiles.py); a write that fails (a full
disk) removes it and raises an OSError naming the profile.

Why in memory: libhdf5 (2.0) that cannot write its metadata (ENOSPC) reports it from
object finalizers, where h5py can only print it, and then segfaults closing the file. HDF5
here writes into a BytesIO, which never fails; the disk sees one plain write of a known
size, whose space is reserved first (tempfiles.write_whole), so a full disk is one OSError.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import json
import os
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
import pandas as pd

from popviz._version import __version__
from popviz.errors import write_error
from popviz.format import schema, tempfiles
from popviz.format.chunks import ChunkJobs
from popviz.format.guards import profile_path, refuse_foreign
from popviz.format.lowlevel import create_chunked, fixed_text_attr
from popviz.format.strings import StringTable
from popviz.vocab import MODELLED_KIND, words_of

if TYPE_CHECKING:  # the type only: the compiler returns it, the caller writes it
    from popviz.compiler.report import Report

# what a measured / imported profile states (ranks, ns): `write_profile(..., **MEASURED_WORDS)`
MEASURED_WORDS = {"device_kind": "rank", "time_unit": "ns"}


def write_report(report: Report, path: str | os.PathLike[str], *,
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
    device_kind: str | None = None,
    time_unit: str | None = None,
) -> Path:
    """Write one profile file and return its path. See docs/profile-format.md.

    `device_kind` / `time_unit` (format 1.2) say what the `ipu` column counts and what the
    times hold; not given, they are what `kind` and `meta` imply (vocab.words_of)."""
    if kind not in schema.KINDS:
        raise ValueError(f"profile kind {kind!r} is not one of {', '.join(schema.KINDS)}")
    words = device_words(kind, meta, device_kind, time_unit)
    missing = [name for name in schema.REQUIRED_TABLES if name not in tables]
    if missing:
        raise ValueError(f"cannot write a profile without tables: {', '.join(missing)}")
    for name, columns in schema.CONTRACT_COLUMNS.items():
        absent = [c for c in columns if c not in tables[name].columns]
        if absent:
            raise ValueError(f"table {name!r} lacks contract columns: {', '.join(absent)}")

    final = profile_path(path)
    refuse_foreign(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tempfiles.remove_stale_in(final.parent)
    temp = tempfiles.temp_name(final)
    arrays = {name: np.asarray(array) for name, array in (arrays or {}).items()}
    # the arrays' chunks are compressed in a worker while this thread writes the tables
    pool = ThreadPoolExecutor(max_workers=max(1, min(2, (os.cpu_count() or 1) - 1)),
                              thread_name_prefix="popviz-chunks")
    jobs = {name: ChunkJobs(array, _array_chunks(array), schema.GZIP_LEVEL, pool)
            for name, array in arrays.items() if array.size and array.ndim}
    try:
        with tempfiles.deferred_interrupt() as check_interrupt:
            image = io.BytesIO()
            with h5py.File(image, "w", libver=schema.HDF5_LIBVER) as h5:
                _write_root_attrs(h5, meta, summary or {}, kind, command_line, words)
                strings = StringTable()
                tables_group = h5.create_group(schema.TABLES_GROUP)
                index_group = h5.create_group(schema.INDEX_GROUP)
                for name in sorted(tables):
                    check_interrupt()
                    frame = tables[name]
                    if name == "trace":
                        frame = sort_trace(frame)
                        _write_trace_index(index_group, frame)
                    _write_table(tables_group, name, frame, strings)
                arrays_group = h5.create_group(schema.ARRAYS_GROUP)
                for name, array in sorted(arrays.items()):
                    check_interrupt()
                    _write_array(arrays_group, name, array, jobs.get(name))
                strings.write(h5, _chunked)
            check_interrupt()
            tempfiles.write_whole(temp, image.getbuffer())
            image = io.BytesIO()  # the bytes are on disk: free them before the rename
            check_interrupt()  # the last moment a Ctrl-C still means "no profile"
            os.replace(temp, final)
    except BaseException as exc:  # Ctrl-C included: no half file stays behind; re-raised
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        if isinstance(exc, OSError):  # a full disk: name the profile, not the temp file
            raise write_error(exc, final) from exc
        raise
    finally:
        for job in jobs.values():
            job.cancel()
        pool.shutdown(wait=True)
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


def device_words(kind: str, meta: Mapping[str, Any], device_kind: str | None = None,
                 time_unit: str | None = None) -> tuple[str, str]:
    """The (device_kind, time_unit) a profile states: the given ones, else what its kind
    and meta imply; ValueError naming a word outside the schema."""
    implied = words_of(kind, meta)
    device_kind = device_kind or implied[0]
    time_unit = time_unit or implied[1]
    if device_kind not in schema.DEVICE_KINDS:
        raise ValueError(f"device_kind {device_kind!r} is not one of "
                         f"{', '.join(schema.DEVICE_KINDS)}")
    if time_unit not in schema.TIME_UNITS:
        raise ValueError(f"time_unit {time_unit!r} is not one of {', '.join(schema.TIME_UNITS)}")
    return device_kind, time_unit


def _write_root_attrs(h5: h5py.File, meta: Mapping[str, Any], summary: Mapping[str, Any],
                      kind: str, command_line: str | None, words: tuple[str, str]) -> None:
    torch_version = _torch_version()
    # the words live in root attributes only (the reader adds them to `meta`)
    meta = {k: v for k, v in meta.items() if k not in schema.WORD_ATTRS}
    texts = {
        "format": schema.FORMAT_NAME,
        "format_version": schema.FORMAT_VERSION,
        "creator": f"popviz {__version__}",
        "torch_version": torch_version,
        "command_line": command_line if command_line is not None else " ".join(sys.argv),
        "kind": kind,
        "created_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "meta": to_json(dict(meta, kind=kind)),
        "summary": to_json(dict(summary)),
        **dict(zip(schema.WORD_ATTRS, words)),
    }
    for key, text in texts.items():
        put_text(h5, key, text)


def put_text(obj: h5py.Group | h5py.Dataset | h5py.h5d.DatasetID, key: str,
             text: str) -> None:
    """A text attribute as a fixed-length UTF-8 string (format 1.1): it lives in the object
    header, not in the global heap, whose damage can make libhdf5 loop. Text longer than
    schema.MAX_FIXED_ATTR_BYTES (object headers are small) stays variable-length."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) > schema.MAX_FIXED_ATTR_BYTES:
        owner = h5py.Dataset(obj) if isinstance(obj, h5py.h5d.DatasetID) else obj
        owner.attrs[key] = text
        return
    fixed_text_attr(obj, key, raw)


def put_names(attrs: h5py.AttributeManager, key: str, names: list[str]) -> None:
    """A list of names as one fixed-length UTF-8 string array (see put_text)."""
    raw = [name.encode("utf-8", "surrogatepass") for name in names]
    width = max([1, *map(len, raw)])
    attrs.create(key, data=np.array(raw, dtype=f"S{width}"),
                 dtype=h5py.string_dtype("utf-8", width))


def _chunked(group: h5py.Group, name: str, data: np.ndarray
             ) -> h5py.Dataset | h5py.h5d.DatasetID:
    """A 1-D dataset in ~1 MiB gzip chunks, each with a Fletcher-32 checksum (format 1.1)
    so a damaged chunk is an error on read rather than wrong numbers."""
    if data.size == 0:
        return group.create_dataset(name, data=data)
    rows_per_chunk = max(1, schema.CHUNK_BYTES // max(1, data.itemsize))
    return create_chunked(group, name, data, (min(len(data), rows_per_chunk),),
                          schema.GZIP_LEVEL)


def _column_kind(series: pd.Series) -> str:
    if isinstance(series.dtype, pd.CategoricalDtype):  # the kind of its categories
        categories = series.cat.categories
        if categories.dtype.kind in "iufb":
            return _column_kind(pd.Series(categories))
        inferred = pd.api.types.infer_dtype(categories, skipna=True)
        if inferred in ("string", "empty"):
            return schema.ENC_STRING_REF
        return _column_kind(pd.Series(categories, dtype=object))
    if pd.api.types.is_bool_dtype(series.dtype):
        return schema.ENC_BOOL
    if pd.api.types.is_numeric_dtype(series.dtype):
        return schema.ENC_NUMERIC
    if isinstance(series.dtype, pd.StringDtype):  # str or missing: no value to look at
        return schema.ENC_STRING_REF
    if pd.api.types.infer_dtype(series, skipna=True) in ("string", "empty"):
        return schema.ENC_STRING_REF  # no int among them (checked in C, not per value)
    values = series.dropna().tolist()
    has_int = any(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values)
    return schema.ENC_INT_OR_STRING if has_int else schema.ENC_STRING_REF


def encode_column(series: pd.Series, strings: StringTable) -> tuple[str, np.ndarray]:
    """A column's encoding (schema.ENC_*) and the array stored for it: numbers as they
    are, bools as uint8, text as int32 codes into `strings`."""
    kind = _column_kind(series)
    if kind == schema.ENC_BOOL:
        return kind, series.to_numpy(dtype=np.uint8)
    if kind == schema.ENC_NUMERIC:
        return kind, series.to_numpy()
    if isinstance(series.dtype, pd.CategoricalDtype):  # each category once, then indexing
        if kind in (schema.ENC_STRING_REF, schema.ENC_INT_OR_STRING):
            categories = series.cat.categories
            lookup = strings.encode_distinct([*(str(c) for c in categories), ""])
            codes = series.array.codes
            return kind, lookup[np.where(codes < 0, len(categories), codes)]
        series = series.astype(series.cat.categories.dtype)
        return encode_column(series, strings)
    if isinstance(series.dtype, pd.StringDtype):
        return kind, strings.encode(series.to_numpy(dtype=object, na_value=""), all_str=True)
    return kind, strings.encode(series.fillna("").tolist())


def _write_table(parent: h5py.Group, name: str, frame: pd.DataFrame,
                 strings: StringTable) -> None:
    group = parent.create_group(name)
    columns = [str(c) for c in frame.columns]
    put_text(group, "encoding-type", "dataframe")
    put_text(group, "encoding-version", "0.1.0")
    put_names(group.attrs, "column-order", columns)
    group.attrs["n_rows"] = len(frame)
    for column, (_, series) in zip(columns, frame.items(), strict=True):
        kind, data = encode_column(series, strings)
        put_text(_chunked(group, column, data), "encoding", kind)


def _write_trace_index(index: h5py.Group, trace: pd.DataFrame) -> None:
    """Per-IPU row ranges of the sorted trace, so one IPU's events read alone."""
    ipus = trace["ipu"].to_numpy()
    values, starts = np.unique(ipus, return_index=True)
    write_trace_offsets(index, values, np.append(starts, len(ipus)))


def write_trace_offsets(index: h5py.Group, ipus: np.ndarray, offsets: np.ndarray) -> None:
    """The trace index: each IPU (ascending) and where its rows start, one more offset
    closing the last."""
    _chunked(index, "trace_ipus", np.asarray(ipus).astype(np.int64))
    _chunked(index, "trace_offsets", np.asarray(offsets).astype(np.int64))


def _array_chunks(array: np.ndarray) -> tuple[int, ...]:
    """One chunk = one IPU (leading axis) x a range of steps x every tile, ~1 MiB, so a
    single IPU or a step range is read without touching the rest."""
    shape = array.shape
    if array.ndim >= 2:
        row_bytes = int(np.prod(shape[2:], dtype=np.int64)) * array.itemsize
        steps = max(1, min(shape[1], schema.CHUNK_BYTES // max(1, row_bytes)))
        return (1, steps, *shape[2:])
    return (min(shape[0], schema.CHUNK_BYTES // array.itemsize or 1),)


def _write_array(parent: h5py.Group, name: str, array: np.ndarray,
                 job: ChunkJobs | None) -> None:
    if job is None:  # empty or 0-d: nothing to chunk
        parent.create_dataset(name, data=array)
        return
    job.write(create_chunked(parent, name, None, job.chunks, schema.GZIP_LEVEL,
                             shape=array.shape, dtype=array.dtype))
