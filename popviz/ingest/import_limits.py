"""Bounds `popviz import` checks before it allocates, so a small hostile trace or memory
snapshot is refused with one line instead of taking minutes or gigabytes (docs/import.md,
"Hostile input"). Each default is far above what torch.profiler and
`torch.cuda.memory._snapshot()` write; the two a genuine recording could reach (input
size, event count) can be raised with POPVIZ_IMPORT_MAX_BYTES / POPVIZ_IMPORT_MAX_EVENTS.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from popviz.errors import ProfileError
from popviz.format.guards import refuse_special_input

GiB = 1 << 30


def _env_int(name: str, default: int) -> int:
    try:
        value = int(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value > 0 else default


# a trace or snapshot after decompression (a 10^6-event trace is ~0.5 GB of JSON)
MAX_INPUT_BYTES = _env_int("POPVIZ_IMPORT_MAX_BYTES", 2 * GiB)
# gzip: more than this many times the compressed size is a bomb (torch.profiler's JSON and
# snapshot pickles compress 15-20x), except below RATIO_FREE_BYTES
MAX_RATIO = 100
RATIO_FREE_BYTES = 64 << 20
MAX_EVENTS = _env_int("POPVIZ_IMPORT_MAX_EVENTS", 20_000_000)  # per file
MAX_STRING_BYTES = 1 << 20  # one JSON string (kernel names run to a few KB)
MAX_DEPTH = 64  # brackets inside traceEvents (torch.profiler's nest about 5 deep)
MAX_WORLD = 1 << 16  # ranks a trace may declare (distributedInfo.world_size)
MAX_MEMORY_BYTES = 1 << 50  # one GPU's memory, one allocation (1 PiB)
MAX_TIME_NS = 10**18  # |ts| and dur in ns (31 years; 15 integer digits of µs)
MAX_BASE_NS = 1 << 62  # baseTimeNanoseconds (the year 2116)
MAX_INT = 1 << 62  # ids, counts and sizes read as int64 (larger: absent)
MAX_SNAPSHOT_EVENTS = MAX_EVENTS  # alloc / free events of one snapshot


MAX_ACTION_DIGITS = 9  # a stage or micro-batch number in an annotation (PP:0F12)


class LimitError(ProfileError):
    """A bound of this module exceeded; the message does not name the file yet."""


def check_event_count(count: int) -> None:
    """LimitError once a file's events pass MAX_EVENTS (the readers count as they scan)."""
    if count > MAX_EVENTS:
        raise LimitError(f"more than {MAX_EVENTS:,} events (POPVIZ_IMPORT_MAX_EVENTS); "
                         "refused")


def check_size(size: int, path: Path, what: str) -> None:
    if size > MAX_INPUT_BYTES:
        raise ProfileError(f"{path}: {what} holds more than {MAX_INPUT_BYTES:,} bytes "
                           f"(POPVIZ_IMPORT_MAX_BYTES); refused")


def read_input(path: Path, what: str) -> bytes:
    """The file's bytes, gunzipped when it starts with gzip's magic, never more than
    MAX_INPUT_BYTES of them (a gzip bomb stops at the limit): ProfileError naming it."""
    refuse_special_input(path)  # a FIFO would block, /dev/zero never end
    try:
        check_size(path.stat().st_size, path, what)
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ProfileError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc}") from None
    if raw[:2] != b"\x1f\x8b":
        return raw
    return _gunzip(raw, path, what)


def _gunzip(raw: bytes, path: Path, what: str) -> bytes:
    """Every gzip member of `raw`, inflated 32 MiB at a time, stopping as soon as the
    output passes MAX_INPUT_BYTES or MAX_RATIO times the input."""
    cap = min(MAX_INPUT_BYTES, max(RATIO_FREE_BYTES, MAX_RATIO * len(raw)))
    parts: list[bytes] = []
    total = 0
    rest = raw
    while rest:
        if rest[:2] != b"\x1f\x8b":
            if rest.strip(b"\0"):
                raise ProfileError(f"{path}: cannot read: trailing bytes after the gzip data")
            break
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        feed = rest
        while not inflate.eof:
            try:
                part = inflate.decompress(feed, min(cap - total + 1, 32 << 20))
            except zlib.error as exc:
                raise ProfileError(f"{path}: cannot read: damaged gzip data ({exc})") from None
            total += len(part)
            parts.append(part)
            if total > cap:
                raise ProfileError(_too_big(path, what, len(raw), cap))
            feed = inflate.unconsumed_tail
            if not part and not feed:
                raise ProfileError(f"{path}: cannot read: the gzip data is cut short")
        rest = inflate.unused_data
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _too_big(path: Path, what: str, size: int, cap: int) -> str:
    if cap < MAX_INPUT_BYTES:
        return (f"{path}: {what} decompresses to more than {MAX_RATIO} times its "
                f"{size:,} bytes (a gzip bomb?); refused")
    return (f"{path}: {what} decompresses to more than {MAX_INPUT_BYTES:,} bytes "
            "(POPVIZ_IMPORT_MAX_BYTES); refused")


def check_actions(stages: list[int], microbatches: list[int], labels: list[str],
                  world: int) -> None:
    """LimitError naming the annotation when pipelining's annotations claim a stage or a
    micro-batch the trace cannot hold, before anything is sized by it. A rank of a world
    of W that annotates S distinct stages runs stages below W x S (torch.distributed
    .pipelining numbers them rank, rank + W, ...); a micro-batch is numbered below the
    number of actions annotated (each micro-batch has at least one)."""
    if not labels:
        return
    distinct = len({s for s in stages if s >= 0})
    stage_end = max(1, world) * max(1, distinct)
    mb_end = len(labels)
    for stage, mb, label in zip(stages, microbatches, labels, strict=True):
        if stage >= stage_end:
            raise LimitError(f"annotation {label[:60]!r} claims stage {stage:,}, but a rank "
                             f"of a world of {world:,} that annotates {distinct:,} "
                             f"stage(s) runs stages 0..{stage_end - 1:,}; refused")
        if mb >= mb_end:
            raise LimitError(f"annotation {label[:60]!r} claims micro-batch {mb:,}, but "
                             f"the trace annotates only {mb_end:,} pipeline actions "
                             f"(micro-batches 0..{mb_end - 1:,}); refused")
