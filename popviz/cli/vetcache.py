"""Vet the profiles a CLI command is about to open, with the verdicts cached on disk.

A file that crashes libhdf5 (a segfault on a flipped byte) or makes it loop for ever would
kill `popviz summary` itself; reading it first in a worker (`popviz.vet.vet`) turns that
into one line and exit code 1. A verdict is kept per file stamp (real path, device, inode,
size, mtime and ctime: `popviz.vet.Stamp`; a file swapped in with the old mtime and size is
a new stamp) and popviz version under `$XDG_CACHE_HOME/popviz/` (default
`~/.cache/popviz/`), so the second run on the same file starts no worker. A cache that
cannot be read or written only costs time. `open_vetted` opens a profile only if the file
HDF5 opens is the one that was vetted.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import popviz
from popviz import vet as vetting
from popviz._version import __version__
from popviz.errors import ProfileError
from popviz.format.schema import PROFILE_FILENAME

CACHE_SUBDIR = "popviz"
_HANG_PREFIX = "refused: reading it took longer"  # may be a busy machine: not cached


def add_no_vet_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-vet", action="store_true",
                        help="open the file directly, without first reading it in a worker "
                             "process (for trusted files; a damaged one may then crash "
                             "popviz)")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / CACHE_SUBDIR


def verdict_file(stamp: vetting.Stamp) -> Path:
    """Where the verdict for a file as it is now (its stamp) is kept."""
    key = json.dumps([*stamp, __version__])
    return cache_dir() / f"vet-{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def check_vetted(*targets: str | os.PathLike[str]) -> None:
    """Raise ProfileError (one line naming the file) unless the profile that
    `popviz.open(target)` would open comes back clean from a worker, for each target.
    Targets that do not name one profile are left to `popviz.open`, which says why."""
    for target in targets:
        path = _the_profile(Path(target))
        if path is None:
            continue
        verdict = cached_verdict(path)
        if not verdict.ok:
            raise ProfileError(verdict.message(str(path)))


def open_vetted(target: str | os.PathLike[str], vet: bool = True) -> Any:
    """`popviz.open(target)`, after vetting the file it names (unless not `vet`); the file
    HDF5 then opens must be the one vetted (ProfileError if it was replaced or changed in
    between: one line, nothing read from it)."""
    path = _the_profile(Path(target)) if vet else None
    if path is None:
        return popviz.open(target)  # or its one-line reason why not
    try:
        stamp = vetting.stamp_of(path)
    except OSError:
        return popviz.open(path)  # gone or unreadable: popviz.open says which
    verdict = cached_verdict(path, stamp)
    if not verdict.ok:
        raise ProfileError(verdict.message(str(path)))
    return popviz.open(path, check_file=vetting.file_check(stamp, str(path)))


def _the_profile(target: Path) -> Path | None:
    try:
        if target.is_dir() and (target / PROFILE_FILENAME).is_file():
            return target / PROFILE_FILENAME
        found = popviz.discover(target)
    except (ProfileError, OSError):  # popviz.open says why (not found, not readable)
        return None
    return found[0] if len(found) == 1 else None


def cached_verdict(path: Path, stamp: vetting.Stamp | None = None) -> vetting.Verdict:
    if stamp is None:
        try:
            stamp = vetting.stamp_of(path)
        except OSError:
            return vetting.Verdict(True)  # gone or unreadable: popviz.open will say so
    where = verdict_file(stamp)
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        data = json.loads(where.read_text())
        return vetting.Verdict(bool(data["ok"]), str(data["reason"]))
    verdict = vetting.vet_or_refuse(stamp.path,
                                    vetting.time_limit(vetting.DEFAULT_TIMEOUT_S, stamp.size),
                                    vetting.DEFAULT_MEMORY_MB)
    if not verdict.reason.startswith(_HANG_PREFIX):
        _store(where, verdict)
    return verdict


def _store(where: Path, verdict: vetting.Verdict) -> None:
    """Write atomically; a cache folder we may not write to is not an error."""
    with contextlib.suppress(OSError):
        where.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".vet-", suffix=".tmp", dir=where.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump({"ok": verdict.ok, "reason": verdict.reason}, handle)
            os.replace(temp, where)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp)
