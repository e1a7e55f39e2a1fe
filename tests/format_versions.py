"""A format 1.1 copy of a profile, for the tests of reading older files: 1.2 only added the
root attributes `device_kind` / `time_unit`, the optional tables `host_slices` and
`alloc_*`, and the trace's `stream` / `correlation` columns, so removing them and stating
1.1.0 gives the file a 1.1 writer wrote (the bundled profiles are regenerated as 1.2)."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py

ADDED_IN_1_2_TABLES = ("host_slices", "alloc_blocks", "alloc_segments", "alloc_frames")
ADDED_IN_1_2_TRACE = ("stream", "correlation")


def as_format_1_1(profile: Path, to: Path) -> Path:
    """Copy `profile` (a .h5 or a folder holding profile.h5) to `to`/profile.h5 as 1.1."""
    src = profile / "profile.h5" if profile.is_dir() else profile
    to.mkdir(parents=True, exist_ok=True)
    dst = to / "profile.h5"
    shutil.copyfile(src, dst)
    with h5py.File(dst, "a") as h5:
        h5.attrs["format_version"] = "1.1.0"
        for key in ("device_kind", "time_unit"):
            if key in h5.attrs:
                del h5.attrs[key]
        tables = h5["tables"]
        for name in ADDED_IN_1_2_TABLES:
            if name in tables:
                del tables[name]
        trace = tables["trace"]
        for column in ADDED_IN_1_2_TRACE:
            if column in trace:
                del trace[column]
        order = [c for c in trace.attrs["column-order"] if c.decode() not in ADDED_IN_1_2_TRACE]
        trace.attrs["column-order"] = order
    return dst
