"""The string table: every string of every table stored once, columns hold int32 codes.

Format 1.1 stores it as `/strings/bytes` (uint8, the UTF-8 texts one after another) and
`/strings/offsets` (int64, one longer: text k is bytes[offsets[k]:offsets[k+1]]), chunked
with Fletcher-32 checksums, so damage is detected when read. Format 1.0 stored one
variable-length string dataset `/strings` (a damaged vlen heap can make HDF5 loop for
ever); the reader refuses 1.0 files before reading anything (reader.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import h5py
import numpy as np
import pandas as pd

from popviz.errors import ProfileError
from popviz.format import schema
from popviz.format.bounds import check_strings
from popviz.format.validate import check_storage, declared_bytes

BYTES = "bytes"
OFFSETS = "offsets"


class StringTable:
    """Interns strings while a profile is written; `write` stores them (format 1.1)."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}

    def encode(self, values: Iterable[str], *, all_str: bool = False) -> np.ndarray:
        """int32 codes of `values`; `all_str`: the caller knows each one is a str."""
        items = values if all_str and isinstance(values, np.ndarray) \
            else np.asarray(list(values), dtype=object)
        if all_str or pd.api.types.infer_dtype(items, skipna=False) == "string":
            # all str already: hash them (sorted uniques, as np.unique would give) without
            # a fixed-width copy of the column (300k op names: ~70 MB of UCS-4)
            inverse, uniques = pd.factorize(items, sort=True)
        else:
            uniques, inverse = np.unique(items.astype(str), return_inverse=True)
        lookup = np.array([self._code(u) for u in uniques.tolist()], dtype=np.int32)
        return lookup[inverse] if len(uniques) else np.zeros(0, dtype=np.int32)

    def texts(self) -> list[str]:
        """Every interned text, by code."""
        return list(self._codes)

    def encode_distinct(self, values: list[str]) -> np.ndarray:
        """int32 codes of `values`, few and mostly distinct (a categorical's categories),
        interned in the sorted order `encode` interns in, without its hashing of a
        column."""
        for text in sorted(set(values)):
            self._code(text)
        codes = self._codes
        return np.fromiter((codes[v] for v in values), dtype=np.int32, count=len(values))

    def _code(self, text: str) -> int:
        code = self._codes.get(text)
        if code is None:
            code = self._codes[text] = len(self._codes)
        return code

    def write(self, h5: h5py.File, store: object) -> None:
        """`store(group, name, array)` writes one dataset (the writer's chunked store)."""
        encoded = [text.encode("utf-8", "surrogatepass") for text in self._codes]
        lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        group = h5.create_group(schema.STRINGS_DATASET)
        store(group, BYTES, blob)  # type: ignore[operator]
        store(group, OFFSETS, offsets)  # type: ignore[operator]


def read_strings(h5: h5py.File, label: str) -> np.ndarray:
    """Every string of the table as an object array; ProfileError if it is damaged."""
    node = h5.get(schema.STRINGS_DATASET)
    if isinstance(node, h5py.Group):
        return _read_blob(node, label)
    raise ProfileError(f"{label}: damaged profile (no string table)")


def _read_blob(group: h5py.Group, label: str) -> np.ndarray:
    blob_ds, offsets_ds = group.get(BYTES), group.get(OFFSETS)
    if not isinstance(blob_ds, h5py.Dataset) or not isinstance(offsets_ds, h5py.Dataset):
        raise ProfileError(f"{label}: damaged string table (bytes or offsets missing)")
    if blob_ds.ndim != 1 or blob_ds.dtype != np.uint8 or offsets_ds.ndim != 1 \
            or offsets_ds.dtype.kind not in "iu" or offsets_ds.shape[0] < 1:
        raise ProfileError(f"{label}: damaged string table (bytes must be 1-D uint8, "
                           "offsets 1-D integers)")
    _check_budget(declared_bytes(blob_ds) + 9 * declared_bytes(offsets_ds), label)
    size = _file_size(group)
    check_storage(blob_ds, label, "string table", size)
    check_storage(offsets_ds, label, "string table", size)
    blob = blob_ds[()].tobytes()
    offsets = offsets_ds[()].astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != len(blob) or (np.diff(offsets) < 0).any():
        raise ProfileError(f"{label}: damaged string table (offsets are not increasing "
                           f"from 0 to {len(blob):,})")
    check_strings(np.diff(offsets), label)
    texts = np.empty(len(offsets) - 1, dtype=object)
    try:
        for k, (a, b) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist(),
                                       strict=True)):
            texts[k] = blob[a:b].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{label}: damaged string table (string {k} is not UTF-8: "
                           f"{exc.reason})") from None
    return texts


def _file_size(node: h5py.HLObject) -> int:
    return int(node.file.id.get_filesize())


def _check_budget(nbytes: int, label: str) -> None:
    if nbytes > schema.READ_BUDGET_BYTES:
        raise ProfileError(f"{label}: string table declares {nbytes:,} bytes, more than "
                           f"the reader's budget of {schema.READ_BUDGET_BYTES:,}")


def decode(codes: np.ndarray, strings: np.ndarray, label: str, what: str) -> np.ndarray:
    """Strings for codes; a code outside the table is damage, never a wrong string."""
    if not len(codes):
        return np.array([], dtype=object)
    low, high = int(codes.min()), int(codes.max())
    if low < 0 or high >= len(strings):
        bad = low if low < 0 else high
        raise ProfileError(f"{label}: damaged {what} (string reference {bad} outside the "
                           f"string table of {len(strings):,})")
    return strings[codes]
