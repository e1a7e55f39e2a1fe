"""Read a format 1.0 string table (a contiguous vlen string dataset) without libhdf5.

libhdf5 follows the references of a variable-length dataset into the file's global heap;
a damaged heap can make it loop for ever while holding h5py's global lock (the most
common hang of the issue 10 fuzzing). The layout is simple and documented in the HDF5
file format specification: each element is 16 bytes (length u32, heap collection
address u64, object index u32) and each collection is "GCOL", version 1, 3 reserved
bytes, its size u64, then objects (index u16, reference count u16, 4 reserved bytes,
size u64, data padded to 8 bytes) until index 0. Parsing it here with bounds checks
turns any damage into a ProfileError.
"""

from __future__ import annotations

import os

import h5py
import numpy as np

from popviz.errors import ProfileError

_ELEMENT = np.dtype([("length", "<u4"), ("address", "<u8"), ("index", "<u4")])
_MAX_COLLECTION = 64 << 20


def read_vlen_strings(dataset: h5py.Dataset, label: str) -> np.ndarray | None:
    """The strings of a 1-D vlen string dataset, or None when its storage is not the
    plain contiguous kind this parser knows (then libhdf5 reads it)."""
    fcpl = dataset.file.id.get_create_plist()
    if dataset.id.get_create_plist().get_layout() != h5py.h5d.CONTIGUOUS \
            or fcpl.get_sizes() != (8, 8):
        return None
    count = dataset.shape[0]
    if count == 0:
        return np.empty(0, dtype=object)
    offset = dataset.id.get_offset()
    path = dataset.file.filename
    size = os.path.getsize(path)
    base = fcpl.get_userblock()
    if offset is None or offset + count * _ELEMENT.itemsize > size:
        raise ProfileError(f"{label}: damaged string table (its references lie outside "
                           "the file)")
    with open(path, "rb") as handle:
        handle.seek(offset)
        refs = np.frombuffer(handle.read(count * _ELEMENT.itemsize), dtype=_ELEMENT)
        heaps = {int(a): _collection(handle, base + int(a), size, label)
                 for a in np.unique(refs["address"])}
    texts = np.empty(count, dtype=object)
    for k, (length, address, index) in enumerate(refs.tolist()):
        data = heaps[address].get(index)
        if data is None or length > len(data):
            raise ProfileError(f"{label}: damaged string table (string {k} points at no "
                               "heap object)")
        try:
            texts[k] = data[:length].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProfileError(f"{label}: damaged string table (string {k} is not UTF-8: "
                               f"{exc.reason})") from None
    return texts


def _collection(handle: object, at: int, file_size: int, label: str) -> dict[int, bytes]:
    def damaged(why: str) -> ProfileError:
        return ProfileError(f"{label}: damaged string table (global heap at {at}: {why})")

    if at + 16 > file_size:
        raise damaged("outside the file")
    handle.seek(at)  # type: ignore[attr-defined]
    head = handle.read(16)  # type: ignore[attr-defined]
    if head[:4] != b"GCOL" or head[4] != 1:
        raise damaged("no collection signature")
    total = int.from_bytes(head[8:16], "little")
    if not 16 <= total <= min(_MAX_COLLECTION, file_size - at):
        raise damaged(f"size {total}")
    blob = head + handle.read(total - 16)  # type: ignore[attr-defined]
    objects: dict[int, bytes] = {}
    pos = 16
    while pos + 16 <= total:
        index = int.from_bytes(blob[pos:pos + 2], "little")
        length = int.from_bytes(blob[pos + 8:pos + 16], "little")
        if index == 0:  # free space: the end of the objects
            break
        start = pos + 16
        if start + length > total:
            raise damaged(f"object {index} runs past the collection")
        objects[index] = blob[start:start + length]
        pos = start + (length + 7) // 8 * 8
    return objects
