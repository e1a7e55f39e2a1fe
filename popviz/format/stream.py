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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd

from popviz.errors import write_error
from popviz.format import schema, tempfiles
from popviz.format.encoded import EncodedFrame
from popviz.format.guards import profile_path, refuse_foreign
from popviz.format.stream_columns import ChunkWriter, StreamTable
from popviz.format.strings import StringTable
from popviz.format.writer import (
    _chunked,
    _write_root_attrs,
    _write_table,
    device_words,
    write_trace_offsets,
)

RESERVE_BYTES = 32 << 20  # disk space reserved ahead of HDF5's writes


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
        # one thread compresses the columns' chunks while this one goes on (stream_columns)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="popviz-chunks")
        self.chunks = ChunkWriter(self.pool, schema.GZIP_LEVEL)
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
        self.tables: dict[str, StreamTable] = {}
        self.finished = False

    def __enter__(self) -> ProfileStream:
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if not self.finished:  # an error, or a block left without finish(): no profile
            self.abort()

    def append(self, name: str, frame: pd.DataFrame | EncodedFrame) -> None:
        """Add `frame`'s rows to table `name` (created by its first slice): a frame, or
        its columns encoded where it was made (format/encoded.py)."""
        try:
            table = self.tables.get(name)
            if table is None:
                table = self.tables[name] = StreamTable(self.tables_group, name, self.chunks)
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
            self.chunks.flush()
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
        self.pool.shutdown(wait=False)
        self.finished = True
        return self.final

    def abort(self) -> None:
        """Close and remove the temporary file; nothing is left under any name."""
        self.chunks.cancel()
        self.pool.shutdown(wait=True, cancel_futures=True)
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
