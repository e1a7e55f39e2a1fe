"""Errors popviz raises at its boundaries."""

from __future__ import annotations

import errno
import os
from pathlib import Path


class ProfileError(Exception):
    """A profile cannot be read: missing, not HDF5, truncated, foreign, too new, damaged,
    lying about its sizes, or holding values outside the schema.

    The message is one line that names the file, the table where there is one, and the
    reason. Every failure of `popviz.open` and of a Profile's reads is this type.
    """


def _reason(exc: OSError) -> str:
    """The reason of an OSError on one line (h5py's messages run over several lines)."""
    return " ".join((exc.strerror or str(exc) or type(exc).__name__).split())[:300]


def os_error_line(exc: OSError) -> str:
    """`PATH: reason` on one line; "Not a directory" for a path under a file names that
    file instead (`notes.txt: a file, not a folder`)."""
    if exc.errno == errno.ENOTDIR and exc.filename and "not a folder" not in str(exc) \
            and (blocker := file_in_the_way(exc.filename)) is not None:
        return f"{blocker}: a file, not a folder"
    reason = _reason(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


def write_error(exc: OSError, target: object) -> OSError:
    """`exc` (a full disk, no permission, ...) as an OSError naming what was being written
    rather than its temporary file; same errno, so the same OSError subclass."""
    error = OSError(exc.errno, f"cannot write ({_reason(exc)}); nothing was written there",
                    str(target))
    error.__cause__ = exc
    return error


def interrupted_by(exc: BaseException) -> bool:
    """Whether `exc` is, or was raised because of, a Ctrl-C: a KeyboardInterrupt that
    arrives inside a C extension (h5py's lock) surfaces as a SystemError caused by it,
    which must be reported as the interrupt, not as a damaged file."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def file_in_the_way(path: str | os.PathLike[str]) -> Path | None:
    """The first of `path` and its parents that exists and is not a folder, when that
    blocks `path` from being (or lying inside) a folder; None when nothing does."""
    for place in (Path(path), *Path(path).parents):
        try:
            if place.is_dir():
                return None
            if place.exists() or place.is_symlink():
                return place
        except OSError:  # a parent we may not look into: the write will say why
            return None
    return None


def in_the_way_note(path: str | os.PathLike[str]) -> str:
    """` (X is a file, not a folder)` when a file above `path` stands where a folder is
    needed, for a "no such file or directory" line; '' otherwise."""
    blocker = file_in_the_way(path)
    return f" ({blocker} is a file, not a folder)" if blocker not in (None, Path(path)) \
        else ""


def not_a_folder(path: str | os.PathLike[str], what: str = "a folder goes there"
                 ) -> NotADirectoryError | None:
    """A one-line NotADirectoryError when a file stands where `path` needs a folder
    (`--to notes.txt/sub`), naming that file; None when nothing is in the way."""
    blocker = file_in_the_way(path)
    if blocker is None:
        return None
    return NotADirectoryError(errno.ENOTDIR, f"a file, not a folder; {what}", str(blocker))


class RequestStopped(Exception):
    """A request of `popviz serve` ran past its time budget (`--request-timeout`) and was
    stopped in its thread (popviz.cli.serve_budget). `limit_s` is the budget."""

    limit_s: float = 0.0

    def __init__(self, limit_s: float | None = None) -> None:
        if limit_s is not None:
            self.limit_s = limit_s
        super().__init__(self.limit_s)

    def __str__(self) -> str:
        return (f"building this view took longer than {self.limit_s:g} s and was stopped "
                "(popviz serve --request-timeout)")
