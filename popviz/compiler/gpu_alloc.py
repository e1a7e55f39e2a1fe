"""A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), default
settings (no expandable segments, no max_split_size, one stream).

What it keeps from the real one (constants as c10 defines them; PyTorch's "CUDA semantics"
notes, "Memory management", describe the behaviour):

- every request is rounded up to a multiple of 512 B (`kMinBlockSize`);
- requests of at most 1 MiB (`kSmallSize`) come from the small pool, whose segments are
  2 MiB (`kSmallBuffer`); larger ones from the large pool, whose new segment is 20 MiB
  (`kLargeBuffer`) for requests under 10 MiB (`kMinLargeAlloc`), else the request rounded
  up to 2 MiB (`kRoundLarge`);
- a request takes the smallest cached free block of its pool that fits (best fit, lowest
  address among equals); the block is split when what remains is at least 512 B (small
  pool) or more than 1 MiB (large pool); a freed block merges with free neighbours of its
  segment; segments are never released (no `empty_cache`), so reserved only grows.

`allocated` is the sum of the rounded sizes of live blocks, as `torch.cuda.
max_memory_allocated` counts; `reserved` the sum of segment sizes (`max_memory_reserved`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(size: int) -> int:
    """The block size a request of `size` bytes gets (kMinBlockSize rounding)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)


def segment_size(size: int) -> int:
    """The cudaMalloc a pool miss makes for a rounded request (get_allocation_size)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None

    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


@dataclass
class CachingAllocator:
    """Replays malloc / free; `allocated`, `reserved` and their peaks in bytes."""

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    segments: int = 0
    _free: dict[bool, list[tuple[int, int, int]]] = field(
        default_factory=lambda: {True: [], False: []})
    _blocks: dict[tuple[int, int], _Block] = field(default_factory=dict)
    _live: dict[int, _Block] = field(default_factory=dict)

    def malloc(self, handle: int, size: int) -> int:
        """Allocate `size` bytes under `handle` (unique while live); the block's size."""
        if handle in self._live:
            raise ValueError(f"handle {handle} is already allocated")
        rounded = round_size(max(int(size), 0))
        small = rounded <= SMALL_SIZE
        pool = self._free[small]
        i = bisect.bisect_left(pool, (rounded, -1, -1))
        if i < len(pool):
            block = self._blocks[pool.pop(i)[1:]]
        else:  # a pool miss: a new segment (cudaMalloc)
            seg_bytes = segment_size(rounded)
            block = _Block(self.segments, 0, seg_bytes, small)
            self._blocks[(block.segment, 0)] = block
            self.segments += 1
            self.reserved += seg_bytes
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        remaining = block.size - rounded
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
            rest = _Block(block.segment, block.offset + rounded, remaining, small,
                          prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            self._blocks[(rest.segment, rest.offset)] = rest
            bisect.insort(self._free[small], rest.key())
        block.free = False
        self._live[handle] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block.size

    def free(self, handle: int) -> None:
        block = self._live.pop(handle, None)
        if block is None:
            raise ValueError(f"handle {handle} is not allocated")
        self.allocated -= block.size
        block.free = True
        for other in (block.prev, block.next):  # merge with free neighbours
            if other is None or not other.free:
                continue
            self._remove_free(other)
            del self._blocks[(other.segment, other.offset)]
            if other is block.prev:
                del self._blocks[(block.segment, block.offset)]
                other.size += block.size
                other.next = block.next
                if block.next is not None:
                    block.next.prev = other
                other.free = True
                block = other
                self._blocks[(block.segment, block.offset)] = block
            else:
                block.size += other.size
                block.next = other.next
                if other.next is not None:
                    other.next.prev = block
        bisect.insort(self._free[block.small], block.key())

    def _remove_free(self, block: _Block) -> None:
        pool = self._free[block.small]
        i = bisect.bisect_left(pool, block.key())
        if i < len(pool) and pool[i] == block.key():
            pool.pop(i)

    def reset_peaks(self) -> None:
        """As torch.cuda.reset_peak_memory_stats: peaks restart from the current levels."""
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved
