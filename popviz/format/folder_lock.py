"""One writer per profile folder: `.popviz-writer.lock`, held for a whole run.

Two `train.py --profile` runs into one folder used to end with `training/` from one and
`inference/` from the other, silently. A run holds an exclusive `flock` on the lock file
(released by the kernel however the process ends, so a killed run never blocks the next)
and writes its pid and command line into it, so a second run can say who is writing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".popviz-writer.lock"


class FolderInUse(Exception):
    """Another live process is writing profiles into the folder (one line)."""


def _try_lock(fd: int) -> bool:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock, as before
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def hold_folder(folder: str | os.PathLike[str], command_line: str = "") -> Iterator[Path]:
    """Hold `folder` for writing profiles; FolderInUse if another process holds it."""
    from popviz.format.guards import refuse_special_output

    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    lock = root / LOCK_NAME
    refuse_special_output(lock)  # a FIFO there is not ours to lock, truncate or remove
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        if not _try_lock(fd):
            holder = _read_holder(fd)
            os.close(fd)
            raise FolderInUse(f"{root}: another run is writing profiles here ({holder}); "
                              "wait for it to finish or choose another --profile-dir")
        # the previous holder may have removed the file between our open and our lock
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        text = (f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{command_line or ' '.join(sys.argv)}")[:500]
        os.ftruncate(fd, 0)
        os.write(fd, text.encode("utf-8", "replace"))
        yield lock
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()  # before unlocking, so nobody locks a removed file unnoticed
        os.close(fd)


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 500, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return " ".join(text.split()) or "pid unknown"
