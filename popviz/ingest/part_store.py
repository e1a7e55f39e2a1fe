"""Each rank's tables between its parse and the write, kept off the heap once they add up.

`popviz import` of a job needs every rank's p2p calls and first events before it can
write any rank (the clocks and the matching of sends to receives span the ranks), but
not every rank's tables at once. `PartStore.put` keeps a parsed rank's light fields in
memory (its calls, stages, meta: what the cross-rank steps read) and its tables, the
bulk, in memory until `MEMORY_BYTES` are held, then in a pickle file per rank in a
temporary folder (`popviz-import-<pid>-...` in the system's), removed when the store
closes; one a killed import left is removed by the next store that spills. `take` hands
a rank back whole, once.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from popviz.format.tempfiles import STALE_AFTER_S, pid_alive
from popviz.ingest.import_rank import HEAVY, RankPart, light_of

# what the store holds in memory before it spills to disk: a test's or a live run's small
# ranks stay; a job's go to disk, which costs nothing measurable (4 ranks x 300k events:
# 5.35 s all spilled, 5.44 s all held, 362 / 409 MiB peak) and keeps the client flat
MEMORY_BYTES = 16 << 20


def frame_bytes(value: Any) -> int:
    """About what a table holds: its arrays, and ~64 bytes a text cell (a shallow count;
    a deep one reads every string)."""
    if isinstance(value, pd.DataFrame):
        return sum(int(value[c].to_numpy().nbytes) if value[c].dtype.kind in "iufbmM"
                   else 64 * len(value) for c in value.columns)
    if isinstance(value, dict):
        return sum(frame_bytes(v) for v in value.values())
    return 0


SPILL_PREFIX = "popviz-import-"
SPILL_NAME = re.compile(re.escape(SPILL_PREFIX) + r"(?P<pid>[1-9][0-9]{0,9})-[A-Za-z0-9_]{4,16}")
SPILL_FILE = re.compile(r"rank-[0-9]+\.pickle")


def remove_stale_spills(folder: str | None = None) -> None:
    """Remove the spill folders an import killed before its clean-up left in the temp
    folder: only a folder named as a store names it, whose process is gone, over a minute
    old, not a link, holding nothing but the store's rank files."""
    where = Path(folder or tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for entry in where.iterdir():
            found = SPILL_NAME.fullmatch(entry.name)
            if found is None or pid_alive(int(found["pid"])):
                continue
            with contextlib.suppress(OSError):
                if entry.is_symlink() or not entry.is_dir() \
                        or time.time() - entry.stat().st_mtime < STALE_AFTER_S:
                    continue
                files = list(entry.iterdir())
                if all(SPILL_FILE.fullmatch(f.name) and f.is_file() and not f.is_symlink()
                       for f in files):
                    shutil.rmtree(entry)


class PartStore:
    """Ranks' heavy tables by rank, in memory up to `memory_bytes`, then on disk."""

    def __init__(self, memory_bytes: int | None = None) -> None:
        self.memory_bytes = MEMORY_BYTES if memory_bytes is None else memory_bytes
        self.held = 0
        # by id() of the light part handed out, which each entry also holds (so the id
        # is not reused while the entry lives)
        self._memory: dict[int, tuple[RankPart, dict[str, Any]]] = {}
        self._spilled: dict[int, tuple[RankPart, Path]] = {}
        self._names = itertools.count()
        self._folder: Path | None = None

    def __enter__(self) -> PartStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put(self, part: RankPart) -> RankPart:
        """Keep `part`'s tables; returns the part without them (what stays in memory)."""
        heavy = {name: getattr(part, name) for name in HEAVY}
        size = sum(frame_bytes(v) for v in heavy.values())
        light = light_of(part)
        key = id(light)
        if self.held + size <= self.memory_bytes:
            self._memory[key] = (light, heavy)
            self.held += size
        else:
            if self._folder is None:
                remove_stale_spills()
                self._folder = Path(tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-"))
            path = self._folder / f"rank-{next(self._names)}.pickle"  # never reused
            with path.open("wb") as f:
                pickle.dump(heavy, f, protocol=pickle.HIGHEST_PROTOCOL)
            self._spilled[key] = (light, path)
        return light

    def take(self, light: RankPart) -> RankPart:
        """`light` with its tables back (each rank taken once: the store forgets it)."""
        key = id(light)
        if key in self._memory:
            heavy = self._memory.pop(key)[1]
            self.held -= sum(frame_bytes(v) for v in heavy.values())
        else:
            path = self._spilled.pop(key)[1]
            with path.open("rb") as f:
                heavy = pickle.load(f)  # our own file, written by put()
            path.unlink()
        return replace(light, **heavy, row_counts={})

    def update(self, light: RankPart, change: Callable[[RankPart], None]) -> RankPart:
        """Apply `change` to the whole part and keep it again; the new light part."""
        part = self.take(light)
        change(part)
        return self.put(part)

    def close(self) -> None:
        self._memory.clear()
        self._spilled.clear()
        if self._folder is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(self._folder)
            self._folder = None
