"""What h5py's `create_dataset` and `attrs.create` do for the writer's datasets, without
their general-purpose checks: a profile has ~120 small column datasets, and the high-level
calls cost more per column than HDF5 does. The objects made are the same (same datatype,
dataspace, creation properties and filter order, attribute types), so a profile is the
same file either way (tests/test_format_chunks.py compares them).
"""

from __future__ import annotations

import functools

import h5py
import numpy as np
from h5py import h5a, h5d, h5p, h5s, h5t


def _name(text: str) -> bytes:
    return text.encode("utf-8")


@functools.lru_cache(maxsize=64)
def _dcpl(chunks: tuple[int, ...], level: int) -> h5p.PropDCID:
    """h5py's creation properties for chunks + shuffle + gzip + fletcher32 (filters.fill_dcpl
    and make_new_dset): reused, since HDF5 copies a property list into each dataset."""
    plist = h5p.create(h5p.DATASET_CREATE)
    plist.set_chunk(chunks)
    plist.set_shuffle()
    plist.set_deflate(level)
    plist.set_fletcher32()
    plist.set_obj_track_times(False)
    return plist


def create_chunked(group: h5py.Group, name: str, data: np.ndarray | None,
                   chunks: tuple[int, ...], level: int, *,
                   shape: tuple[int, ...] | None = None,
                   dtype: np.dtype | None = None,
                   maxshape: tuple[int | None, ...] | None = None) -> h5d.DatasetID:
    """A chunked, shuffled, gzip'd, Fletcher-32 dataset, written from `data` when given
    (else empty, of `shape` and `dtype`); `maxshape` (None: unlimited) lets it grow.
    Returns the low-level id."""
    if data is not None:
        data = np.ascontiguousarray(data)
        shape, dtype = data.shape, data.dtype
    assert shape is not None and dtype is not None
    tid = h5t.py_create(np.dtype(dtype), logical=1)
    dsid = h5d.create(group.id, _name(name), tid, h5s.create_simple(
        shape, None if maxshape is None else tuple(h5s.UNLIMITED if m is None else m
                                                   for m in maxshape)),
                      dcpl=_dcpl(tuple(chunks), level))
    if data is not None:
        dsid.write(h5s.ALL, h5s.ALL, data)
    return dsid


@functools.lru_cache(maxsize=256)
def _text_type(size: int) -> h5t.TypeID:
    """h5py's type for `string_dtype("utf-8", size)`: fixed-length, null-padded, UTF-8."""
    return h5t.py_create(h5py.string_dtype("utf-8", size), logical=True)


def fixed_text_attr(obj: h5py.Group | h5py.Dataset | h5d.DatasetID, key: str,
                    raw: bytes) -> None:
    """A scalar fixed-length UTF-8 attribute holding `raw` (format 1.1 text); replaces one
    of the same name, as `attrs.create` does."""
    oid = obj if isinstance(obj, h5d.DatasetID) else obj.id
    name = _name(key)
    if h5a.exists(oid, name):
        h5a.delete(oid, name)
    size = max(1, len(raw))
    htype = _text_type(size)
    attr = h5a.create(oid, name, htype, h5s.create(h5s.SCALAR))
    try:
        attr.write(np.array(raw, dtype=f"S{size}"), mtype=htype)
    finally:
        attr.close()
