"""Filter an array's chunks in worker threads and hand HDF5 the finished chunks.

HDF5 runs a dataset's filters (shuffle, deflate, Fletcher-32) under h5py's global lock,
one chunk at a time, on one core. A profile's one big array (tile liveness: ~20 MB for a
GPT-2 small step) would take longer to compress than every table to write. The writer
instead starts these jobs first: the same three filters run here in threads (zlib and
numpy copies release the GIL) while the main thread writes the tables, and each finished
chunk is stored with `write_direct_chunk` (filter mask 0: every filter applied). The bytes
on disk are what HDF5's own pipeline would store, so every HDF5 reader reads them and
checks the checksum as for any other chunk (tests/test_format.py compares them).
"""

from __future__ import annotations

import itertools
import struct
import zlib
from concurrent.futures import Executor, Future

import h5py
import numpy as np

_BLOCK = 360  # HDF5 folds its Fletcher sums every 360 words (no uint32 overflow)


def fletcher32(data: bytes) -> int:
    """HDF5's Fletcher-32 (H5_checksum_fletcher32): big-endian 16-bit words, sums folded
    every 360 words, an odd last byte as a high byte. Python ints do not overflow, and
    HDF5's uint32 sums never do, so folding at the same points gives the same value."""
    n = len(data) // 2
    words = np.frombuffer(data, dtype=">u2", count=n).astype(np.int64)
    blocks = -(-n // _BLOCK)
    padded = np.zeros(blocks * _BLOCK, dtype=np.int64)
    padded[:n] = words
    grid = padded.reshape(blocks, _BLOCK)
    sums = grid.sum(axis=1)
    # sum over a block of the running sums = sum of w_j x (words left from j); the zero
    # padding of the last block is taken out again
    lengths = np.full(blocks, _BLOCK, dtype=np.int64)
    if blocks:
        lengths[-1] = n - (blocks - 1) * _BLOCK
    ramps = grid @ np.arange(_BLOCK, 0, -1, dtype=np.int64) - (_BLOCK - lengths) * sums
    sum1 = sum2 = 0
    for length, total, ramp in zip(lengths.tolist(), sums.tolist(), ramps.tolist(),
                                   strict=True):
        sum2 += length * sum1 + ramp
        sum1 += total
        sum1 = (sum1 & 0xFFFF) + (sum1 >> 16)
        sum2 = (sum2 & 0xFFFF) + (sum2 >> 16)
    if len(data) % 2:
        sum1 += data[-1] << 8
        sum2 += sum1
        sum1 = (sum1 & 0xFFFF) + (sum1 >> 16)
        sum2 = (sum2 & 0xFFFF) + (sum2 >> 16)
    sum1 = (sum1 & 0xFFFF) + (sum1 >> 16)
    sum2 = (sum2 & 0xFFFF) + (sum2 >> 16)
    return (sum2 << 16) | sum1


def encode_chunk(block: np.ndarray, level: int) -> bytes:
    """One chunk through shuffle, deflate (zlib format, as HDF5's compress2) and
    Fletcher-32 (appended little-endian), in HDF5's filter order."""
    raw = np.ascontiguousarray(block)
    size = raw.dtype.itemsize
    data = raw.view(np.uint8).reshape(-1, size).T.tobytes() if size > 1 else raw.tobytes()
    packed = zlib.compress(data, level)
    return packed + struct.pack("<I", fletcher32(packed))


class ChunkJobs:
    """An array's chunks being filtered in `pool`; `write` stores them into a dataset
    created with the same chunk shape, shuffle, gzip at `level` and fletcher32."""

    def __init__(self, array: np.ndarray, chunks: tuple[int, ...], level: int,
                 pool: Executor) -> None:
        self.array, self.chunks = array, chunks
        self.level = level
        grid = [range(0, n, c) for n, c in zip(array.shape, chunks, strict=True)]
        self.jobs: list[tuple[tuple[int, ...], Future[bytes]]] = [
            (offset, pool.submit(encode_chunk, self._block(offset), level))
            for offset in itertools.product(*grid)]

    def _block(self, offset: tuple[int, ...]) -> np.ndarray:
        """The chunk at `offset`; an edge chunk padded with the fill value (0) to the full
        chunk shape, as HDF5 stores it."""
        block = self.array[tuple(slice(o, o + c) for o, c in zip(offset, self.chunks,
                                                                  strict=True))]
        if block.shape == self.chunks:
            return block
        full = np.zeros(self.chunks, dtype=self.array.dtype)
        full[tuple(slice(0, n) for n in block.shape)] = block
        return full

    def write(self, dataset: h5py.h5d.DatasetID) -> None:
        """Store every chunk; one no worker has started yet is encoded here (the caller
        has nothing else to do by then)."""
        for offset, job in self.jobs:
            data = encode_chunk(self._block(offset), self.level) if job.cancel() \
                else job.result()
            dataset.write_direct_chunk(offset, data, 0)

    def cancel(self) -> None:
        for _, job in self.jobs:
            job.cancel()
