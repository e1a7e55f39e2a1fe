"""The one profile type: a file and an in-memory report read the same through `Profile`."""

from __future__ import annotations

import typing
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from popviz_app import ProfileCache

import popviz
from popviz.errors import ProfileError
from popviz.format import FileProfile, Profile, ReportProfile, write_report
from tooling.testing.synthetic import synthetic_report

CONTRACT = ("stages", "trace", "liveness", "tile_memory", "exchange", "ops", "tensors",
            "variables", "oom")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[FileProfile, ReportProfile]:
    report = synthetic_report(num_ipus=2, events=300, steps=40, tile_liveness_ipus=2)
    path = write_report(report, tmp_path_factory.mktemp("p") / "run" / "profile.h5")
    return popviz.open(path), ReportProfile(report, name="run", path=path)


def test_both_profiles_have_every_member_of_the_protocol(
        pair: tuple[FileProfile, ReportProfile]) -> None:
    members = typing._get_protocol_attrs(Profile)  # type: ignore[attr-defined]
    assert {"meta", "table", "trace_for", "tile_liveness", "close"} <= members
    for profile in pair:
        missing = sorted(m for m in members if not hasattr(profile, m))
        assert not missing, f"{type(profile).__name__} lacks {missing}"


def test_a_file_and_its_report_read_back_the_same(
        pair: tuple[FileProfile, ReportProfile]) -> None:
    on_disk, in_memory = pair
    assert (on_disk.name, on_disk.kind) == (in_memory.name, in_memory.kind)
    assert on_disk.meta == in_memory.meta and on_disk.format_version == in_memory.format_version
    for name in CONTRACT:
        a, b = getattr(on_disk, name), getattr(in_memory, name)
        assert isinstance(a, pd.DataFrame) and isinstance(b, pd.DataFrame)
        assert len(a) == len(b), name
    for ipu in (0, 1):
        a, b = on_disk.trace_for(ipu, 100, 5000), in_memory.trace_for(ipu, 100, 5000)
        assert len(a) == len(b) > 0
        assert (a["ipu"] == ipu).all() and (a["end"] > 100).all() and (a["start"] < 5000).all()
        np.testing.assert_array_equal(on_disk.tile_liveness(ipu, 5, 9),
                                      in_memory.tile_liveness(ipu, 5, 9))
    assert on_disk.array_shape("tile_liveness") == in_memory.array_shape("tile_liveness")


def test_close_is_there_to_call_on_both(tmp_path: Path) -> None:
    report = synthetic_report(num_ipus=2, events=200, steps=20)
    with popviz.open(write_report(report, tmp_path / "a.h5")) as on_disk:
        assert len(on_disk.stages)
    with pytest.raises(ProfileError):  # closed: a table not read yet cannot be read now
        on_disk.table("exchange")
    with ReportProfile(report) as in_memory:
        assert len(in_memory.stages)
    in_memory.close()  # nothing to release; the tables stay readable
    assert len(in_memory.exchange) == len(report.tables["exchange"])


def test_the_cache_closes_a_profile_it_refuses(tmp_path: Path) -> None:
    report = synthetic_report(num_ipus=2, events=200, steps=20)
    report.summary = ["not", "an", "object"]  # type: ignore[assignment]  # the bad input
    closed: list[str] = []

    class Watched(ReportProfile):
        def close(self) -> None:
            closed.append(self.name)

    (tmp_path / "bad.h5").write_bytes(b"stand-in; the opener below never reads it")
    cache = ProfileCache(tmp_path, opener=lambda path: Watched(report, path.stem, path))
    with pytest.raises(ProfileError, match="summary is list JSON"):
        cache.get("bad.h5")
    assert closed == ["bad"]
