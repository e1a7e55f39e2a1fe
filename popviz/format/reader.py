"""Read a profile: `popviz.open(path) -> Profile` with lazily loaded pandas tables.

Every way a file can be wrong (missing, not HDF5, truncated, foreign, incomplete, too new)
becomes a `ProfileError` with one line naming the file, never a raw h5py traceback.
"""

from __future__ import annotations

import builtins
import json
import os
import threading
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd

from popviz.errors import ProfileError
from popviz.format import schema
from popviz.format.containment import check_self_contained
from popviz.vocab import MODELLED_KIND


def discover(directory: str | os.PathLike[str]) -> list[Path]:
    """Every profile file under `directory` (recursively), sorted; temporary files skipped.

    A `.h5` path is returned as a one-item list. Files are not opened here: a broken file
    is listed too, and `open` on it raises the reason.
    """
    root = Path(directory)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ProfileError(f"{root}: no such file or directory")
    found = [p for p in root.rglob(f"*{schema.PROFILE_SUFFIX}")
             if p.is_file() and schema.TEMP_MARKER not in p.name and not p.name.startswith(".")]
    return sorted(found)


def open(path: str | os.PathLike[str]) -> Profile:
    """Open a `.h5` profile, or a directory that holds exactly one profile."""
    return Profile(_resolve(Path(path)))


def _resolve(path: Path) -> Path:
    if path.is_dir():
        direct = path / schema.PROFILE_FILENAME
        if direct.is_file():
            return direct
        found = discover(path)
        if not found:
            raise ProfileError(f"{path}: no profile (.h5) in this directory")
        if len(found) > 1:
            names = ", ".join(str(p.relative_to(path)) for p in found[:6])
            raise ProfileError(
                f"{path}: holds {len(found)} profiles ({names}); open one of them, "
                "or list them with popviz.discover"
            )
        return found[0]
    if not path.exists():
        raise ProfileError(f"{path}: no such file or directory")
    return path


class Profile:
    """One profile file. Tables load on first access and stay cached."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # One re-entrant lock per file for every read and lazily built value (no
        # functools.cached_property: on 3.11 its lock is shared by all instances).
        self._lock = threading.RLock()
        self._tables: dict[str, pd.DataFrame] = {}
        self._string_table: np.ndarray | None = None
        self._h5 = self._open_checked()
        try:
            attrs = self._h5.attrs
            self.format_version = str(attrs["format_version"])
            self.kind = str(attrs.get("kind", MODELLED_KIND))
            self.command_line = str(attrs.get("command_line", ""))
            self.creator = str(attrs.get("creator", ""))
            self.torch_version = str(attrs.get("torch_version", ""))
            self.created_utc = str(attrs.get("created_utc", ""))
            self.meta: dict[str, Any] = json.loads(str(attrs["meta"]))
            self.summary: dict[str, Any] = json.loads(str(attrs.get("summary", "{}")))
            self._check_tables()
        except ProfileError:
            self.close()
            raise
        except (KeyError, ValueError, OSError, TypeError) as exc:
            self.close()
            raise ProfileError(f"{self.path}: damaged profile ({_one_line(exc)})") from None

    # ---- opening and validation ----
    def _open_checked(self) -> h5py.File:
        path = self.path
        if not path.is_file():
            raise ProfileError(f"{path}: not a file")
        if path.stat().st_size == 0:
            raise ProfileError(f"{path}: empty file, not a popviz profile")
        try:
            is_hdf5 = h5py.is_hdf5(path)
        except OSError as exc:
            raise ProfileError(f"{path}: cannot read ({_one_line(exc)})") from None
        if not is_hdf5:
            raise ProfileError(f"{path}: not an HDF5 file, so not a popviz profile")
        try:
            h5 = h5py.File(path, "r")
        except OSError as exc:
            raise ProfileError(
                f"{path}: HDF5 file is truncated or damaged ({_one_line(exc)})"
            ) from None
        fmt = h5.attrs.get("format")
        if fmt is None or str(fmt) != schema.FORMAT_NAME:
            h5.close()
            raise ProfileError(f"{path}: HDF5 file but not a popviz profile (format={fmt!r})")
        version = str(h5.attrs.get("format_version", ""))
        try:
            major = schema.major_of(version)
        except ValueError:
            h5.close()
            raise ProfileError(f"{path}: unreadable format_version {version!r}") from None
        if major != schema.FORMAT_MAJOR:
            h5.close()
            newer = "newer" if major > schema.FORMAT_MAJOR else "older"
            raise ProfileError(
                f"{path}: profile format {version} is {newer} than this popviz reads "
                f"({schema.FORMAT_VERSION}); use a matching popviz"
            )
        try:
            check_self_contained(h5, str(path))
        except ProfileError:
            h5.close()
            raise
        return h5

    def _check_tables(self) -> None:
        tables = self._h5.get(schema.TABLES_GROUP)
        if not isinstance(tables, h5py.Group):
            raise ProfileError(f"{self.path}: damaged profile (no '{schema.TABLES_GROUP}' group)")
        if schema.STRINGS_DATASET not in self._h5:
            raise ProfileError(f"{self.path}: damaged profile (no string table)")
        for name, columns in schema.CONTRACT_COLUMNS.items():
            group = tables.get(name)
            if not isinstance(group, h5py.Group):
                raise ProfileError(f"{self.path}: damaged profile (table '{name}' is missing)")
            self._check_group(name, group, columns)

    def _check_group(self, name: str, group: h5py.Group, required: tuple[str, ...]) -> None:
        order = [str(c) for c in group.attrs.get("column-order", [])]
        n_rows = int(group.attrs.get("n_rows", -1))
        for column in set(order) | set(required):
            dataset = group.get(column)
            if not isinstance(dataset, h5py.Dataset):
                raise ProfileError(
                    f"{self.path}: damaged profile (table '{name}' lacks column '{column}')"
                )
            if dataset.shape != (n_rows,):
                raise ProfileError(
                    f"{self.path}: damaged profile (table '{name}' column '{column}' has "
                    f"{dataset.shape[0] if dataset.shape else 0} rows, expected {n_rows})"
                )

    # ---- identity ----
    @property
    def name(self) -> str:
        """A short label: the folder that holds profile.h5, or the file's stem."""
        if self.path.name == schema.PROFILE_FILENAME:
            return self.path.parent.name
        return self.path.stem

    def __repr__(self) -> str:
        return f"<popviz.Profile {self.path} kind={self.kind} v{self.format_version}>"

    def __enter__(self) -> Profile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        h5 = getattr(self, "_h5", None)
        if h5 is not None and h5.id.valid:
            h5.close()

    # ---- tables ----
    @property
    def table_names(self) -> list[str]:
        return sorted(self._h5[schema.TABLES_GROUP].keys())

    def table(self, name: str) -> pd.DataFrame:
        """A table as a DataFrame (cached). An absent optional table reads back empty."""
        with self._lock:
            if name not in self._tables:
                self._tables[name] = self._read_table(name)
            return self._tables[name]

    def _read_table(self, name: str, rows: slice | None = None) -> pd.DataFrame:
        group = self._h5[schema.TABLES_GROUP].get(name)
        if group is None:
            known = schema.OPTIONAL_COLUMNS.get(name)
            if known is None:
                have = ", ".join(self.table_names)
                raise KeyError(f"{self.path}: no table {name!r} (has {have})")
            return pd.DataFrame({c: [] for c in known})
        order = [str(c) for c in group.attrs["column-order"]]
        data: dict[str, Any] = {}
        try:
            for column in order:
                dataset = group[column]
                values = dataset[rows] if rows is not None else dataset[()]
                data[column] = self._decode(values, str(dataset.attrs.get("encoding", "")))
        except (OSError, KeyError, ValueError) as exc:
            raise ProfileError(
                f"{self.path}: damaged table '{name}' ({_one_line(exc)})"
            ) from None
        return pd.DataFrame(data, columns=order)

    @property
    def _strings(self) -> np.ndarray:
        with self._lock:
            if self._string_table is None:
                raw = self._h5[schema.STRINGS_DATASET][()]
                self._string_table = np.array(
                    [s.decode("utf-8") if isinstance(s, bytes) else str(s) for s in raw],
                    dtype=object)
            return self._string_table

    def _decode(self, values: np.ndarray, encoding: str) -> Any:
        if encoding == schema.ENC_BOOL:
            return values.astype(bool)
        if encoding == schema.ENC_STRING_REF:
            return self._strings[values] if len(values) else np.array([], dtype=object)
        if encoding == schema.ENC_INT_OR_STRING:
            texts = self._strings[values] if len(values) else np.array([], dtype=object)
            return np.array([int(t) if t.lstrip("-").isdigit() else t for t in texts],
                            dtype=object)
        return values

    stages = property(lambda self: self.table("stages"))
    trace = property(lambda self: self.table("trace"))
    liveness = property(lambda self: self.table("liveness"))
    tile_memory = property(lambda self: self.table("tile_memory"))
    exchange = property(lambda self: self.table("exchange"))
    ops = property(lambda self: self.table("ops"))
    tensors = property(lambda self: self.table("tensors"))
    variables = property(lambda self: self.table("variables"))
    oom = property(lambda self: self.table("oom"))

    # ---- partial reads for big profiles ----
    def trace_for(self, ipu: int, start: float | None = None,
                  end: float | None = None) -> pd.DataFrame:
        """One IPU's events overlapping [start, end), read through the per-IPU offsets."""
        index = self._h5.get(schema.INDEX_GROUP)
        if index is None or "trace_ipus" not in index:
            frame = self.trace[self.trace["ipu"] == ipu]
        else:
            ipus = index["trace_ipus"][()]
            offsets = index["trace_offsets"][()]
            where = np.flatnonzero(ipus == ipu)
            if not len(where):
                return self._read_table("trace", slice(0, 0))
            k = int(where[0])
            frame = self._read_table("trace", slice(int(offsets[k]), int(offsets[k + 1])))
        if start is not None:
            frame = frame[frame["end"] > start]
        if end is not None:
            frame = frame[frame["start"] < end]
        return frame.reset_index(drop=True)

    @property
    def array_names(self) -> list[str]:
        group = self._h5.get(schema.ARRAYS_GROUP)
        return sorted(group.keys()) if group is not None else []

    def array_shape(self, name: str) -> tuple[int, ...]:
        group = self._h5.get(schema.ARRAYS_GROUP)
        if group is None or name not in group:
            return ()
        return tuple(group[name].shape)

    def tile_liveness(self, ipu: int, step_start: int = 0,
                      step_stop: int | None = None) -> np.ndarray:
        """Steps x tiles of not-always-live bytes for one IPU, reading only that slice."""
        group = self._h5.get(schema.ARRAYS_GROUP)
        if group is None or "tile_liveness" not in group:
            return np.zeros((0, 0), dtype=np.uint32)
        dataset = group["tile_liveness"]
        if not 0 <= ipu < dataset.shape[0]:
            raise IndexError(f"IPU {ipu} not in profile (it has {dataset.shape[0]})")
        return dataset[ipu, step_start:step_stop, :]


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


# `open` shadows the builtin inside this module; keep the builtin reachable for helpers.
builtin_open = builtins.open
