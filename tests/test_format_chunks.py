"""Arrays whose chunks the writer filters itself (popviz/format/chunks.py): the stored bytes
are HDF5's own, the checksum is checked on read, and the data round-trips."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import popviz
from popviz.format import schema
from popviz.format.chunks import fletcher32
from popviz.format.lowlevel import create_chunked, fixed_text_attr
from popviz.format.writer import write_profile
from tests.profiles_util import tiny_meta, tiny_summary, tiny_tables


def hdf5_fletcher32(data: bytes) -> int:
    """H5_checksum_fletcher32 transcribed word by word (uint32 sums, folds every 360)."""
    words, sum1, sum2, i = len(data) // 2, 0, 0, 0
    while words:
        block = min(words, 360)
        words -= block
        for _ in range(block):
            sum1 = (sum1 + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
            sum2 = (sum2 + sum1) & 0xFFFFFFFF
            i += 2
        sum1, sum2 = (sum1 & 0xFFFF) + (sum1 >> 16), (sum2 & 0xFFFF) + (sum2 >> 16)
    if len(data) % 2:
        sum1 += data[i] << 8
        sum2 += sum1
        sum1, sum2 = (sum1 & 0xFFFF) + (sum1 >> 16), (sum2 & 0xFFFF) + (sum2 >> 16)
    sum1, sum2 = (sum1 & 0xFFFF) + (sum1 >> 16), (sum2 & 0xFFFF) + (sum2 >> 16)
    return (sum2 << 16) | sum1


@pytest.mark.parametrize("length", [0, 1, 2, 3, 718, 719, 720, 721, 722, 1441, 4097])
def test_fletcher32_is_hdf5s(length: int) -> None:
    rng = np.random.default_rng(length)
    for data in (rng.integers(0, 256, length, dtype=np.uint8).tobytes(), b"\xff" * length):
        assert fletcher32(data) == hdf5_fletcher32(data)


def write(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    return write_profile(path, meta=tiny_meta(), tables=tiny_tables(), arrays=arrays,
                         summary=tiny_summary())


ARRAYS = {
    # 3-D with a partial last chunk of steps (the chunk is ~1 MiB of rows)
    "tile_liveness": np.random.default_rng(1).integers(
        0, 5000, size=(2, 700, 1472)).astype(np.uint32),
    "floats": np.random.default_rng(2).normal(size=(3, 7, 5)),
    "bytes_1d": np.arange(300_000, dtype=np.int64) % 251,
    "small": np.arange(6, dtype=np.int16).reshape(2, 3),
}


def test_chunks_are_what_hdf5_itself_stores(tmp_path: Path) -> None:
    path = write(tmp_path / "x.h5", ARRAYS)
    with h5py.File(path) as ours, h5py.File(tmp_path / "ref.h5", "w",
                                             libver=schema.HDF5_LIBVER) as ref:
        for name, array in ARRAYS.items():
            mine = ours[f"arrays/{name}"]
            theirs = ref.create_dataset(name, data=array, chunks=mine.chunks,
                                        compression="gzip",
                                        compression_opts=schema.GZIP_LEVEL,
                                        shuffle=True, fletcher32=True)
            assert mine.shuffle and mine.fletcher32 and mine.compression == "gzip"
            assert mine.id.get_num_chunks() == theirs.id.get_num_chunks() > 0
            for k in range(mine.id.get_num_chunks()):
                offset = mine.id.get_chunk_info(k).chunk_offset
                mask, data = mine.id.read_direct_chunk(offset)
                assert mask == 0
                assert data == theirs.id.read_direct_chunk(offset)[1], (name, offset)
            np.testing.assert_array_equal(mine[()], array)
    profile = popviz.open(path)
    np.testing.assert_array_equal(profile.tile_liveness(1, 650), ARRAYS["tile_liveness"][1, 650:])


def test_a_damaged_array_chunk_is_an_error(tmp_path: Path) -> None:
    arrays = {"tile_liveness": ARRAYS["tile_liveness"]}
    path = write(tmp_path / "x.h5", arrays)
    with h5py.File(path) as h5:
        live = h5["arrays/tile_liveness"]
        info = live.id.get_chunk_info_by_coord((0, live.chunks[1], 0))  # IPU 0's second
    raw = bytearray(path.read_bytes())
    raw[info.byte_offset + info.size // 2] ^= 0x40  # inside the deflate stream
    path.write_bytes(bytes(raw))
    profile = popviz.open(path)
    profile.tile_liveness(1, 0, 10)  # other chunks still read
    with pytest.raises(popviz.ProfileError):
        profile.tile_liveness(0)


def test_low_level_objects_are_h5pys(tmp_path: Path) -> None:
    """The writer's low-level datasets and text attributes are what h5py's create_dataset
    and attrs.create make: same type, space, creation properties and filters."""
    data = np.arange(1000, dtype=np.int32)
    with h5py.File(tmp_path / "x.h5", "w", libver=schema.HDF5_LIBVER) as h5:
        ours = h5py.Dataset(create_chunked(h5, "ours", data, (400,), 3))
        fixed_text_attr(ours, "encoding", "numéric".encode())
        theirs = h5.create_dataset("theirs", data=data, chunks=(400,), compression="gzip",
                                   compression_opts=3, shuffle=True, fletcher32=True)
        theirs.attrs.create("encoding", data=np.bytes_("numéric".encode()),
                            dtype=h5py.string_dtype("utf-8", len("numéric".encode())))
        a, b = ours.id.get_create_plist(), theirs.id.get_create_plist()
        assert a.get_chunk() == b.get_chunk() and a.get_nfilters() == b.get_nfilters() == 3
        assert [a.get_filter(k) for k in range(3)] == [b.get_filter(k) for k in range(3)]
        assert (a.get_fill_time(), a.get_alloc_time(), a.get_obj_track_times()) == \
            (b.get_fill_time(), b.get_alloc_time(), b.get_obj_track_times())
        assert ours.id.get_type() == theirs.id.get_type() and ours.shape == theirs.shape
        np.testing.assert_array_equal(ours[()], theirs[()])
        ta = h5py.h5a.open(ours.id, b"encoding")
        tb = h5py.h5a.open(theirs.id, b"encoding")
        assert ta.get_type() == tb.get_type()
        assert ta.get_type().get_strpad() == tb.get_type().get_strpad()
        assert ta.get_space().get_simple_extent_type() == \
            tb.get_space().get_simple_extent_type()
        assert ours.attrs["encoding"] == theirs.attrs["encoding"] == "numéric".encode()
