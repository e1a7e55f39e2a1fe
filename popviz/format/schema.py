"""Profile format v1: names and rules shared by the writer and the reader.

The format is documented for people in docs/profile-format.md; keep the two in step.
"""

from __future__ import annotations

from popviz import vocab

FORMAT_NAME = "popviz-profile"
# Semver: a reader refuses another major version; minor versions only add things.
FORMAT_VERSION = "1.0.0"
FORMAT_MAJOR = int(FORMAT_VERSION.split(".")[0])

PROFILE_FILENAME = "profile.h5"
PROFILE_SUFFIX = ".h5"
TEMP_MARKER = ".tmp-"  # writer's temporary name: <name>.h5.tmp-<pid>; never a profile

TABLES_GROUP = "tables"
ARRAYS_GROUP = "arrays"
INDEX_GROUP = "index"
STRINGS_DATASET = "strings"

# Column encodings (attribute `encoding` on each column dataset).
ENC_NUMERIC = "numeric"
ENC_BOOL = "bool"
ENC_STRING_REF = "string-ref"  # int32 codes into /strings
ENC_INT_OR_STRING = "int-or-string-ref"  # like string-ref; digit-only strings read back as int

CHUNK_BYTES = 1 << 20  # ~1 MiB chunks (docs/profile-format.md)
GZIP_LEVEL = 4

KINDS = vocab.KINDS

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
# Tables a profile may hold; absent ones read back empty with these columns.
OPTIONAL_COLUMNS: dict[str, tuple[str, ...]] = {
    "tensors": ("tensor_id", "name", "bytes", "category"),
    "variables": ("ipu", "name", "category", "bytes", "first_step", "last_step"),
    "oom": ("ipu", "tile", "bytes_over", "variables"),
}


def major_of(version: str) -> int:
    """Major number of a semver string; ValueError if it is not one."""
    head = str(version).split(".")[0]
    if not head.isdigit():
        raise ValueError(f"format_version {version!r} is not semver")
    return int(head)
