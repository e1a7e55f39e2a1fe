"""Temporary names of profiles being written, their clean-up, and Ctrl-C during a write.

A writer builds `<name>.h5.tmp-<pid>-<thread>-<random>` and renames it when complete, so
two threads of one process, or two processes, never share a temporary file. A writer that
was killed leaves its temporary file behind; the next writer in that folder, or
`popviz.discover`, removes those whose process is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from popviz.format import schema

# A temporary file younger than this is left alone even if its pid looks dead: the
# writer may run in another pid namespace (a container) sharing the folder.
STALE_AFTER_S = 60.0
_PID = re.compile(re.escape(schema.TEMP_MARKER) + r"(\d+)(?:-|$)")


def temp_name(final: Path) -> Path:
    """A temporary path next to `final`, unique per process, thread and call."""
    return final.with_name(f"{final.name}{schema.TEMP_MARKER}{os.getpid()}-"
                           f"{threading.get_ident()}-{secrets.token_hex(4)}")


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid we can judge: keep the file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def is_stale(path: Path, now: float | None = None) -> bool:
    """A writer's temporary file whose process is gone and which is not brand new."""
    match = _PID.search(path.name)
    if match is None or pid_alive(int(match.group(1))):
        return False
    try:
        age = (now if now is not None else time.time()) - path.stat().st_mtime
    except OSError:
        return False
    return age >= STALE_AFTER_S


def remove_stale(paths: Iterable[Path]) -> list[Path]:
    """Remove the stale temporary files among `paths`; the ones removed."""
    removed = []
    for path in paths:
        if schema.TEMP_MARKER in path.name and is_stale(path):
            with contextlib.suppress(OSError):  # a read-only folder, or gone already
                path.unlink()
                removed.append(path)
    return removed


def remove_stale_in(folder: Path) -> list[Path]:
    """Remove dead writers' temporary files directly in `folder`."""
    try:
        candidates = list(folder.glob(f"*{schema.TEMP_MARKER}*"))
    except OSError:
        return []
    return remove_stale(candidates)


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
