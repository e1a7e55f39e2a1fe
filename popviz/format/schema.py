"""Profile format v1 (1.3): names and rules shared by the writer and the reader.

The format is documented for people in docs/profile-format.md; keep the two in step.
"""

from __future__ import annotations

import os

from popviz import vocab

FORMAT_NAME = "popviz-profile"
# Semver: a reader refuses another major version; minor versions only add things.
# 1.1: string table as one byte blob + offsets (no vlen strings), Fletcher-32 checksums.
# 1.0 files (vlen `/strings`, no checksums; written for two days) are refused with a
# one-line "regenerate" message.
# 1.2: root attributes `device_kind` (what the `ipu` column counts: ipu, gpu, rank) and
# `time_unit` (what start / end / *_cycles hold: cycles, ns). A 1.1 file states neither:
# the reader maps its kind and target to them (vocab.words_of), so views never guess.
# 1.2 also: optional tables alloc_blocks / alloc_segments / alloc_frames (a CUDA memory
# snapshot's allocator state); 1.1 files read them back empty.
# 1.2 also: an import's `host_slices` table and the trace's `stream` / `correlation` columns
# (thread lanes, stream lanes, launch -> kernel flows on /trace); 1.1 files read as before.
# 1.3: the optional table `always_live_variables` and the `variables` columns first_tile,
# tiles, grain_bytes: where each variable sits on its IPU's tiles (whole grains over a
# tile range, mapping.grain_split), so /memory lists a tile's own bytes; 1.2 files read
# back without them (the listing then names the IPU's candidates, as before).
# 1.4: the optional table `kernels`: each imported kernel's launch (grid, block, registers,
# shared memory, CUPTI's occupancy estimates) by (rank, correlation); 1.3 files read
# back without it (kernel hovers then give name, stream and times only).
FORMAT_VERSION = "1.4.0"
FORMAT_MAJOR = int(FORMAT_VERSION.split(".")[0])

PROFILE_FILENAME = "profile.h5"
PROFILE_SUFFIX = ".h5"
# A writer's temporary name: <final>.popviz-tmp-<pid>-<thread>-<hex8> (format/tempfiles.py).
TEMP_MARKER = ".popviz-tmp-"
LEGACY_TEMP_MARKER = ".tmp-"  # before issue 22: <name>.h5.tmp-<pid>-<thread>-<hex>

TABLES_GROUP = "tables"
ARRAYS_GROUP = "arrays"
INDEX_GROUP = "index"
STRINGS_DATASET = "strings"  # a group of `bytes` + `offsets`

# Column encodings (attribute `encoding` on each column dataset).
ENC_NUMERIC = "numeric"
ENC_BOOL = "bool"
ENC_STRING_REF = "string-ref"  # int32 codes into /strings
ENC_INT_OR_STRING = "int-or-string-ref"  # like string-ref; digit-only strings read back as int
ENCODINGS = (ENC_NUMERIC, ENC_BOOL, ENC_STRING_REF, ENC_INT_OR_STRING)

CHUNK_BYTES = 1 << 20  # ~1 MiB chunks (docs/profile-format.md)
MAX_FIXED_ATTR_BYTES = 16 << 10  # text attributes up to this are fixed-length (1.1)
# HDF5 file-format features the writer may use. "v110" (HDF5 >= 1.10) stores the
# superblock, object headers, heaps and chunk indexes with checksums, so damaged metadata
# is an error, not something libhdf5 follows into a crash or an endless loop (h5dump of
# HDF5 1.10 reads it). The environment variable is for experiments only.
HDF5_LIBVER = os.environ.get("POPVIZ_HDF5_LIBVER", "v110")
# deflate level of every chunked dataset. Level 1 writes in about half the time of level 4:
# tile liveness (~20 MB raw for a GPT-2 small step) 1.0 MB instead of 0.7 MB, tables ~7%
# bigger; a 1.2M-row trace 0.7 s faster
GZIP_LEVEL = 1

# ---- what the reader accepts (checked before any data is read) ----
# The most memory one read may take: a whole table (rows x the column itemsizes), the
# string table, or one IPU's slice of an n-D array. Raise it to open bigger profiles.
READ_BUDGET_BYTES = 1 << 30
# The text one table's cells refer to, all together (a string stored once but repeated by
# every row is that many copies in a CSV or a figure's hover text).
TEXT_BUDGET_BYTES = READ_BUDGET_BYTES // 4
# Deflate cannot expand data more than ~1032x, so a dataset that declares more bytes than
# this many times what it stores is lying about its size (or its chunks are missing).
MAX_COMPRESSION_RATIO = 1100
SMALL_DATASET_BYTES = 64 << 10  # below this no size check is worth its false alarms
MAX_COLUMNS = 4096
MAX_NAME_CHARS = 1024
MAX_JSON_CHARS = 8 << 20  # the `meta` and `summary` attributes
MAX_JSON_DEPTH = 64  # json.loads recurses per level; deep nesting is not a profile
MAX_ATTR_CHARS = 1 << 20  # any other text attribute
# Numeric columns that must hold finite, non-negative numbers (ids, times, sizes).
NON_NEGATIVE: dict[str, tuple[str, ...]] = {
    "stages": ("stage", "ipu", "forward_cycles", "backward_cycles", "recompute_cycles",
               "exchange_cycles", "idle_cycles", "stash_bytes", "peak_bytes"),
    "trace": ("ipu", "start", "end"),
    "liveness": ("ipu", "step", "always_live_bytes", "not_always_live_bytes"),
    "tile_memory": ("ipu", "tile", "capacity_bytes", "total_bytes"),
    "exchange": ("bytes", "start", "end"),
    "ops": ("op_id",),
    "alloc_blocks": ("ipu", "block", "bytes"),
    "alloc_segments": ("ipu", "segment", "bytes"),
    "alloc_frames": ("ipu", "stack", "depth"),
    "host_slices": ("ipu", "tid", "depth"),
    "kernels": ("ipu",),  # the launch fields may be NaN: a field CUPTI did not give
}
# Contract columns that hold text (string-ref or int-or-string-ref); the rest are numbers.
TEXT_COLUMNS: dict[str, tuple[str, ...]] = {
    "trace": ("kind", "pass", "op"),
    "liveness": ("phase",),
    "exchange": ("src", "dst", "kind"),
    "ops": ("op", "phase"),
}

KINDS = vocab.KINDS
DEVICE_KINDS = vocab.DEVICE_KINDS
TIME_UNITS = vocab.TIME_UNITS
WORD_ATTRS = ("device_kind", "time_unit")  # root attributes (1.2); `meta` as read has them

# Contract tables (docs/internals.md) and the columns every profile must have in them.
CONTRACT_COLUMNS: dict[str, tuple[str, ...]] = {
    "stages": (
        "stage", "ipu", "forward_cycles", "backward_cycles", "recompute_cycles",
        "exchange_cycles", "idle_cycles", "stash_bytes", "peak_bytes",
    ),
    "trace": ("ipu", "start", "end", "kind", "stage", "microbatch", "pass", "op"),
    "liveness": ("ipu", "step", "phase", "always_live_bytes", "not_always_live_bytes"),
    "tile_memory": ("ipu", "tile", "capacity_bytes", "total_bytes"),
    "exchange": ("src", "dst", "bytes", "start", "end", "kind"),
    "ops": ("op_id", "op", "phase"),
}
REQUIRED_TABLES = tuple(CONTRACT_COLUMNS)
# The `kernels` columns of a launch and the names torch.profiler's kernel events give them
# in their args (the import reads them, the Chrome-trace export writes them back).
LAUNCH_ARGS = {"grid": "grid", "block": "block", "registers": "registers per thread",
               "shared_bytes": "shared memory", "occupancy_pct": "est. achieved occupancy %",
               "blocks_per_sm": "blocks per SM", "warps_per_sm": "warps per SM"}
# Tables a profile may hold; absent ones read back empty with these columns.
OPTIONAL_COLUMNS: dict[str, tuple[str, ...]] = {
    "tensors": ("tensor_id", "name", "bytes", "category"),
    "variables": ("ipu", "name", "category", "bytes", "first_step", "last_step"),
    # always-live tensors and their tile ranges (1.3; a variable's own placement columns
    # first_tile, tiles, grain_bytes are optional in both tables)
    "always_live_variables": ("ipu", "name", "category", "bytes", "first_tile", "tiles",
                              "grain_bytes"),
    "oom": ("ipu", "tile", "bytes_over", "variables"),
    # a CUDA memory snapshot's allocator (1.2; times on the profile's clock, ns)
    "alloc_blocks": ("ipu", "block", "addr", "bytes", "stream", "start", "end", "from_start",
                     "to_end", "stack"),
    "alloc_segments": ("ipu", "segment", "addr", "bytes", "stream", "segment_type", "start",
                       "end", "from_start", "to_end"),
    "alloc_frames": ("ipu", "stack", "depth", "name", "filename", "line"),
    "host_slices": ("ipu", "tid", "thread", "depth", "start", "end", "name", "cat",
                    "correlation"),
    # an import's kernels as CUPTI launched them (1.4; grid and block "x,y,z")
    "kernels": ("ipu", "correlation", *LAUNCH_ARGS),
}


def version_tuple(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a semver string, missing or unreadable parts as 0."""
    parts = []
    for part in str(version).split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits and len(digits) < 10 else 0)
    return tuple(parts + [0] * (3 - len(parts)))


OLDEST_READ = (1, 1, 0)


def major_of(version: str) -> int:
    """Major number of a semver string; ValueError if it is not one."""
    head = str(version).split(".")[0]
    if not head.isdigit():
        raise ValueError(f"format_version {version!r} is not semver")
    return int(head)
