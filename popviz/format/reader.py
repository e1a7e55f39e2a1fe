"""Read a profile: `popviz.open(path) -> FileProfile` (a `Profile`) with lazily loaded pandas
tables.

Every way a file can be wrong (missing, not HDF5, truncated, foreign, incomplete, too new,
lying about its sizes, values outside the schema) becomes a `ProfileError` with one line
naming the file and the table, never a raw h5py traceback. Crashes and endless loops inside
libhdf5 cannot be caught in-process: `popviz.format.isolated` reads a file in a worker.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd

from popviz.errors import ProfileError, in_the_way_note, interrupted_by
from popviz.format import bounds, schema, validate
from popviz.format.containment import check_self_contained
from popviz.format.guards import refuse_special_input
from popviz.format.profile import Profile as Profile  # the type, re-exported
from popviz.format.profile import TableViews
from popviz.format.strings import decode as decode_strings
from popviz.format.strings import read_strings
from popviz.format.tempfiles import is_temp_name
from popviz.vocab import MODELLED_KIND, words_of


def discover(directory: str | os.PathLike[str]) -> list[Path]:
    """Every profile file under `directory` (recursively), sorted; temporary files, hidden
    folders, caches and virtual environments skipped.

    A `.h5` path is returned as a one-item list. Files are not opened here: a broken file
    is listed too, and `open` on it raises the reason. Nothing is removed: a dead
    writer's temporary file is the next writer's to clean up (tempfiles.py).
    """
    root = Path(directory)
    refuse_special_input(root)  # a FIFO or device: refused by what it is, never opened
    try:
        if root.is_file():
            return [root]
        if not root.is_dir():
            raise ProfileError(f"{root}: no such file or directory{in_the_way_note(root)}")
    except PermissionError:
        raise unreadable(root) from None
    found = []
    denied: list[OSError] = []  # folders we may not list: said when nothing else is found
    for folder, dirs, files in os.walk(root, onerror=denied.append):
        # not into hidden folders (.git, .venv), virtual environments or caches: `popviz
        # summary .` in a project would otherwise read h5py's own test files
        dirs[:] = [d for d in dirs if not _skipped_folder(Path(folder) / d)]
        found += [Path(folder) / f for f in files if f.endswith(schema.PROFILE_SUFFIX)
                  and not is_temp_name(f) and not f.startswith(".")
                  and _is_file(Path(folder) / f)]
    if not found and denied:  # "no profile here" would blame the folder's contents
        first = denied[0]
        raise unreadable(Path(first.filename) if first.filename else root)
    return sorted(found)



def unreadable(path: Path) -> ProfileError:
    """The one line for a folder or file this process may not read."""
    return ProfileError(f"{path}: cannot be read (permission denied)")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # not ours to look at: not listed
        return False


SKIPPED_FOLDERS = {"node_modules", "__pycache__", "site-packages", "venv"}


def _skipped_folder(path: Path) -> bool:
    """A folder discover does not walk into: hidden, a cache, or a virtual environment
    (its pyvenv.cfg says so whatever it is called)."""
    return path.name.startswith(".") or path.name in SKIPPED_FOLDERS or \
        _is_file(path / "pyvenv.cfg")


FileCheck = Callable[[os.stat_result], None]


def open(path: str | os.PathLike[str], *, check_file: FileCheck | None = None) -> FileProfile:
    """Open a `.h5` profile, or a directory that holds exactly one profile.

    `check_file` gets `os.fstat` of the file HDF5 opened, before anything in it is read
    past the superblock, and may raise ProfileError: a vetted file (popviz.vet) is thus
    known to be the very file opened, not one swapped in since it was vetted."""
    return FileProfile(profile_file(Path(path)), check_file=check_file)


def profile_file(path: Path) -> Path:
    """The profile file `path` names: itself, or the one profile in a directory."""
    try:
        return _profile_file(path)
    except PermissionError:  # a folder on the way we may not look into
        raise unreadable(path) from None


def _profile_file(path: Path) -> Path:
    if path.is_dir():
        direct = path / schema.PROFILE_FILENAME
        if direct.is_file():
            return direct
        found = discover(path)
        if not found:
            raise ProfileError(f"{path}: no profile (.h5) in this directory")
        if len(found) > 1:
            # each profile by the folder a command takes (train.py writes training/ and
            # inference/ side by side): the user can paste one
            names = ", ".join(str(p.parent if p.name == schema.PROFILE_FILENAME else p)
                              for p in found[:6])
            more = f" and {len(found) - 6} more" if len(found) > 6 else ""
            raise ProfileError(
                f"{path}: holds {len(found)} profiles; give one of them: {names}{more} "
                "(popviz serve shows them all)"
            )
        return found[0]
    refuse_special_input(path)
    if not path.exists():
        raise ProfileError(f"{path}: no such file or directory{in_the_way_note(path)}")
    return path


class FileProfile(TableViews):
    """One profile file (a `Profile`). Tables load on first access and stay cached.

    Every way the file can be wrong ends in `ProfileError` (one line naming the file and
    the table); declared shapes and sizes are checked at open, before any data is read."""

    def __init__(self, path: Path, check_file: FileCheck | None = None) -> None:
        self.path = Path(path)
        self._check_file = check_file
        # One re-entrant lock per file for every read and lazily built value (no
        # functools.cached_property: on 3.11 its lock is shared by all instances).
        self._lock = threading.RLock()
        self._tables: dict[str, pd.DataFrame] = {}
        self._specs: dict[str, validate.TableSpec] = {}
        self._string_table: np.ndarray | None = None
        self._string_lengths: np.ndarray | None = None
        self._dims: bounds.Dimensions | None = None
        self._h5 = self._open_checked()
        try:
            with self._guard("profile"):
                label = str(self.path)
                attrs = self._h5.attrs
                self.format_version = validate.text_attr(attrs, "format_version", label)
                self.kind = validate.text_attr(attrs, "kind", label, MODELLED_KIND)
                self.command_line = validate.text_attr(attrs, "command_line", label, "")
                self.creator = validate.text_attr(attrs, "creator", label, "")
                self.torch_version = validate.text_attr(attrs, "torch_version", label, "")
                self.created_utc = validate.text_attr(attrs, "created_utc", label, "")
                self.meta: dict[str, Any] = validate.json_object(
                    validate.text_attr(attrs, "meta", label, limit=schema.MAX_JSON_CHARS),
                    "meta", label)
                validate.check_meta(self.meta, label)
                self.device_kind, self.time_unit = self._words(attrs, label)
                self.meta.update(zip(schema.WORD_ATTRS, (self.device_kind, self.time_unit)))
                self.summary: dict[str, Any] = validate.json_object(
                    validate.text_attr(attrs, "summary", label, "{}",
                                       limit=schema.MAX_JSON_CHARS), "summary", label)
                self._check_tables()
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """Anything but ProfileError raised while reading `what` becomes one."""
        try:
            yield
        except ProfileError:
            raise
        except MemoryError:
            raise ProfileError(f"{self.path}: {what} does not fit in memory") from None
        except Exception as exc:  # the file is untrusted input
            if interrupted_by(exc):  # a Ctrl-C inside h5py, not damage
                raise KeyboardInterrupt from None
            raise ProfileError(
                f"{self.path}: damaged {what} ({type(exc).__name__}: {_one_line(exc)})"
            ) from None

    # ---- opening and validation ----
    def _open_checked(self) -> h5py.File:
        path = self.path
        refuse_special_input(path)
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
        except Exception as exc:  # OSError mostly; damage raises others
            if interrupted_by(exc):  # a Ctrl-C inside h5py, not damage
                raise KeyboardInterrupt from None
            raise ProfileError(
                f"{path}: HDF5 file is truncated or damaged ({_one_line(exc)})"
            ) from None
        try:
            if self._check_file is not None:
                self._check_file(os.fstat(h5.id.get_vfd_handle()))
            with self._guard("profile"):
                self._check_identity(h5)
                check_self_contained(h5, str(path))
        except BaseException:
            h5.close()
            raise
        return h5

    def _words(self, attrs: Any, label: str) -> tuple[str, str]:
        """(device_kind, time_unit) the file states (format 1.2); an older file's are what
        its kind and target imply (the upgrade path: vocab.words_of)."""
        stated = [validate.text_attr(attrs, key, label, "", limit=64)
                  for key in schema.WORD_ATTRS]
        implied = words_of(self.kind, {k: v for k, v in self.meta.items()
                                       if k not in schema.WORD_ATTRS})
        device_kind, time_unit = (s or i for s, i in zip(stated, implied))
        for key, value, allowed in (("device_kind", device_kind, schema.DEVICE_KINDS),
                                    ("time_unit", time_unit, schema.TIME_UNITS)):
            if value not in allowed:
                raise ProfileError(f"{label}: {key} {value[:40]!r} is not one of "
                                   f"{', '.join(allowed)}")
        return device_kind, time_unit

    def _check_identity(self, h5: h5py.File) -> None:
        path = self.path
        fmt = h5.attrs.get("format")
        if fmt is None or not isinstance(fmt, (str, bytes)) \
                or validate.text_attr(h5.attrs, "format", str(path)) != schema.FORMAT_NAME:
            raise ProfileError(f"{path}: HDF5 file but not a popviz profile "
                               f"(format={str(fmt)[:60]!r})")
        version = validate.text_attr(h5.attrs, "format_version", str(path), "", limit=64)
        try:
            major = schema.major_of(version)
        except ValueError:
            raise ProfileError(f"{path}: unreadable format_version {version!r}") from None
        if major != schema.FORMAT_MAJOR:
            newer = "newer" if major > schema.FORMAT_MAJOR else "older"
            raise ProfileError(
                f"{path}: profile format {version} is {newer} than this popviz reads "
                f"({schema.FORMAT_VERSION}); use a matching popviz"
            )
        if schema.version_tuple(version) < schema.OLDEST_READ:
            raise ProfileError(
                f"{path}: profile format {version} (a string table without checksums) is "
                f"no longer read; regenerate it with this popviz (train.py --profile, "
                f"popviz.record or popviz import)")

    def _check_tables(self) -> None:
        label = str(self.path)
        self._file_size = int(self._h5.id.get_filesize())
        tables = self._h5.get(schema.TABLES_GROUP)
        if not isinstance(tables, h5py.Group):
            raise ProfileError(f"{label}: damaged profile (no '{schema.TABLES_GROUP}' group)")
        if schema.STRINGS_DATASET not in self._h5:
            raise ProfileError(f"{label}: damaged profile (no string table)")
        if len(tables) > schema.MAX_COLUMNS:
            raise ProfileError(f"{label}: damaged profile ({len(tables):,} tables)")
        for name in schema.CONTRACT_COLUMNS:
            if not isinstance(tables.get(name), h5py.Group):
                raise ProfileError(f"{label}: damaged profile (table '{name}' is missing)")
        for name in tables:
            group = tables.get(name)
            if not isinstance(group, h5py.Group):
                raise ProfileError(f"{label}: damaged profile (table '{name}' is not a group)")
            self._specs[name] = validate.table_spec(
                group, name, label, self._file_size, schema.CONTRACT_COLUMNS.get(name, ()))
        arrays = self._h5.get(schema.ARRAYS_GROUP)
        if arrays is not None:
            if not isinstance(arrays, h5py.Group):
                raise ProfileError(f"{label}: damaged profile ('arrays' is not a group)")
            for name in arrays:
                dataset = arrays.get(name)
                if not isinstance(dataset, h5py.Dataset):
                    raise ProfileError(f"{label}: damaged array '{name}' (not a dataset)")
                validate.check_array(dataset, name, label, self._file_size)

    # ---- identity ----
    @property
    def name(self) -> str:
        """A short label: the folder that holds profile.h5, or the file's stem."""
        if self.path.name == schema.PROFILE_FILENAME:
            return self.path.parent.name
        return self.path.stem

    def __repr__(self) -> str:
        return f"<popviz.Profile {self.path} kind={self.kind} v{self.format_version}>"

    def __enter__(self) -> FileProfile:
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
        return sorted(self._specs)

    def table(self, name: str) -> pd.DataFrame:
        """A table as a DataFrame (cached). An absent optional table reads back empty."""
        with self._lock:
            if name not in self._tables:
                self._tables[name] = self._read_table(name)
            return self._tables[name]

    def _read_table(self, name: str, rows: slice | None = None) -> pd.DataFrame:
        spec = self._specs.get(name)
        if spec is None:
            known = schema.OPTIONAL_COLUMNS.get(name)
            if known is None:
                have = ", ".join(self.table_names)
                raise KeyError(f"{self.path}: no table {name!r} (has {have})")
            return pd.DataFrame({c: [] for c in known})
        label = str(self.path)
        with self._lock, self._guard(f"table '{name}'"):
            group = self._h5[schema.TABLES_GROUP][name]
            data: dict[str, Any] = {}
            text_chars = 0  # characters the table's text cells refer to
            for column in spec.order:
                dataset = group[column]
                values = dataset[rows] if rows is not None else dataset[()]
                if values.dtype.byteorder not in "=|":
                    values = values.astype(values.dtype.newbyteorder("="))
                validate.check_values(name, column, values, label)
                if spec.encodings[column] == schema.ENC_NUMERIC:
                    bounds.check_column(name, column, values, self._dimensions, label)
                data[column] = self._decode(values, spec.encodings[column],
                                            f"table '{name}' column '{column}'")
                if spec.encodings[column] not in (schema.ENC_NUMERIC, schema.ENC_BOOL) \
                        and len(values):  # codes checked against the table by the decoding
                    text_chars += bounds.text_chars(values, self._lengths())
            bounds.check_text_total(name, text_chars, schema.TEXT_BUDGET_BYTES, label)
            return pd.DataFrame(data, columns=spec.order)

    @property
    def _dimensions(self) -> bounds.Dimensions:
        """What this profile holds (devices, tiles, stages, rows): its values' bounds."""
        with self._lock:
            if self._dims is None:
                arrays = {name: self.array_shape(name) for name in self.array_names}
                self._dims = bounds.dimensions(
                    self.meta, self.device_kind,
                    {name: spec.n_rows for name, spec in self._specs.items()}, arrays)
            return self._dims

    def _lengths(self) -> np.ndarray:
        """Characters of each string of the string table."""
        with self._lock:
            if self._string_lengths is None:
                strings = self._strings
                self._string_lengths = np.fromiter((len(t) for t in strings),
                                                   dtype=np.int64, count=len(strings))
            return self._string_lengths

    @property
    def _strings(self) -> np.ndarray:
        with self._lock:
            if self._string_table is None:
                with self._guard("string table"):
                    self._string_table = read_strings(self._h5, str(self.path))
            return self._string_table

    def _decode(self, values: np.ndarray, encoding: str, what: str) -> Any:
        if encoding == schema.ENC_BOOL:
            return values.astype(bool)
        if encoding == schema.ENC_STRING_REF:
            return decode_strings(values, self._strings, str(self.path), what)
        if encoding == schema.ENC_INT_OR_STRING:
            texts = decode_strings(values, self._strings, str(self.path), what)
            return np.array([int(t) if t.lstrip("-").isdigit() and len(t) < 19 else t
                             for t in texts], dtype=object)
        return values

    # ---- partial reads for big profiles ----
    def trace_for(self, ipu: int, start: float | None = None,
                  end: float | None = None) -> pd.DataFrame:
        """One IPU's events overlapping [start, end), read through the per-IPU offsets."""
        with self._lock, self._guard("index of table 'trace'"):
            index = self._h5.get(schema.INDEX_GROUP)
            if not isinstance(index, h5py.Group) or "trace_ipus" not in index:
                frame = self.trace[self.trace["ipu"] == ipu]
            else:
                ipus, offsets = index["trace_ipus"], index["trace_offsets"]
                n_ipus = self._specs["trace"].n_rows + 1
                if not isinstance(ipus, h5py.Dataset) or not isinstance(offsets, h5py.Dataset) \
                        or ipus.ndim != 1 or len(ipus) > n_ipus or offsets.ndim != 1 \
                        or len(offsets) > n_ipus + 1 or ipus.dtype.kind not in "iu" \
                        or offsets.dtype.kind not in "iu":
                    raise ProfileError(f"{self.path}: damaged index of table 'trace'")
                ipus, offsets = ipus[()], offsets[()]
                validate.check_trace_index(ipus, offsets, self._specs["trace"].n_rows,
                                           str(self.path))
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
        shape = self.array_shape("tile_liveness")
        if not shape:
            return np.zeros((0, 0), dtype=np.uint32)
        if len(shape) != 3:
            raise ProfileError(f"{self.path}: damaged array 'tile_liveness' (shape {shape}, "
                               "expected IPUs x steps x tiles)")
        if not 0 <= ipu < shape[0]:
            raise IndexError(f"IPU {ipu} not in profile (it has {shape[0]})")
        with self._lock, self._guard("array 'tile_liveness'"):
            return self._h5[schema.ARRAYS_GROUP]["tile_liveness"][ipu, step_start:step_stop, :]


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


# `open` shadows the builtin inside this module; keep the builtin reachable for helpers.
builtin_open = builtins.open
