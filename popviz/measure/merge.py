"""Merge the per-rank profiles of one measured run into one profile (`popviz merge`).

Every rank already split its P2P waits into waiting and transfer with its peers' post
times (all-gathered at the end of the run), so merging concatenates: trace, p2p, liveness,
exchange (each rank holds the transfers it received, so each transfer appears once), ops
(renumbered) and stages; meta comes from rank 0 with `measure.ranks`; the summary is
recomputed over all ranks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from popviz.errors import ProfileError
from popviz.ingest import tables as tbl
from popviz.ingest.import_limits import MAX_WORLD
from popviz.vocab import MEASURED_KIND, is_measured, rank_label

CONCAT_TABLES = ("trace", "p2p", "liveness", "exchange", "ops", "stages", "tile_memory",
                 "variables")


def rank_files(inputs: list[str | os.PathLike[str]]) -> tuple[list[Path], set[Path]]:
    """Files named directly, and every profile under directories named (the second
    set: those found in a directory, where an earlier merged profile may sit)."""
    from popviz.format.reader import discover

    files: list[Path] = []
    found: set[Path] = set()
    for item in inputs:
        paths = [p.resolve() for p in discover(item)]
        files.extend(paths)
        if Path(item).is_dir():
            found.update(paths)
    if not files:
        raise ProfileError(f"no profile (.h5) in {' '.join(map(str, inputs))}")
    return sorted(dict.fromkeys(files)), found


def _check(profiles: list[Any]) -> list[Any]:
    """Rank profiles of one run, sorted by rank; ProfileError naming the first problem."""
    for p in profiles:
        if not is_measured(p.kind):
            raise ProfileError(f"{p.path}: a {p.kind} profile; merge takes measured rank "
                               "profiles only")
        if "rank" not in p.meta.get("measure", {}):
            raise ProfileError(f"{p.path}: not a rank profile (already merged?)")
    first = profiles[0].meta["measure"]
    for p in profiles[1:]:
        m = p.meta["measure"]
        if m.get("run_id") != first.get("run_id"):
            raise ProfileError(f"{p.path}: from another run than {profiles[0].path} "
                               f"(run {m.get('run_id')} vs {first.get('run_id')})")
    world = _count(first.get("world_size", len(profiles)), profiles[0].path, "world_size",
                   1, MAX_WORLD)
    ranks = [_count(p.meta["measure"]["rank"], p.path, "rank", 0, world - 1)
             for p in profiles]
    seen: set[int] = set()
    dup = next((r for r in ranks if r in seen or seen.add(r)), None)  # type: ignore[func-returns-value]  # add() is None: adds, then tests
    if dup is not None:
        raise ProfileError(f"{rank_label(dup)} given twice")
    missing = [r for r in range(world) if r not in seen]  # world: at most MAX_WORLD
    if missing:
        named = ", ".join(map(str, missing[:10])) + (f", ... ({len(missing):,} in all)"
                                                      if len(missing) > 10 else "")
        raise ProfileError(f"rank(s) {named} of {world} missing; merge needs every rank's "
                           "profile")
    return [p for _, p in sorted(zip(ranks, profiles), key=lambda rp: rp[0])]


def _count(value: Any, path: Path, key: str, low: int, high: int) -> int:
    """A whole number in low..high from a rank profile's meta.measure, else ProfileError
    naming the file (a `world_size` of 10**12 must not become a set of 10**12 ranks)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    if not ok:
        raise ProfileError(f"{path}: meta.measure.{key} {str(value)[:40]} is not a whole "
                           f"number in {low}..{high:,}")
    return int(value)


def merged_tables(profiles: list[Any]) -> dict[str, pd.DataFrame]:
    out: dict[str, pd.DataFrame] = {}
    for name in CONCAT_TABLES:
        parts = [p.table(name) for p in profiles if name in p.table_names]
        parts = [t for t in parts if len(t)] or parts[:1]
        if not parts:  # an optional table no rank has
            continue
        out[name] = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    out["trace"] = out["trace"].sort_values(["ipu", "start", "end"], kind="stable") \
        .reset_index(drop=True)
    out["ops"] = tbl.renumber_ops(out["ops"])
    out["stages"] = out["stages"].sort_values("stage").reset_index(drop=True)
    return out


def merged_meta(profiles: list[Any]) -> dict[str, Any]:
    meta = dict(profiles[0].meta)
    measure = dict(meta["measure"])
    measure.pop("rank", None)
    measure["ranks"] = [int(p.meta["measure"]["rank"]) for p in profiles]
    measure["stages"] = [s for p in profiles for s in p.meta["measure"].get("stages", [])]
    measure["merged_from"] = [str(p.path) for p in profiles]
    measure["clock"] = {str(p.meta["measure"]["rank"]): p.meta["measure"].get("clock", {})
                        for p in profiles}
    measure["losses"] = next((p.meta["measure"]["losses"] for p in profiles
                              if p.meta["measure"].get("losses")), [])
    meta["measure"] = measure
    meta["ranks"] = measure["ranks"]
    return meta


def merge_profiles(inputs: list[str | os.PathLike[str]], out: str | os.PathLike[str], *,
                   command_line: str | None = None,
                   opener: Callable[[Path], Any] | None = None) -> Path:
    """Merge the rank profiles found in `inputs` (files or directories) into `out`.
    `opener` opens each rank file (default `popviz.open`; the CLI's vets it first)."""
    from popviz.format.reader import open as open_profile
    from popviz.format.writer import profile_path, write_profile

    opening = opener or open_profile
    files, in_dirs = rank_files(inputs)
    target = profile_path(out).resolve()
    profiles: list[Any] = []
    try:
        for f in files:  # inside the try: a refused file closes those opened before it
            if f != target:
                profiles.append(opening(f))
        # a directory may also hold an earlier merge of the same run: not an input
        keep = [p for p in profiles if p.path.resolve() not in in_dirs
                or "ranks" not in p.meta.get("measure", {})]
        for p in profiles:
            if p not in keep:
                p.close()
        profiles = keep
        if not profiles:
            raise ProfileError(f"no rank profile in {' '.join(map(str, inputs))} (a run "
                               "of this popviz writes one merged profile: nothing to merge)")
        profiles = _check(profiles)
        result = merged_tables(profiles)
        meta = merged_meta(profiles)
    finally:
        for p in profiles:
            p.close()
    return write_profile(target, meta=meta, tables=result,
                         summary=tbl.summary(result, meta), kind=MEASURED_KIND,
                         command_line=command_line)
