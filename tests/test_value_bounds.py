"""Issue 34: values checked against the profile before they size anything
(popviz/format/bounds.py). One test per refusal message, and every bounded column of each
profile kind at 10^9, -1 and NaN read by the reader: refused with one line naming the table
and column, or read. tests/test_value_bounds_serve.py serves them."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import popviz
from popviz.errors import ProfileError
from popviz.format import bounds, schema
from popviz.format.isolated import read_everything
from popviz.ingest.import_limits import LimitError, check_actions
from tests.serve_pages import visit
from tests.serve_util import start_serve, stop
from tests.value_mutants import (
    KINDS,
    MEASURED,
    MODELLED_IPU,
    allowed_mutations,
    file_name,
    make_sources,
    mutations,
    write_mutant,
)
from tooling.testing.semantic import NAN, VALUES, Mutation

DIMS = bounds.Dimensions("IPU", devices=4, tiles=1472, stages=4, steps=161, rows=6000)


def _refusal(table: str, column: str, values: list[float]) -> str:
    with pytest.raises(ProfileError) as caught:
        bounds.check_column(table, column, np.array(values), DIMS, "f.h5")
    return str(caught.value)


def test_each_kind_of_bound_has_its_one_line() -> None:
    assert _refusal("liveness", "ipu", [0, 10**9]) == \
        "f.h5: liveness.ipu: 1000000000 is not an IPU of this profile (it has 4)"
    assert _refusal("tile_memory", "tile", [10**8]) == \
        "f.h5: tile_memory.tile: 100000000 is not a tile of this profile's IPUs (they " \
        "have 1,472)"
    assert _refusal("ops", "tiles_used", [1473]) == \
        "f.h5: ops.tiles_used: 1473 is not a count of this profile's tiles (its IPUs " \
        "have 1,472)"
    assert _refusal("trace", "stage", [4]) == \
        "f.h5: trace.stage: 4 is not a stage of this profile (it has 4)"
    assert _refusal("liveness", "step", [10**8]) == \
        "f.h5: liveness.step: 100000000 is not a step of this profile (it has 161 at most)"
    assert _refusal("host_slices", "depth", [10**9]) == \
        "f.h5: host_slices.depth: 1000000000 is not plausible for this profile (it holds " \
        "6,000 rows in all)"
    assert _refusal("liveness", "ipu", [-1]) == \
        "f.h5: liveness.ipu: -1 is not allowed (it must be 0 or more)"
    assert _refusal("trace", "microbatch", [-2]) == \
        "f.h5: trace.microbatch: -2 is not allowed (it must be -1 (none) or more)"
    assert _refusal("trace", "stream", [-5]) == \
        "f.h5: trace.stream: -5 is not allowed (it must be -1 (none) or more)"
    assert _refusal("trace", "ipu", [0.0, NAN]) == \
        "f.h5: trace.ipu: NaN where a number is required"
    assert _refusal("ops", "step", [1.5]) == \
        "f.h5: ops.step: 1.5 where a whole number is required"
    # in bounds, a "none" where one is allowed, a fractional count: read
    for table, column, values in (("trace", "stage", [-1, 3]), ("ops", "kernels", [2.5]),
                                  ("trace", "correlation", [10**12])):
        bounds.check_column(table, column, np.array(values), DIMS, "f.h5")


def test_dimensions_from_meta_under_caps() -> None:
    meta = {"target": {"num_ipus": 2, "tiles_per_ipu": 1472},
            "measure": {"world_size": 8, "ranks": [5], "num_stages": 1, "stages": [5]}}
    dims = bounds.dimensions(meta, "rank", {"stages": 1, "liveness": 30, "ops": 50},
                             {"tile_liveness": (2, 40, 1472)})
    assert (dims.device_word, dims.devices, dims.tiles, dims.stages, dims.steps,
            dims.rows) == ("rank", 8, 1472, 6, 50, 83)
    # a count meta states past its cap is not believed: the cap bounds the column
    liar = bounds.dimensions({"target": {"num_ipus": 10**12, "tiles_per_ipu": 10**12}},
                             "ipu", {}, {})
    assert (liar.devices, liar.tiles, liar.stages) == (bounds.MAX_DEVICES, bounds.MAX_TILES,
                                                       bounds.MAX_STAGES)


def test_string_and_text_refusals() -> None:
    with pytest.raises(ProfileError, match=r"^f.h5: string table: string 1 is 31,457,280 "
                                           r"bytes, more than 1,048,576"):
        bounds.check_strings(np.array([3, 30 << 20, 5]), "f.h5")
    with pytest.raises(ProfileError, match=r"^f.h5: trace: its text cells refer to 3,000 "
                                           r"characters of text, more than the reader's "
                                           r"budget of 2,000"):
        bounds.check_text("trace", np.zeros(3, np.int64), np.array([1000]), 2000, "f.h5")


def test_annotation_refusals() -> None:
    with pytest.raises(LimitError, match=r"^annotation 'PP:100000000F0' claims stage "
                                         r"100,000,000, but a rank of a world of 1 that "
                                         r"annotates 2 stage\(s\) runs stages 0..1; refused"):
        check_actions([0, 100_000_000], [0, 0], ["PP:0F0", "PP:100000000F0"], 1)
    with pytest.raises(LimitError, match=r"^annotation 'PP:0F7' claims micro-batch 7, but "
                                         r"the trace annotates only 2 pipeline actions"):
        check_actions([0, 0], [0, 7], ["PP:0F0", "PP:0F7"], 1)
    check_actions([0, 4], [0, 1], ["PP:0F0", "PP:4F1"], 4)  # rank 0 of 4, looped: stage 4


def test_the_issue_cases_are_refused_by_the_reader(tmp_path: Path) -> None:
    """The values issue 34 found locking or bloating the server, as popviz.open reads."""
    cases = [(MEASURED, Mutation("liveness", "ipu", 10**9),
              "liveness.ipu: 1000000000 is not a rank of this profile (it has 2)"),
             (MODELLED_IPU, Mutation("tile_memory", "tile", 10**8),
              "tile_memory.tile: 100000000 is not a tile"),
             (MEASURED, Mutation("liveness", "step", 10**8),
              "liveness.step: 100000000 is not a step"),
             (MEASURED, Mutation("host_slices", "depth", 10**9),
              "host_slices.depth: 1000000000 is not plausible"),
             (MEASURED, Mutation("strings", "", 30 << 20),
              "string table: string 100 is 31,457,280 bytes")]
    for k, (source, mutation, expected) in enumerate(cases):
        path = write_mutant(source, mutation, tmp_path / f"m{k}.h5")
        with pytest.raises(ProfileError) as caught, popviz.open(path) as profile:
            read_everything(profile)
        assert str(caught.value) == f"{path}: {caught.value.args[0].split(': ', 1)[1]}"
        assert expected in str(caught.value), mutation.label


def test_a_table_of_many_long_strings_is_over_the_text_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_mutant(MEASURED, Mutation("strings", "", 4000), tmp_path / "m.h5")
    monkeypatch.setattr(schema, "TEXT_BUDGET_BYTES", 100_000)
    with pytest.raises(ProfileError, match="text cells refer to"), \
            popviz.open(path) as profile:
        read_everything(profile)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_sources(tmp_path_factory.mktemp("kinds"))


ONE_LINE = re.compile(r"^\S.*\S$")


def test_every_bounded_column_of_each_kind_is_refused_in_one_line_or_read(
        sources: dict[str, Path], tmp_path: Path) -> None:
    """10^9, -1 and NaN in each bounded column: a refusal names the table and the column
    (bounds.py's `table.column`, or validate.py's `table 'x' column 'y'`) on one line; a
    value the column allows (-1 for 'none') is read. Counted, so a bound removed shows."""
    refused = read = 0
    for kind in KINDS:
        for mutation in mutations(sources[kind]):
            path = write_mutant(sources[kind], mutation, tmp_path / "m.h5")
            try:
                with popviz.open(path) as profile:
                    profile.table(mutation.table)  # each table is checked as it is read
                read += 1
                key = bounds.COLUMNS[mutation.table][mutation.column][0]
                assert mutation.value == -1 or (key == "finite" and mutation.value == 10**9), \
                    f"{kind} {mutation.label} read"
            except ProfileError as exc:
                refused += 1
                text = str(exc)
                assert ONE_LINE.match(text) and "\n" not in text, text
                named = (f"{mutation.table}.{mutation.column}:" in text
                         or f"table '{mutation.table}' column '{mutation.column}'" in text)
                assert named, f"{kind} {mutation.label}: {text}"
    assert refused > 2 * read > 0


def _served_folder(sources: dict[str, Path], root: Path) -> tuple[list[str], list[str]]:
    """(refused, read) file names under `root`: per kind, one mutant per value that
    bounds.py refuses, and one file with every value it lets through at once."""
    refused, read = [], []
    for kind in KINDS:
        source = sources[kind]
        column = ("liveness", "ipu") if kind != "modelled GPU" else ("trace", "ipu")
        for value in VALUES:
            mutation = Mutation(*column, value)
            refused.append(write_mutant(source, mutation, root / file_name(kind, mutation)).name)
        path = Path(shutil.copyfile(source, root / f"{kind.replace(' ', '_')}-allowed.h5"))
        for mutation in allowed_mutations(source):
            mutation.apply(path)
        read.append(path.name)
    return refused, read


def test_served_mutants_are_refused_in_one_line_or_every_page_answers(
        sources: dict[str, Path], tmp_path: Path) -> None:
    """Through `popviz serve`: each refused mutant's pages say why in one line (naming the
    table and column); a profile of every allowed hostile value at once answers every page,
    the callbacks its pages fire and every download, without a server error, each within
    a bounded time; the server is alive after."""
    root = tmp_path / "served"
    refused, read = _served_folder(sources, root)
    proc, port = start_serve(root, "--vet-timeout", "30")
    try:
        deps = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/_dash-dependencies", timeout=60).read())
        for name in refused:
            outcome = visit(port, name, deps, only=["csv stages", "page /liveness"])
            for o in outcome:
                assert o.status in (200, 404) and not o.failed, (name, o)
            line = outcome[0].line  # the CSV's 404: the refusal, one line
            assert line.startswith(name) and ("ipu:" in line or "column 'ipu'" in line), \
                (name, line)
        for name in read:
            for o in visit(port, name, deps):
                assert not o.failed and o.status in (200, 204, 404, 422), (name, o)
                assert o.seconds < 30, (name, o)
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).status == 200
    finally:
        out, err = stop(proc)
    assert "Traceback" not in out + err, (out + err)[-3000:]
