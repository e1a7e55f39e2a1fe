"""The tables of a streamed profile (stream.py), column by column: each column buffers its
rows and writes them to its dataset in whole chunks.

HDF5 compresses a chunk (shuffle, deflate, Fletcher-32) under h5py's global lock on the
thread that writes it: on an import of many ranks that is the client's main thread, the
one that also takes each finished rank in and encodes its columns. `ChunkWriter` runs the
same filters in a thread instead (chunks.encode_chunk: zlib and numpy release the GIL) and
stores each finished chunk with `write_direct_chunk` from the main thread, so a chunk's
compression overlaps the next rank's work. The bytes stored are HDF5's own
(tests/test_format.py compares them), so every reader reads the file as before.
"""

from __future__ import annotations

import collections
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import h5py
import numpy as np
import pandas as pd

from popviz.format import schema
from popviz.format.chunks import encode_chunk
from popviz.format.encoded import EncodedColumn, EncodedFrame
from popviz.format.lowlevel import create_chunked
from popviz.format.strings import StringTable
from popviz.format.writer import _chunked, encode_column, put_names, put_text

# a streamed column buffers up to one chunk before writing it whole (never a chunk written
# twice): ~70 columns of an import's per-rank tables x this is the most the buffers hold
STREAM_CHUNK_BYTES = schema.CHUNK_BYTES // 8
TEXT_KINDS = (schema.ENC_STRING_REF, schema.ENC_INT_OR_STRING)
MAX_PENDING = 32  # chunks being compressed at once (each holds a copy of its rows)


class ChunkWriter:
    """Chunks compressed in `pool` and stored in their datasets in the order given, from
    the caller's thread (HDF5 is not called from the pool)."""

    def __init__(self, pool: Executor, level: int) -> None:
        self.pool, self.level = pool, level
        self.pending: collections.deque[tuple[h5py.h5d.DatasetID, int, Future[bytes]]] = \
            collections.deque()

    def submit(self, dataset: h5py.h5d.DatasetID, offset: int, block: np.ndarray) -> None:
        """Compress `block` (a whole chunk: padded by the caller) for `dataset` at row
        `offset`; store what is already done, and wait for the oldest when too many are
        in flight."""
        self.pending.append((dataset, offset, self.pool.submit(encode_chunk, block,
                                                                self.level)))
        self.store(wait=len(self.pending) > MAX_PENDING)

    def store(self, wait: bool = False) -> None:
        """Store the finished chunks at the head of the queue (the oldest first, waiting
        for it when `wait`)."""
        while self.pending and (wait or self.pending[0][2].done()):
            dataset, offset, job = self.pending.popleft()
            dataset.write_direct_chunk((offset,), job.result(), 0)
            wait = False

    def flush(self) -> None:
        """Store every chunk (before a dataset is read back, and at the end)."""
        while self.pending:
            self.store(wait=True)

    def cancel(self) -> None:
        for _, _, job in self.pending:
            job.cancel()
        self.pending.clear()


class StreamColumn:
    """One column's dataset, written in whole chunks from what is buffered."""

    def __init__(self, group: h5py.Group, name: str, chunks: ChunkWriter) -> None:
        self.group, self.name, self.chunks = group, name, chunks
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
        self.dataset.id.set_extent((self.written + cut,))
        # the jobs read views of `data`, which nothing writes to again (what is left
        # over is copied out below): no copy of each chunk on the client's thread
        for at in range(0, cut, chunk):
            block = data[at:min(at + chunk, cut)]
            if len(block) < chunk:  # the last, partial chunk: padded as HDF5 stores it
                block = np.concatenate([block, np.zeros(chunk - len(block), block.dtype)])
            self.chunks.submit(self.dataset.id, self.written + at, block)
        self.written += cut
        rest = data[cut:].copy()  # not a view holding the whole concatenation
        self.buffered, self.pending = ([rest] if len(rest) else []), len(rest)

    def _widen(self, dtype: np.dtype) -> None:
        """A later slice needs a wider type (int64 then float64): the buffered and written
        rows are converted, the dataset rewritten chunk by chunk under the same name."""
        self.buffered = [b.astype(dtype) for b in self.buffered]
        old, self.dtype = self.dataset, dtype
        if old is not None:
            self.chunks.flush()  # its chunks are read back
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


class StreamTable:
    def __init__(self, parent: h5py.Group, name: str, chunks: ChunkWriter) -> None:
        self.group = parent.create_group(name)
        self.name, self.chunks = name, chunks
        self.columns: dict[str, StreamColumn] = {}
        self.empty: dict[str, pd.Series] = {}  # each column's first (typed) empty slice
        self.rows = 0
        self.ipus: list[tuple[int, int]] = []  # trace: (ipu, first row) in order

    def append(self, frame: pd.DataFrame | EncodedFrame, strings: StringTable) -> None:
        """Add `frame`'s rows: a frame, or its columns encoded where it was made."""
        columns: dict[str, EncodedColumn | FrameColumn] = dict(frame.columns) \
            if isinstance(frame, EncodedFrame) else \
            {str(name): FrameColumn(series) for name, series in frame.items()}
        for name, column in columns.items():
            if name not in self.columns:
                self.columns[name] = StreamColumn(self.group, name, self.chunks)
                self.empty[name] = column.empty()
                if self.rows:  # a column the earlier slices lacked: missing there
                    self.columns[name].add(*encode_column(
                        _missing(self.empty[name], self.rows), strings))
        if not len(frame):
            return
        if self.name == "trace":
            assert "ipu" in columns, "a trace slice without its ipu column"
            self._index(columns["ipu"].encoded(strings)[1].astype(np.int64))
        for name, stream in self.columns.items():
            stream.add(*(columns[name].encoded(strings) if name in columns else
                         encode_column(_missing(self.empty[name], len(frame)), strings)))
        self.rows += len(frame)

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


@dataclass
class FrameColumn:
    """A frame's column as `StreamTable.append` takes it, beside an `EncodedColumn`."""

    series: pd.Series

    def empty(self) -> pd.Series:
        return self.series.iloc[:0]

    def encoded(self, strings: StringTable) -> tuple[str, np.ndarray]:
        return encode_column(self.series, strings)


def _missing(like: pd.Series, rows: int) -> pd.Series:
    """`rows` missing values of `like`'s kind: NaN for numbers, "" for text, False."""
    if pd.api.types.is_bool_dtype(like.dtype):
        return pd.Series(np.zeros(rows, dtype=bool))
    if pd.api.types.is_numeric_dtype(like.dtype):
        return pd.Series(np.full(rows, np.nan))
    return pd.Series(np.full(rows, "", dtype=object))
