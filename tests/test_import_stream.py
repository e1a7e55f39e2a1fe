"""Issue 33: a job's import written rank by rank. The streamed profile is the one the
in-memory merge writes, table for table, whether the ranks' tables stay in memory or
spill to disk and however the columns' chunks fall; the store never holds more than its
budget; the stream widens and fills columns as pandas' concat does, and a failed or
interrupted stream leaves nothing behind. The timeline tally gives one sweep's figures
from per-device slices."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import popviz
import popviz.format.stream as stream_module
import popviz.format.stream_columns as stream_columns
import popviz.ingest.part_store as store_module
from popviz.format import schema
from popviz.format.reader import open as open_profile
from popviz.format.stream import ProfileStream
from popviz.format.writer import MEASURED_WORDS, write_profile
from popviz.ingest.import_rank import rank_parts
from popviz.ingest.importer import import_parts
from popviz.ingest.part_store import PartStore
from popviz.metrics import rank_time, stage_time
from popviz.metrics.timeline import TimelineTally
from tests.bench_util import load_bench
from tests.import_fixtures import PIPELINE, RESNET

RANKS = 5


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Five synthetic ranks shaped like torch.profiler's (bench/bench_import.py)."""
    return list(load_bench("bench_import").write_traces(tmp_path_factory.mktemp("job"),
                                                         RANKS, 1500))


def _in_memory(paths: list[Path], to: Path) -> Path:
    """The merge in memory, written whole (what `popviz.measure` does)."""
    parts = list(rank_parts(paths))
    tables, meta, summary = import_parts(parts, "job")
    return write_profile(to, meta=meta, tables=tables, summary=summary, kind="measured",
                         command_line="test")


def _same_profiles(a_path: Path, b_path: Path) -> None:
    a, b = open_profile(a_path), open_profile(b_path)
    try:
        assert sorted(a.table_names) == sorted(b.table_names)
        for name in a.table_names:
            pd.testing.assert_frame_equal(a.table(name), b.table(name), check_exact=True,
                                          obj=name)
        assert a.meta == b.meta
        assert a.summary == b.summary
        for ipu in a.table("trace")["ipu"].unique().tolist():  # the per-rank index
            pd.testing.assert_frame_equal(a.trace_for(ipu), b.trace_for(ipu))
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("memory_bytes", [store_module.MEMORY_BYTES, 0])
def test_a_streamed_import_is_the_in_memory_merge(job: list[Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  memory_bytes: int) -> None:
    """Small chunks (a column's chunks cross the ranks), ranks held in memory or all
    spilled: the file reads back as the in-memory merge's, byte for byte in every cell."""
    monkeypatch.setattr(stream_columns, "STREAM_CHUNK_BYTES", 4096)
    monkeypatch.setattr(store_module, "MEMORY_BYTES", memory_bytes)
    streamed = popviz.import_trace(job, tmp_path / "streamed")
    _same_profiles(_in_memory(job, tmp_path / "memory"), streamed)


def test_real_recordings_stream_as_they_merge(tmp_path: Path) -> None:
    """Real torch.profiler files (an H100 ResNet-50 step, an interleaved pipeline)."""
    for k, path in enumerate((RESNET, PIPELINE)):
        streamed = popviz.import_trace([path], tmp_path / f"s{k}")
        _same_profiles(_in_memory([path], tmp_path / f"m{k}"), streamed)


def test_the_store_holds_no_more_than_its_budget(job: list[Path], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget of about one rank: the rest go to disk while the job is read, come back
    whole, and the folder they went to is gone after."""
    budget = 600_000
    held: list[int] = []
    folders: list[Path] = []
    put = PartStore.put

    def watched(self: PartStore, part: Any) -> Any:
        light = put(self, part)
        held.append(self.held)
        if self._folder is not None:
            folders.append(self._folder)
        return light

    monkeypatch.setattr(store_module, "MEMORY_BYTES", budget)
    monkeypatch.setattr(PartStore, "put", watched)
    path = popviz.import_trace(job, tmp_path / "p")
    assert len(held) == RANKS and max(held) <= budget
    assert folders and not folders[-1].exists()
    with popviz.open(path) as profile:
        assert sorted(profile.table("trace")["ipu"].unique()) == list(range(RANKS))


def test_store_round_trip_on_disk(job: list[Path]) -> None:
    part = next(iter(rank_parts(job[:1])))
    events = part.events.copy()
    with PartStore(memory_bytes=0) as store:
        light = store.put(part)
        assert light.events.empty and light.row_counts["trace"] == len(events)
        back = store.take(light)
        pd.testing.assert_frame_equal(back.events, events)
        assert back.calls is light.calls


def _write(path: Path, slices: list[Any]) -> pd.DataFrame:
    with ProfileStream(path, kind="measured", **MEASURED_WORDS) as out:
        for frame in slices:
            out.append("notes", frame)
        out.finish(meta={}, summary={}, tables=_required(), command_line="test")
    with popviz.open(path) as profile:
        return profile.table("notes")


def _required() -> dict[str, pd.DataFrame]:
    trace = pd.DataFrame({"ipu": [0], "start": [0], "end": [1], "kind": ["compute"],
                          "stage": [0], "microbatch": [0], "pass": ["F"], "op": ["x"]})
    stages = pd.DataFrame({c: [0] for c in schema.CONTRACT_COLUMNS["stages"]})
    live = pd.DataFrame({"ipu": [0], "step": [0], "phase": ["F"], "always_live_bytes": [0],
                         "not_always_live_bytes": [0], "label": [""]})
    tiles = pd.DataFrame({"ipu": pd.Series([], dtype="int64"),
                          "tile": pd.Series([], dtype="int64"),
                          "capacity_bytes": pd.Series([], dtype="int64"),
                          "total_bytes": pd.Series([], dtype="int64")})
    exchange = pd.DataFrame({"src": ["0"], "dst": ["0"], "bytes": [0], "start": [0],
                             "end": [1], "kind": ["p2p"]})
    ops = pd.DataFrame({"op_id": [0], "op": ["x"], "phase": ["F"]})
    return {"trace": trace, "stages": stages, "liveness": live, "tile_memory": tiles,
            "exchange": exchange, "ops": ops}


def test_the_stream_widens_and_fills_columns_as_concat_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An int column that turns float later is rewritten as float; a column one slice
    lacks is NaN / "" there, as pandas' concat makes it (a bool column one slice lacks is
    False there, where concat would make text: the import's ranks share their columns);
    text that gains an int reads back as int-or-string."""
    monkeypatch.setattr(stream_columns, "STREAM_CHUNK_BYTES", 64)  # 8 int64 rows a chunk
    slices = [pd.DataFrame({"a": np.arange(20, dtype=np.int64), "t": ["x"] * 20}),
              pd.DataFrame({"a": np.full(5, 0.5), "t": ["y"] * 5, "b": np.arange(5)}),
              pd.DataFrame({"a": np.arange(3), "t": pd.Series([7, "z", 8], dtype=object)})]
    got = _write(tmp_path / "p.h5", slices)
    assert got["a"].dtype == np.float64
    assert got["a"].tolist() == [*range(20), *[0.5] * 5, 0.0, 1.0, 2.0]
    assert got["b"].isna().sum() == 23 and got["b"].iloc[20:25].tolist() == list(range(5))
    assert got["t"].tolist() == ["x"] * 20 + ["y"] * 5 + [7, "z", 8]


def test_streamed_chunks_are_what_hdf5_itself_stores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream compresses its columns' chunks in a thread and stores them direct
    (stream_columns.ChunkWriter): every chunk, the partial last one too, is the bytes
    HDF5's own filters make of the same rows, and the column reads back whole."""
    import h5py

    monkeypatch.setattr(stream_columns, "STREAM_CHUNK_BYTES", 4096)  # 512 int64 rows
    rng = np.random.default_rng(3)
    slices = [pd.DataFrame({"a": rng.integers(0, 1000, n), "f": rng.random(n)})
              for n in (700, 1, 2100, 333)]  # chunks across slices; 3,134 rows in all
    got = _write(tmp_path / "p.h5", slices)
    whole = pd.concat(slices, ignore_index=True)
    pd.testing.assert_frame_equal(got[["a", "f"]], whole, check_dtype=False)
    with h5py.File(tmp_path / "p.h5") as ours, \
            h5py.File(tmp_path / "ref.h5", "w", libver=schema.HDF5_LIBVER) as ref:
        for name in ("a", "f"):
            mine = ours[f"{schema.TABLES_GROUP}/notes/{name}"]
            theirs = ref.create_dataset(name, data=whole[name].to_numpy(), chunks=mine.chunks,
                                        compression="gzip",
                                        compression_opts=schema.GZIP_LEVEL, shuffle=True,
                                        fletcher32=True)
            count = mine.id.get_num_chunks()
            assert count == theirs.id.get_num_chunks() == 7
            for k in range(count):
                offset = mine.id.get_chunk_info(k).chunk_offset
                mask, data = mine.id.read_direct_chunk(offset)
                assert mask == 0 and data == theirs.id.read_direct_chunk(offset)[1], \
                    (name, offset)


def test_trace_slices_must_come_in_device_order(tmp_path: Path) -> None:
    with ProfileStream(tmp_path / "p.h5", kind="measured", **MEASURED_WORDS) as out:
        out.append("trace", _required()["trace"].assign(ipu=1))
        with pytest.raises(ValueError, match="device order"):
            out.append("trace", _required()["trace"])
    assert list(tmp_path.iterdir()) == []


def test_an_error_inside_the_stream_leaves_no_file(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), \
            ProfileStream(tmp_path / "p.h5", kind="measured", **MEASURED_WORDS) as out:
        out.append("notes", pd.DataFrame({"a": [1, 2]}))
        raise RuntimeError("stopped")
    assert list(tmp_path.iterdir()) == []


def test_a_disk_that_fills_mid_stream_is_one_oserror_and_no_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk refuses a write part-way: HDF5 never sees it (the image drops the rest),
    `finish` raises ENOSPC naming the profile, and the temporary file is gone."""
    real = os.pwrite
    room = [200_000]

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if offset + len(data) > room[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(stream_module, "RESERVE_BYTES", 0)
    monkeypatch.setattr(os, "posix_fallocate", lambda fd, at, n: None, raising=False)
    monkeypatch.setattr(os, "pwrite", pwrite)
    rng = np.random.default_rng(0)
    with pytest.raises(OSError) as caught:
        _write(tmp_path / "p.h5", [pd.DataFrame({"a": rng.integers(0, 2**62, 50_000)})
                                   for _ in range(4)])
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename == str(tmp_path / "p.h5")
    assert list(tmp_path.iterdir()) == []


def _random_trace(seed: int, devices: int = 4) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = 400
    start = rng.integers(0, 10_000, n)
    return pd.DataFrame({
        "ipu": rng.integers(0, devices, n), "start": start,
        "end": start + rng.integers(1, 900, n),  # overlapping, whole ns
        "kind": rng.choice(["compute", "exchange", "idle", "sync", "host_io"], n),
        "pass": rng.choice(["F", "B", "WU", ""], n), "stage": rng.integers(-1, 5, n),
        "step": rng.integers(0, 3, n)})


@pytest.mark.parametrize("seed", range(4))
def test_a_tally_of_device_slices_is_one_sweep(seed: int) -> None:
    """Any devices in any slices: the step windows merge and the figures are exactly
    those of the whole trace at once (whole-number times)."""
    trace = _random_trace(seed)
    tally = TimelineTally()
    for _, rows in sorted(trace.groupby("ipu"), key=lambda g: -int(g[0])):  # any order
        tally.add(rows)
    pd.testing.assert_frame_equal(tally.rank_time(), rank_time(trace), check_exact=True)
    pd.testing.assert_frame_equal(tally.stage_time(5), stage_time(trace, 5),
                                  check_exact=True)
    times = rank_time(trace)  # and it is a sweep: each device's parts add up to the step
    parts = times.drop(columns=["step_time", "steps"]).sum(axis=1)
    assert np.allclose(parts, times["step_time"])


def test_a_device_in_two_slices_is_refused() -> None:
    trace = _random_trace(0)
    tally = TimelineTally.of(trace[trace["ipu"] == 1])
    with pytest.raises(ValueError, match="two slices"):
        tally.add(trace[trace["ipu"] == 1])


def test_importing_a_job_does_not_load_torch(job: list[Path], tmp_path: Path) -> None:
    """torch is ~250 MiB and seconds to import, and an import never needs it (the zero-
    bubble orders it compares against are popviz.compiler.schedule_zb's, torch-free)."""
    code = ("import sys; from popviz.cli.main import main; "
            f"assert main(['import', *{[str(p) for p in job]!r}, '--to', "
            f"{str(tmp_path / 'p')!r}]) == 0; "
            "print('torch loaded' if 'torch' in sys.modules else 'no torch')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("no torch")


def test_categorical_text_is_written_as_the_text(tmp_path: Path) -> None:
    """A frame's text as pandas Categoricals reads back as the text, missing as "",
    ints among them as int-or-string."""
    text = pd.Series(["conv", None, "relu", "conv"], dtype=object)
    mixed = pd.Series([3, "host", 3, "host"], dtype=object)
    got = _write(tmp_path / "p.h5", [pd.DataFrame({"t": text.astype("category"),
                                                   "m": mixed.astype("category")})])
    assert got["t"].tolist() == ["conv", "", "relu", "conv"]
    assert got["m"].tolist() == [3, "host", 3, "host"]


def _slices() -> list[pd.DataFrame]:
    """Slices as ranks finish them: text with gaps, ints among text, bools, a column the
    first slice lacks and one the last lacks, an empty slice, more rows than a chunk."""
    rng = np.random.default_rng(3)
    big = 3000  # ints of more than one 4 KiB chunk
    return [
        pd.DataFrame({"op": ["conv", None, "relu"], "n": [1, 2, 3],
                      "peer": pd.Series([3, "host", None], dtype=object),
                      "ok": [True, False, True]}),
        pd.DataFrame({"op": rng.choice(["mm", "add", "conv"], big), "n": np.arange(big),
                      "peer": pd.Series(["7"] * big, dtype=object),
                      "ok": np.zeros(big, dtype=bool), "late": rng.random(big)}),
        pd.DataFrame({"op": pd.Series([], dtype=object), "n": pd.Series([], dtype="int64"),
                      "peer": pd.Series([], dtype=object), "ok": pd.Series([], dtype=bool),
                      "late": pd.Series([], dtype=float)}),
        pd.DataFrame({"n": [7, 8], "op": ["mm", "ü"], "ok": [False, True],
                      "late": [0.5, np.nan]}),
    ]


def test_slices_encoded_where_made_read_back_as_the_frames(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Dask worker hands each finished table over encoded (format/encoded.py): the
    profile reads back cell for cell as the same slices written as frames, chunks
    crossing the slices, columns missing from some slices filled as pandas' concat
    fills them."""
    from popviz.format.encoded import encode_frame

    monkeypatch.setattr(stream_columns, "STREAM_CHUNK_BYTES", 4096)
    frames = _write(tmp_path / "frames.h5", _slices())
    encoded = _write(tmp_path / "encoded.h5", [encode_frame(f) for f in _slices()])
    pd.testing.assert_frame_equal(encoded, frames, check_exact=True)
    assert frames["peer"].tolist()[:4] == [3, "host", "", 7]  # int-or-string, as text
    assert frames["op"].iloc[-1] == "ü" and frames["late"].iloc[:3].isna().all()


def test_facts_of_ranks_merged_are_the_facts_of_the_whole(job: list[Path]) -> None:
    """TraceFacts per rank (as each worker makes them), merged: the stages table and the
    summary of the whole job's trace and liveness."""
    from popviz.ingest import tables as tbl

    with popviz.open(popviz.import_trace(job, Path(job[0]).parent / "facts")) as profile:
        trace, live = profile.table("trace"), profile.table("liveness")
        info = [{"stage": int(s), "ipu": int(i)} for s, i in
                zip(profile.table("stages")["stage"], profile.table("stages")["ipu"],
                    strict=True)]
        tables = {"stages": profile.table("stages"), "exchange": profile.table("exchange")}
        meta = profile.meta
    whole = tbl.TraceFacts.of(trace, live)
    merged = tbl.TraceFacts()
    for ipu in sorted(trace["ipu"].unique(), reverse=True):
        merged.merge(tbl.TraceFacts.of(trace[trace["ipu"] == ipu],
                                       live[live["ipu"] == ipu]))
    pd.testing.assert_frame_equal(tbl.stages_table(merged, info, merged.steps),
                                  tbl.stages_table(whole, info, whole.steps))
    assert tbl.summary_of(merged, tables, meta) == tbl.summary_of(whole, tables, meta)
    with pytest.raises(ValueError, match="two slices"):
        merged.merge(tbl.TraceFacts.of(trace[trace["ipu"] == 0], live[live["ipu"] == 0]))


def test_a_rank_changed_in_a_spilling_store_keeps_every_ranks_tables(
        job: list[Path]) -> None:
    """`update` (a memory snapshot applied) takes a rank out and puts it back: the spill
    file it gets must not be another rank's (names once came from the count held)."""
    parts = list(rank_parts(job[:3]))
    with PartStore(memory_bytes=0) as store:
        lights = [store.put(p) for p in parts]
        lights[0] = store.update(lights[0], lambda part: None)
        back = [store.take(light) for light in lights]
    assert [sorted(set(b.events["ipu"])) for b in back] == [[0], [1], [2]]


def test_stale_spill_folders_of_dead_imports_are_removed(tmp_path: Path) -> None:
    from popviz.ingest.part_store import remove_stale_spills

    def spill(name: str, files: tuple[str, ...] = ("rank-0.pickle",)) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        for f in files:
            (folder / f).write_bytes(b"x")
        os.utime(folder, (1, 1))
        return folder

    dead = spill("popviz-import-999999999-abcd1234")
    alive = spill(f"popviz-import-{os.getpid()}-abcd1234")
    foreign = spill("popviz-import-999999999-efgh5678", ("notes.txt",))
    other = spill("my-popviz-import-999999999-abcd")
    remove_stale_spills(str(tmp_path))
    assert not dead.exists() and alive.exists() and foreign.exists() and other.exists()


def test_a_full_disk_reports_itself_not_what_h5py_says_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A column widened after the disk filled reads back chunks that were never written:
    the error is still the disk's (ENOSPC naming the profile), and nothing is left."""
    real = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if offset + len(data) > 150_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(stream_module, "RESERVE_BYTES", 0)
    monkeypatch.setattr(stream_columns, "STREAM_CHUNK_BYTES", 8192)
    monkeypatch.setattr(os, "posix_fallocate", lambda fd, at, n: None, raising=False)
    monkeypatch.setattr(os, "pwrite", pwrite)
    rng = np.random.default_rng(1)
    ints = [pd.DataFrame({f"c{k}": rng.integers(0, 2**62, 4000) for k in range(30)})
            for _ in range(3)]
    floats = pd.DataFrame({f"c{k}": rng.random(4000) for k in range(30)})
    with pytest.raises(OSError) as caught:
        _write(tmp_path / "p.h5", [*ints, floats])
    assert caught.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


def test_rows_are_bounded_by_the_exact_counts_at_the_end() -> None:
    """Each rank is checked against bounds from an upper bound of the rows; the written
    rows' largest values are checked again against the exact counts."""
    from popviz.errors import ProfileError
    from popviz.ingest import tables as tbl
    from popviz.ingest.import_merge import FinishedRank, Written, largest_values

    def finished(ops: pd.DataFrame) -> FinishedRank:  # as a worker finishes a rank
        return FinishedRank({"ops": ops}, tbl.TraceFacts(), None, largest_values({"ops": ops}))

    written = Written()
    written.add(finished(pd.DataFrame({"op_id": [0, 1], "microbatch": [0, 1]})))
    written.check({}, {}, "job")  # within 2 rows: fine
    written.add(finished(pd.DataFrame({"op_id": [2], "microbatch": [50]})))
    with pytest.raises(ProfileError, match=r"job: ops\.microbatch"):
        written.check({}, {}, "job")


def test_import_says_each_rank_parsed_and_the_writing_at_most_once_a_second(
        job: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal (a log or a pipe gets the result or the one-line error alone)."""
    from popviz.cli.import_ import _Written
    from popviz.cli.main import main

    assert main(["import", *map(str, job), "--to", str(tmp_path / "quiet")]) == 0
    assert "popviz: parsed" not in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["import", *map(str, job), "--to", str(tmp_path / "p")]) == 0
    err = capsys.readouterr().err.splitlines()
    parsed = [line for line in err if line.startswith("popviz: parsed rank")]
    written = [line for line in err if line.startswith("popviz: written rank")]
    assert len(parsed) == len(job) and parsed[-1].startswith("popviz: parsed rank")
    assert f"({len(job)}/{len(job)})" in parsed[-1]
    # the first and the last at least; never more than one a rank
    assert 1 <= len(written) <= len(job) and written[-1].endswith(f"({len(job)}/{len(job)})")
    # the throttle, on a fake clock: 10 ranks written 0.3 s apart -> the first, those a
    # second after the last shown, and the last
    now = [0.0]
    shown = _Written(clock=lambda: now[0])
    for k in range(1, 11):
        shown(k, 10, k - 1)
        now[0] += 0.3
    lines = [line for line in capsys.readouterr().err.splitlines() if "written" in line]
    assert [line.split("(")[1] for line in lines] == ["1/10)", "5/10)", "9/10)", "10/10)"]
