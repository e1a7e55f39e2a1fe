"""Temporary names of files being written, their clean-up, and Ctrl-C during a write.

A writer builds `<final>.popviz-tmp-<pid>-<thread>-<hex8>` next to its final name and
renames it when complete, so two threads of one process, or two processes, never share a
temporary file. A profile writer that was killed leaves its temporary file behind; the next
profile writer in that folder removes it, and only it: the whole name must match
`TEMP_NAME` (anchored), its pid must be gone, it must be over a minute old, a regular file
(not a link), and empty or an HDF5 file (what the writer makes). Anything else, above all a
user's file that merely looks like one (`results.tmp-20240101-final.csv`, issue 22), is left
alone. Read-only commands (`discover`, `summary`, `serve`) never delete: they skip
temporary names. Temporary files of other writers (exports) are removed by their own
writer on failure and never by anyone else.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from popviz.errors import write_error
from popviz.format import schema

# A temporary file younger than this is left alone even if its pid looks dead: the
# writer may run in another pid namespace (a container) sharing the folder.
STALE_AFTER_S = 60.0
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # at offset 0 of every file the writer makes
TEMP_NAME = re.compile(re.escape(schema.TEMP_MARKER)
                       + r"(?P<pid>[1-9][0-9]{0,9})-(?P<thread>[0-9]{1,20})-[0-9a-f]{8}")
# popviz before issue 22 wrote <name>.h5.tmp-<pid>-<thread>-<hex>: skipped by discovery,
# never removed (too close to names people give their own files)
LEGACY_TEMP_NAME = re.compile(re.escape(schema.PROFILE_SUFFIX + schema.LEGACY_TEMP_MARKER)
                              + r"[0-9]+(?:-[0-9]+-[0-9a-f]+)?")


def temp_name(final: Path) -> Path:
    """A temporary path next to `final`, unique per process, thread and call."""
    return final.with_name(f"{final.name}{schema.TEMP_MARKER}{os.getpid()}-"
                           f"{threading.get_ident()}-{secrets.token_hex(4)}")


def _temp_match(name: str) -> re.Match[str] | None:
    """The writer's temporary-name suffix of `name`, anchored at its end, after a
    non-empty final name."""
    cut = name.rfind(schema.TEMP_MARKER)
    if cut <= 0:
        return None
    return TEMP_NAME.fullmatch(name, cut)


def is_temp_name(name: str) -> bool:
    """Whether `name` is one popviz gives a file while writing it (now or before)."""
    if _temp_match(name) is not None:
        return True
    cut = name.rfind(schema.PROFILE_SUFFIX + schema.LEGACY_TEMP_MARKER)
    return cut > 0 and LEGACY_TEMP_NAME.fullmatch(name, cut) is not None


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid we can judge: keep the file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # someone else's process; not a pid at all
        return True
    return True


def _holds_a_profile_or_nothing(path: Path, expected: os.stat_result) -> bool:
    """Empty, or an HDF5 file, read without following a link; still the file stat'ed."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        now = os.fstat(fd)
        if (now.st_ino, now.st_dev) != (expected.st_ino, expected.st_dev):
            return False
        return now.st_size == 0 or os.pread(fd, len(HDF5_SIGNATURE), 0) == HDF5_SIGNATURE
    except OSError:
        return False
    finally:
        os.close(fd)


def is_stale(path: Path, now: float | None = None) -> bool:
    """A profile writer's temporary file whose process is gone and which is not brand new:
    the exact name, a dead pid, over STALE_AFTER_S old, a regular file, empty or HDF5."""
    match = _temp_match(path.name)
    if match is None or pid_alive(int(match.group("pid"))):
        return False
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(info.st_mode):
        return False
    if (now if now is not None else time.time()) - info.st_mtime < STALE_AFTER_S:
        return False
    return _holds_a_profile_or_nothing(path, info)


def remove_stale_in(folder: Path) -> list[Path]:
    """Remove dead profile writers' temporary files directly in `folder` (only a writer
    into `folder` calls this); the ones removed."""
    removed = []
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except OSError:
        return []
    for name in names:
        path = folder / name
        if is_stale(path):
            with contextlib.suppress(OSError):  # a read-only folder, or gone already
                path.unlink()
                removed.append(path)
    return removed


def reserve(fd: int, offset: int, length: int) -> None:
    """Reserve `length` bytes of disk at `offset` of `fd` (a full disk: OSError ENOSPC);
    nothing where the file system cannot reserve (the writes will say)."""
    if not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
            raise


def write_whole(temp: Path, data: memoryview | bytes) -> None:
    """Create `temp` (never an existing file, never through a link) holding `data`, synced.
    The space is reserved first, so a full disk fails here, before a byte is written, as
    an OSError (ENOSPC); the caller removes `temp`."""
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        view = memoryview(data).cast("B")
        if len(view):
            reserve(fd, 0, len(view))
        while len(view):
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def replacing(finals: Sequence[Path], label: object = None) -> Iterator[list[Path]]:
    """Temporary paths for `finals`, to be written in the block. On a clean exit each is
    fsynced and renamed over its final name; on any error (a full disk, Ctrl-C) all of
    them are removed, nothing is left under a final name, and an OSError is re-raised
    naming `label` (default: the first final path) instead of a temporary file."""
    temps = [temp_name(final) for final in finals]
    try:
        yield temps
        for temp in temps:
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for temp, final in zip(temps, finals, strict=True):
            os.replace(temp, final)
    except BaseException as exc:
        for temp in temps:
            with contextlib.suppress(OSError):
                temp.unlink()
        if isinstance(exc, OSError):
            raise write_error(exc, label if label is not None else finals[0]) from exc
        raise


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[Callable[[], None]]:
    """Hold Ctrl-C (SIGINT) while a file is written; raise KeyboardInterrupt after.

    Python runs a signal handler wherever the main thread happens to be, including inside
    h5py's finalizers, where the KeyboardInterrupt is printed and ignored and the write
    carries on. Here the handler only records the signal; the yielded `check()` raises it
    between datasets, and leaving the block raises it if it came during the last one. In
    a thread other than the main one (which cannot set handlers) nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    caught: list[int] = []

    def record(signum: int, frame: object) -> None:
        caught.append(signum)

    def check() -> None:
        if caught:
            raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None):
        yield lambda: None
        return
    signal.signal(signal.SIGINT, record)
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, previous)
    check()
