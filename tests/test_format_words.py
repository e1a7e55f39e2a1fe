"""Format 1.2: a profile states its words (`device_kind`, `time_unit`) and every view reads
them from there; a 1.1 file is mapped by the reader (the upgrade path)."""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest

import popviz
from popviz.analysis.compare import compare
from popviz.analysis.facts import profile_facts
from popviz.errors import ProfileError
from popviz.format import schema
from popviz.format.writer import MEASURED_WORDS
from popviz.vocab import naming_for
from tests.format_versions import as_format_1_1
from tests.profiles_util import tiny_meta
from tests.test_format import write_tiny

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
GPU_META = {**tiny_meta(), "target": {**tiny_meta()["target"], "family": "gpu",
                                      "name": "h100", "clock_hz": 1e9}}


def _root(path: Path) -> dict[str, str]:
    with h5py.File(path, "r") as h5:  # plain h5py: the words are in the file itself
        return {k: bytes(h5.attrs[k]).decode() for k in ("format_version", *schema.WORD_ATTRS)}


def _as_format_1_1(path: Path) -> None:
    """What popviz wrote before 1.2: no words, version 1.1.0."""
    with h5py.File(path, "a") as h5:
        for key in schema.WORD_ATTRS:
            del h5.attrs[key]
        h5.attrs["format_version"] = "1.1.0"


@pytest.mark.parametrize(("kind", "meta", "words", "device", "column"), [
    ("modelled", tiny_meta(), ("ipu", "cycles"), "IPU0", "forward cycles"),
    ("measured", tiny_meta(), ("rank", "ns"), "rank 0", "forward ns"),
    ("modelled", GPU_META, ("gpu", "ns"), "GPU 0", "forward ns"),
])
def test_written_words_and_the_1_1_upgrade_agree(tmp_path: Path, kind: str, meta: dict,
                                                 words: tuple[str, str], device: str,
                                                 column: str) -> None:
    path = write_tiny(tmp_path / "new", kind=kind, meta=meta)
    assert _root(path) == {"format_version": schema.FORMAT_VERSION, "device_kind": words[0],
                           "time_unit": words[1]}
    old = write_tiny(tmp_path / "old", kind=kind, meta=meta)
    _as_format_1_1(old)
    for p in (popviz.open(path), popviz.open(old)):
        assert (p.device_kind, p.time_unit) == words
        assert (p.meta["device_kind"], p.meta["time_unit"]) == words
        assert naming_for(p).label(0) == device
        assert naming_for(p).column("forward_cycles") == column
        facts = profile_facts(p)
        assert (facts["device_kind"], facts["time_unit"]) == words


def test_views_take_the_stated_words_not_the_kind(tmp_path: Path) -> None:
    """A modelled file that states ranks and ns is shown in ranks and ns: the words come
    from the file, never from its kind."""
    path = write_tiny(tmp_path / "r", kind="modelled", **MEASURED_WORDS)
    p = popviz.open(path)
    assert p.kind == "modelled" and naming_for(p).label(1) == "rank 1"
    plain = write_tiny(tmp_path / "i")
    comp = compare(popviz.open(plain), p)
    assert comp.sides.set_index("side")["device_kind"].to_dict() == {"A": "ipu", "B": "rank"}
    assert "rank (B)" in comp.metrics.set_index("metric").loc["throughput_per_ipu", "unit"]


def test_the_stored_meta_leaves_the_words_to_the_root_attributes(tmp_path: Path) -> None:
    meta = {**tiny_meta(), "device_kind": "gpu", "time_unit": "ns"}  # e.g. read, rewritten
    path = write_tiny(tmp_path / "m", meta=meta)
    with h5py.File(path, "r") as h5:
        assert "device_kind" not in bytes(h5.attrs["meta"]).decode()
    assert _root(path)["device_kind"] == "gpu"  # meta's stated words were kept


def test_bad_words_are_refused_on_write_and_on_read(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="device_kind 'tpu' is not one of ipu, gpu, rank"):
        write_tiny(tmp_path / "w", device_kind="tpu")
    path = write_tiny(tmp_path / "r")
    with h5py.File(path, "a") as h5:
        h5.attrs["time_unit"] = "fortnights"
    with pytest.raises(ProfileError, match=r"time_unit 'fortnights' is not one of cycles, ns"):
        popviz.open(path)


def test_1_1_profiles_read_with_the_words_of_their_kind(tmp_path: Path) -> None:
    """The upgrade path: a 1.1 file states no words; its kind and target imply them."""
    measured = popviz.open(as_format_1_1(PROFILES / "tutorial_measured_2ranks",
                                         tmp_path / "measured"))
    modelled = popviz.open(as_format_1_1(PROFILES / "rn50_pipeline", tmp_path / "modelled"))
    assert measured.format_version == modelled.format_version == "1.1.0"
    assert (measured.device_kind, measured.time_unit) == ("rank", "ns")
    assert (modelled.device_kind, modelled.time_unit) == ("ipu", "cycles")
