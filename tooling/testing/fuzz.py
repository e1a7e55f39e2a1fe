"""Mutants of profile files, each read in a worker with limits (tests/test_fuzz.py,
bench/bench_fuzz.py).

Byte mutants (bit flips, 4-byte flips, zeroed and swapped blocks, truncation) aim mostly
at HDF5's metadata (object headers, B-trees, heaps: everything outside the data chunks),
where damage makes libhdf5 crash or loop; attribute mutants tamper with what the reader
trusts (meta, n_rows, column-order, encodings, string codes, declared shapes). Every
mutant is read by `read_isolated` and counted by outcome.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from popviz.format.isolated import Verdict, read_isolated

BYTE_KINDS = ("bit", "flip4", "zero", "swap", "truncate")


def data_extents(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of every stored chunk or contiguous block of data in the file."""
    extents: list[tuple[int, int]] = []

    def visit(name: str, obj: object) -> None:
        if not isinstance(obj, h5py.Dataset):
            return
        dsid = obj.id
        if obj.chunks is not None:
            for k in range(dsid.get_num_chunks()):
                info = dsid.get_chunk_info(k)
                extents.append((int(info.byte_offset), int(info.size)))
        elif dsid.get_offset() is not None:
            extents.append((int(dsid.get_offset()), int(dsid.get_storage_size())))

    with h5py.File(path, "r") as h5:
        h5.visititems(visit)
    return extents


@dataclass
class Source:
    """A valid profile to mutate, with where its metadata (not its data) lies."""

    path: Path
    data: bytes = b""
    metadata: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        self.data = self.path.read_bytes()
        is_meta = np.ones(len(self.data), dtype=bool)
        for offset, size in data_extents(self.path):
            is_meta[offset:offset + size] = False
        self.metadata = np.flatnonzero(is_meta)


def byte_mutant(source: Source, rng: random.Random) -> tuple[str, bytes]:
    """One byte-level mutant; 3 in 4 land in the metadata."""
    raw = bytearray(source.data)
    kind = rng.choice(BYTE_KINDS)

    def where(span: int = 1) -> int:
        if rng.random() < 0.75 and len(source.metadata):
            at = int(source.metadata[rng.randrange(len(source.metadata))])
        else:
            at = rng.randrange(len(raw))
        return max(0, min(at, len(raw) - span))

    if kind == "bit":
        for _ in range(rng.randint(1, 4)):
            raw[where()] ^= 1 << rng.randrange(8)
    elif kind == "flip4":
        at = where(4)
        raw[at:at + 4] = rng.randbytes(4)
    elif kind == "zero":
        size = rng.choice((8, 64, 512, 4096))
        at = where(size)
        raw[at:at + size] = bytes(len(raw[at:at + size]))
    elif kind == "swap":
        size = rng.choice((16, 256, 4096))
        a, b = where(size), where(size)
        raw[a:a + size], raw[b:b + size] = raw[b:b + size], raw[a:a + size]
    else:
        raw = raw[:rng.randrange(len(raw))]
    return kind, bytes(raw)


def _set_attr(path: str, key: str, value: object) -> Callable[[h5py.File], None]:
    def mutate(h5: h5py.File) -> None:
        h5[path].attrs[key] = value
    return mutate


def _text(value: object) -> str:
    """An attribute's text: fixed-length (1.1) reads as bytes, variable-length as str."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _table(h5: h5py.File, rng: random.Random) -> h5py.Group:
    tables = h5["tables"]
    return tables[rng.choice(sorted(tables))]


def _tamper_n_rows(h5: h5py.File, rng: random.Random) -> None:
    _table(h5, rng).attrs["n_rows"] = rng.choice((10**8, -1, 2**62, 0, 10**6))


def _tamper_order(h5: h5py.File, rng: random.Random) -> None:
    group = _table(h5, rng)
    order = [_text(c) for c in group.attrs["column-order"]]
    choice = rng.randrange(3)
    if choice == 0:
        order = order + order[:1]
    elif choice == 1:
        order = [*order, "no_such_column"]
    else:
        order = order[1:]
    group.attrs["column-order"] = np.array(order, dtype=object)


def _tamper_codes(h5: h5py.File, rng: random.Random) -> None:
    refs = [(name, column) for name, group in sorted(h5["tables"].items())
            for column, data in sorted(group.items())
            if isinstance(data, h5py.Dataset) and data.shape[0]
            and _text(data.attrs.get("encoding", "")).endswith("string-ref")]
    if not refs:
        return
    name, column = rng.choice(refs)
    data = h5["tables"][name][column]
    values = data[()]
    values[rng.randrange(len(values))] = rng.choice((-1, 2**31 - 1, 10**6))
    data[...] = values


def _tamper_encoding(h5: h5py.File, rng: random.Random) -> None:
    group = _table(h5, rng)
    column = group[rng.choice(sorted(group))]
    column.attrs["encoding"] = rng.choice(("string-ref", "bool", "numeric", "pickle", ""))


def _tamper_group(h5: h5py.File, rng: random.Random) -> None:
    group = _table(h5, rng)
    name = rng.choice(sorted(group))
    del group[name]
    group.create_group(name)


def _tamper_shape(h5: h5py.File, rng: random.Random) -> None:
    if "arrays" in h5 and "tile_liveness" in h5["arrays"]:
        del h5["arrays/tile_liveness"]
        h5["arrays"].create_dataset("tile_liveness", shape=(2, 2**31, 1472), dtype="u4",
                                    chunks=(1, 64, 1472), compression="gzip")
    else:
        _tamper_n_rows(h5, rng)


def _tamper_nan(h5: h5py.File, rng: random.Random) -> None:
    data = h5["tables/stages/forward_cycles"]
    values = data[()].astype(np.float64)
    values[0] = rng.choice((np.nan, -1.0, np.inf))
    del h5["tables/stages/forward_cycles"]
    new = h5["tables/stages"].create_dataset("forward_cycles", data=values)
    new.attrs["encoding"] = "numeric"


ATTRIBUTE_MUTANTS: dict[str, Callable[[h5py.File, random.Random], None]] = {
    "meta=42": lambda h5, rng: _set_attr("/", "meta", "42")(h5),
    "meta nested": lambda h5, rng: _set_attr("/", "meta", "[" * 50_000 + "]" * 50_000)(h5),
    "meta not json": lambda h5, rng: _set_attr("/", "meta", "{")(h5),
    "summary list": lambda h5, rng: _set_attr("/", "summary", "[1, 2]")(h5),
    "version int": lambda h5, rng: _set_attr("/", "format_version", 1)(h5),
    "n_rows": _tamper_n_rows,
    "column-order": _tamper_order,
    "string codes": _tamper_codes,
    "encoding": _tamper_encoding,
    "column is a group": _tamper_group,
    "huge shape": _tamper_shape,
    "NaN cycles": _tamper_nan,
}


def attribute_mutant(source: Source, rng: random.Random, out: Path) -> str:
    """Write a copy of `source` with one attribute-level tampering to `out`."""
    name = rng.choice(sorted(ATTRIBUTE_MUTANTS))
    shutil.copyfile(source.path, out)
    with h5py.File(out, "a") as h5:
        ATTRIBUTE_MUTANTS[name](h5, rng)
    return name


@dataclass
class Campaign:
    """Counts per outcome, per mutation kind, and the worst cases."""

    outcomes: Counter[str] = field(default_factory=Counter)
    by_kind: dict[str, Counter[str]] = field(default_factory=dict)
    by_source: dict[str, Counter[str]] = field(default_factory=dict)
    max_rss_bytes: int = 0
    examples: list[tuple[str, str, Verdict]] = field(default_factory=list)

    def add(self, label: str, kind: str, verdict: Verdict, source: str = "") -> None:
        self.outcomes[verdict.outcome] += 1
        self.by_source.setdefault(source, Counter())[verdict.outcome] += 1
        self.by_kind.setdefault(kind, Counter())[verdict.outcome] += 1
        self.max_rss_bytes = max(self.max_rss_bytes, verdict.max_rss_bytes)
        if verdict.outcome not in ("ok", "profile_error") and len(self.examples) < 50:
            self.examples.append((label, kind, verdict))


def run_campaign(sources: list[Path], mutants: int, seed: int = 0, workers: int = 2,
                 timeout_s: float = 10.0, memory_bytes: int = 1 << 30,
                 probe: str | None = None, attribute_share: float = 0.25,
                 batch: int = 100, keep: Path | None = None,
                 progress: Callable[[int, Campaign], None] | None = None) -> Campaign:
    """Read `mutants` mutants of `sources` (seeded), each in a forked worker with limits.

    Mutants are made in this thread, a batch at a time, before any worker forks, so no
    worker inherits a lock held by h5py. `keep`: copy mutants that were not ok or a
    ProfileError there, to replay them; `progress(done, campaign)` after each batch."""
    rng = random.Random(seed)
    prepared = [Source(Path(p)) for p in sources]
    campaign = Campaign()
    with tempfile.TemporaryDirectory(prefix="popviz-fuzz-") as scratch:
        done = 0
        while done < mutants:
            jobs: list[tuple[str, str, Path, str]] = []
            for k in range(done, min(done + batch, mutants)):
                source = rng.choice(prepared)
                out = Path(scratch, f"mutant{k}.h5")
                if rng.random() < attribute_share:
                    kind = "attr: " + attribute_mutant(source, rng, out)
                else:
                    kind, raw = byte_mutant(source, rng)
                    out.write_bytes(raw)
                jobs.append((f"{source.path} #{k}", kind, out, str(source.path)))
            with ThreadPoolExecutor(max_workers=workers) as pool:
                verdicts = list(pool.map(
                    lambda job: read_isolated(job[2], timeout_s, memory_bytes, probe,
                                              start="fork"), jobs))
            for (label, kind, out, origin), verdict in zip(jobs, verdicts, strict=True):
                campaign.add(label, kind, verdict, origin)
                if keep is not None and verdict.outcome not in ("ok", "profile_error"):
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(out, keep / out.name)
                out.unlink()
            done += len(jobs)
            if progress is not None:
                progress(done, campaign)
    return campaign
