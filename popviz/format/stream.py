"""Write a profile a slice of rows at a time, straight into its temporary file on disk.

`popviz import` of a whole job appends each rank's rows as it finishes them, so memory
holds one rank's rows and a chunk's worth per column, whatever the job's size (writer.py
builds the whole file in memory first, which is right for one compiled or measured run).
The file is the one `write_profile` makes of the same tables (same groups, encodings,
string table, trace index and root attributes; columns are resizable datasets in
STREAM_CHUNK_BYTES chunks), under the same temporary name, renamed only when complete.

A full disk: libhdf5 that cannot write must never see the failure (writer.py: it reports
it from finalizers and may crash). HDF5 writes here through `DiskImage`, which reserves
space ahead of the writes; when the disk refuses one, the image remembers the OSError and
drops every later write, HDF5 finishes into the void, and `finish` then raises the
OSError naming the profile and removes the temporary file.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd

from popviz.errors import write_error
from popviz.format import schema, tempfiles
from popviz.format.guards import profile_path, refuse_foreign
from popviz.format.lowlevel import create_chunked
from popviz.format.strings import StringTable
from popviz.format.writer import (
    _chunked,
    _write_root_attrs,
    _write_table,
    device_words,
    encode_column,
    put_names,
    put_text,
    write_trace_offsets,
)

# a streamed column buffers up to one chunk before writing it whole (never a chunk written
# twice): ~70 columns of an import's per-rank tables x this is the most the buffers hold
STREAM_CHUNK_BYTES = schema.CHUNK_BYTES // 8
RESERVE_BYTES = 32 << 20  # disk space reserved ahead of HDF5's writes
TEXT_KINDS = (schema.ENC_STRING_REF, schema.ENC_INT_OR_STRING)


class DiskImage(io.RawIOBase):
    """The temporary file as h5py's file-object driver sees it (see the module's text)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL
                           | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                           0o666)
        self._pos = 0
        self._size = 0  # the file's length as HDF5 knows it
        self._reserved = 0
        self.error: OSError | None = None

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = max(0, min(len(view), self._size - self._pos))
        got = os.preadv(self._fd, [view[:wanted]], self._pos) if wanted else 0
        view[got:wanted] = bytes(wanted - got)  # dropped after a failure: never real data
        self._pos += wanted
        return wanted

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if self.error is None:
            try:
                self._reserve(self._pos + len(view))
                done = 0
                while done < len(view):
                    done += os.pwrite(self._fd, view[done:], self._pos + done)
            except OSError as exc:
                self.error = exc
        self._pos += len(view)
        self._size = max(self._size, self._pos)
        return len(view)

    def truncate(self, size: int | None = None) -> int:
        self._size = self._pos if size is None else size
        return self._size

    def flush(self) -> None:
        return None

    def _reserve(self, end: int) -> None:
        if end <= self._reserved:
            return
        want = end + RESERVE_BYTES
        tempfiles.reserve(self._fd, self._reserved, want - self._reserved)
        self._reserved = want

    def finish(self) -> None:
        """Cut the reserve off, sync and close; the remembered OSError if a write failed."""
        try:
            if self.error is not None:
                raise self.error
            os.ftruncate(self._fd, self._size)
            os.fsync(self._fd)
        finally:
            self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        super().close()


class _Column:
    """One column's dataset, written in whole chunks from what is buffered."""

    def __init__(self, group: h5py.Group, name: str) -> None:
        self.group, self.name = group, name
        self.kind: str | None = None
        self.dtype: np.dtype | None = None
        self.dataset: h5py.Dataset | None = None
        self.buffered: list[np.ndarray] = []
        self.pending = 0  # rows buffered
        self.written = 0  # rows in the dataset

    @property
    def rows(self) -> int:
        return self.written + self.pending

    def add(self, kind: str, data: np.ndarray) -> None:
        if not len(data):
            return
        if self.kind is None:
            self.kind, self.dtype = kind, data.dtype
        elif (kind in TEXT_KINDS) != (self.kind in TEXT_KINDS) or \
                (kind == schema.ENC_BOOL) != (self.kind == schema.ENC_BOOL):
            raise ValueError(f"column {self.name!r} holds {self.kind} in one slice and "
                             f"{kind} in another")
        elif kind in TEXT_KINDS:
            self.kind = schema.ENC_INT_OR_STRING if schema.ENC_INT_OR_STRING in \
                (kind, self.kind) else kind
        elif np.result_type(self.dtype, data.dtype) != self.dtype:
            self._widen(np.result_type(self.dtype, data.dtype))
        assert self.dtype is not None
        # a copy: a column's array may be a view of its frame's whole block of columns,
        # which it would keep alive until the chunk is written
        self.buffered.append(np.array(data, dtype=self.dtype, copy=True))
        self.pending += len(data)
        if self.pending >= self._chunk_rows():
            self._flush(whole_chunks=True)

    def _chunk_rows(self) -> int:
        assert self.dtype is not None
        return max(1, STREAM_CHUNK_BYTES // max(1, self.dtype.itemsize))

    def _flush(self, whole_chunks: bool) -> None:
        if not self.pending:
            return
        data = np.concatenate(self.buffered) if len(self.buffered) > 1 else self.buffered[0]
        chunk = self._chunk_rows()
        cut = (len(data) // chunk) * chunk if whole_chunks else len(data)
        if not cut:
            return
        if self.dataset is None:
            self.dataset = h5py.Dataset(create_chunked(
                self.group, self.name, None, (chunk,), schema.GZIP_LEVEL, shape=(0,),
                dtype=data.dtype, maxshape=(None,)))
        self.dataset.resize((self.written + cut,))
        self.dataset[self.written:self.written + cut] = data[:cut]
        self.written += cut
        rest = data[cut:].copy()  # not a view holding the whole concatenation
        self.buffered, self.pending = ([rest] if len(rest) else []), len(rest)

    def _widen(self, dtype: np.dtype) -> None:
        """A later slice needs a wider type (int64 then float64): the buffered and written
        rows are converted, the dataset rewritten chunk by chunk under the same name."""
        self.buffered = [b.astype(dtype) for b in self.buffered]
        old, self.dtype = self.dataset, dtype
        if old is not None:
            chunk = self._chunk_rows()
            temp = f"{self.name}.popviz-widen"
            new = h5py.Dataset(create_chunked(self.group, temp, None, (chunk,),
                                              schema.GZIP_LEVEL, shape=old.shape,
                                              dtype=dtype, maxshape=(None,)))
            for at in range(0, self.written, chunk):
                new[at:at + chunk] = old[at:at + chunk].astype(dtype)
            del self.group[self.name]
            self.group.move(temp, self.name)
            self.dataset = self.group[self.name]

    def finish(self, empty: pd.Series, strings: StringTable) -> None:
        """Write what is buffered and the encoding; a column that never got a row is the
        empty one `write_profile` would write for `empty`."""
        if self.kind is None:
            kind, data = encode_column(empty, strings)
            put_text(_chunked(self.group, self.name, data), "encoding", kind)
            return
        if self.dataset is None:  # it all fits in one chunk: as write_profile writes it
            data = np.concatenate(self.buffered) if len(self.buffered) > 1 \
                else self.buffered[0]
            put_text(_chunked(self.group, self.name, data), "encoding", self.kind)
            return
        self._flush(whole_chunks=False)
        put_text(self.dataset.id, "encoding", self.kind)


class _Table:
    def __init__(self, parent: h5py.Group, name: str) -> None:
        self.group = parent.create_group(name)
        self.name = name
        self.columns: dict[str, _Column] = {}
        self.empty: dict[str, pd.Series] = {}  # each column's first (typed) empty slice
        self.rows = 0
        self.ipus: list[tuple[int, int]] = []  # trace: (ipu, first row) in order

    def append(self, frame: pd.DataFrame, strings: StringTable) -> None:
        for column in frame.columns:
            name = str(column)
            if name not in self.columns:
                self.columns[name] = _Column(self.group, name)
                self.empty[name] = frame[column].iloc[:0]
                if self.rows:  # a column the earlier slices lacked: missing there
                    self._add(name, _missing(frame[column], self.rows), strings)
        if not len(frame):
            return
        if self.name == "trace":
            self._index(frame["ipu"].to_numpy(np.int64))
        given = {str(k): v for k, v in frame.items()}  # each column once, not by name
        for name in self.columns:
            series = given[name] if name in given else _missing(self.empty[name], len(frame))
            self._add(name, series, strings)
        self.rows += len(frame)

    def _add(self, name: str, series: pd.Series, strings: StringTable) -> None:
        kind, data = encode_column(series, strings)
        self.columns[name].add(kind, data)

    def _index(self, ipus: np.ndarray) -> None:
        last = self.ipus[-1][0] if self.ipus else None
        if (np.diff(ipus) < 0).any() or (last is not None and ipus[0] < last):
            raise ValueError("trace slices must come in device order")
        values, firsts = np.unique(ipus, return_index=True)
        for value, first in zip(values.tolist(), firsts.tolist(), strict=True):
            if value != last:
                self.ipus.append((value, self.rows + first))

    def finish(self, strings: StringTable) -> None:
        order = list(self.columns)
        for name in order:
            self.columns[name].finish(self.empty[name], strings)
        put_text(self.group, "encoding-type", "dataframe")
        put_text(self.group, "encoding-version", "0.1.0")
        put_names(self.group.attrs, "column-order", order)
        self.group.attrs["n_rows"] = self.rows


def _missing(like: pd.Series, rows: int) -> pd.Series:
    """`rows` missing values of `like`'s kind: NaN for numbers, "" for text, False."""
    if pd.api.types.is_bool_dtype(like.dtype):
        return pd.Series(np.zeros(rows, dtype=bool))
    if pd.api.types.is_numeric_dtype(like.dtype):
        return pd.Series(np.full(rows, np.nan))
    return pd.Series(np.full(rows, "", dtype=object))


class ProfileStream:
    """A profile written table slice by table slice; `finish` completes and renames it,
    `abort` (or leaving a `with` block without `finish`) removes it. Slices of the trace must
    come in device order, each device's rows whole and sorted by start."""

    def __init__(self, path: str | os.PathLike[str], *, kind: str,
                 device_kind: str, time_unit: str) -> None:
        if kind not in schema.KINDS:
            raise ValueError(f"profile kind {kind!r} is not one of {', '.join(schema.KINDS)}")
        self.kind = kind
        self.words = device_words(kind, {}, device_kind, time_unit)
        self.final = profile_path(path)
        refuse_foreign(self.final)
        self.final.parent.mkdir(parents=True, exist_ok=True)
        tempfiles.remove_stale_in(self.final.parent)
        self.temp = tempfiles.temp_name(self.final)
        self.image: DiskImage | None = None
        self.h5: h5py.File | None = None
        try:
            self.image = DiskImage(self.temp)
            # no chunk cache: each chunk is written once, whole, and never read back
            self.h5 = h5py.File(self.image, "w", libver=schema.HDF5_LIBVER, rdcc_nbytes=0)
            self.tables_group = self.h5.create_group(schema.TABLES_GROUP)
            self.index_group = self.h5.create_group(schema.INDEX_GROUP)
        except BaseException as exc:
            self._fail(exc)
        self.strings = StringTable()
        self.tables: dict[str, _Table] = {}
        self.finished = False

    def __enter__(self) -> ProfileStream:
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if not self.finished:  # an error, or a block left without finish(): no profile
            self.abort()

    def append(self, name: str, frame: pd.DataFrame) -> None:
        """Add `frame`'s rows to table `name` (created by its first slice)."""
        try:
            table = self.tables.get(name)
            if table is None:
                table = self.tables[name] = _Table(self.tables_group, name)
            table.append(frame, self.strings)
        except Exception as exc:  # h5py after a full disk: the disk's error, not h5py's
            if isinstance(exc, OSError) or (self.image is not None
                                            and self.image.error is not None):
                self._fail(exc)
            raise
        if self.image is not None and self.image.error is not None:  # the disk is full:
            self._fail(self.image.error)  # stop now, not after the rest of the job

    def finish(self, *, meta: Mapping[str, Any], summary: Mapping[str, Any],
               tables: Mapping[str, pd.DataFrame], command_line: str) -> Path:
        """Write `tables` whole beside the streamed ones, the string table and the root
        attributes, and rename the file to its final name."""
        assert self.h5 is not None and self.image is not None
        try:
            missing = [n for n in schema.REQUIRED_TABLES
                       if n not in tables and n not in self.tables]
            if missing:
                raise ValueError(f"cannot write a profile without tables: {', '.join(missing)}")
            for name, columns in schema.CONTRACT_COLUMNS.items():
                have = tables[name].columns if name in tables else \
                    self.tables[name].columns if name in self.tables else columns
                absent = [c for c in columns if c not in have]
                if absent:
                    raise ValueError(f"table {name!r} lacks contract columns: "
                                     f"{', '.join(absent)}")
            for name in sorted(tables):
                if name in self.tables:
                    raise ValueError(f"table {name!r} given whole after it was streamed")
                if name == "trace":  # sorted, with its index: as a (single) slice
                    self.append(name, tables[name])
                else:
                    _write_table(self.tables_group, name, tables[name], self.strings)
            for table in self.tables.values():
                table.finish(self.strings)
            trace = self.tables.get("trace")
            starts = trace.ipus if trace is not None else []
            write_trace_offsets(self.index_group, np.array([i for i, _ in starts]),
                                np.array([*(f for _, f in starts),
                                          trace.rows if trace is not None else 0]))
            self.h5.create_group(schema.ARRAYS_GROUP)
            self.strings.write(self.h5, _chunked)
            _write_root_attrs(self.h5, meta, summary, self.kind, command_line, self.words)
            self.h5.close()
            self.image.finish()
            os.replace(self.temp, self.final)
        except BaseException as exc:
            self._fail(exc)
        self.finished = True
        return self.final

    def abort(self) -> None:
        """Close and remove the temporary file; nothing is left under any name."""
        if self.h5 is not None:
            with contextlib.suppress(Exception):
                self.h5.close()
            self.h5 = None
        if self.image is not None:
            with contextlib.suppress(OSError):
                self.image.close()
        with contextlib.suppress(FileNotFoundError):
            self.temp.unlink()

    def _fail(self, exc: BaseException) -> None:
        if self.image is not None and self.image.error is not None \
                and not isinstance(exc, KeyboardInterrupt):
            exc = self.image.error  # what h5py says next (reading dropped data) is not why
        self.abort()
        if isinstance(exc, OSError):  # a full disk: name the profile, not the temp file
            raise write_error(exc, self.final) from exc
        raise exc
