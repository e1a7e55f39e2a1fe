"""Numeric and text filters of the server-side tables, in DataTable's own syntax (with its
s/i case prefixes) and the ranges and k/M/G suffixes popviz adds."""

from __future__ import annotations

import pandas as pd
import pytest

from popviz import analysis

OPS = pd.DataFrame({"op": ["aten.conv", "aten.relu", "aten.conv_bw", "aten.mm", "aten.add"],
                    "flops": [3_000_000, 500, 6_000_000_000, 2_000, 1_000],
                    "cycles": [30, 5, 60, 20, 10], "ipu": [0, 0, 1, 1, 1]})


def _ops(query: str) -> list[str]:
    return analysis.filter_table(OPS, query)["op"].tolist()


@pytest.mark.parametrize(("query", "expected"), [
    ("{flops} s> 1000", ["aten.conv", "aten.conv_bw", "aten.mm"]),
    ("{flops} > 1000", ["aten.conv", "aten.conv_bw", "aten.mm"]),
    ("{flops} s>= 1000", ["aten.conv", "aten.conv_bw", "aten.mm", "aten.add"]),
    ("{flops} s< 1000", ["aten.relu"]),
    ("{flops} i<= 1000", ["aten.relu", "aten.add"]),
    ("{flops} s= 2000", ["aten.mm"]),
    ("{flops} s!= 2000", ["aten.conv", "aten.relu", "aten.conv_bw", "aten.add"]),
    ("{flops} gt 1000", ["aten.conv", "aten.conv_bw", "aten.mm"]),
    ("{flops} > 1.5M", ["aten.conv", "aten.conv_bw"]),
    ("{flops} > 1e9", ["aten.conv_bw"]),
    ("{flops} > 1,000", ["aten.conv", "aten.conv_bw", "aten.mm"]),
    ("{cycles} s= 10..30", ["aten.conv", "aten.mm", "aten.add"]),
    ("{cycles} = 30 to 10", ["aten.conv", "aten.mm", "aten.add"]),
    ("{cycles} contains between 5 and 10", ["aten.relu", "aten.add"]),
    ("{cycles} contains > 25", ["aten.conv", "aten.conv_bw"]),  # operator typed in a text cell
    ("{cycles} contains 20", ["aten.mm"]),  # a bare number in a numeric column: equal
    ("{op} contains conv", ["aten.conv", "aten.conv_bw"]),
    ("{op} scontains CONV", ["aten.conv", "aten.conv_bw"]),
    ("{op} s= aten.mm", ["aten.mm"]),
    ("{flops} s> 1000 && {ipu} s= 1", ["aten.conv_bw", "aten.mm"]),
    ("{cycles} s>= 10 && {cycles} s<= 30", ["aten.conv", "aten.mm", "aten.add"]),
])
def test_filters_select_the_right_rows(query: str, expected: list[str]) -> None:
    assert _ops(query) == expected


def test_a_wildcard_takes_a_module_and_its_children() -> None:
    mods = pd.DataFrame({"module": ["layer1", "layer1.0.conv1", "layer10.conv", "stem.layer1"]})
    got = analysis.filter_table(mods, "{module} s= layer1.*")["module"].tolist()
    assert got == ["layer1", "layer1.0.conv1"]
    got = analysis.filter_table(mods, "{module} s= *conv*")["module"].tolist()
    assert got == ["layer1.0.conv1", "layer10.conv"]
    got = analysis.filter_table(mods, "{module} s!= layer1*")["module"].tolist()
    assert got == ["stem.layer1"]


def test_filters_agree_with_pandas_on_a_profile() -> None:
    ops = pd.DataFrame({"flops": range(0, 5000, 7), "cycles": range(0, 10000, 14)})
    for op, fn in [(">", ops.flops.gt), (">=", ops.flops.ge), ("<", ops.flops.lt),
                   ("<=", ops.flops.le)]:
        got = analysis.filter_table(ops, f"{{flops}} s{op} 1000")
        assert got.index.tolist() == ops.index[fn(1000)].tolist()
    got = analysis.filter_table(ops, "{cycles} s= 1000..2000")
    assert got.index.tolist() == ops.index[ops.cycles.between(1000, 2000)].tolist()


@pytest.mark.parametrize(("query", "reason"), [
    ("{flops} s> lots", "'flops' holds numbers; 'lots' is not one"),
    # what DataTable sends for a bare word typed in a number column: not a silent 0 rows
    ("{flops} s= lots", "'flops' holds numbers; 'lots' is not one"),
    ("{flops} s!= lots", "'flops' holds numbers; 'lots' is not one"),
    ("{flops} contains lots", "'flops' holds numbers; 'lots' is not one"),
    ("{nope} s> 1", "no column 'nope'"),
    # a size compared against names: as text every name sorts after "5" (all rows kept)
    ("{op} s> 5", "'op' holds text; '> 5' compares numbers"),
    ("flops > 1", "cannot read filter"),
])
def test_bad_filters_say_why(query: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        analysis.filter_table(OPS, query)


def test_two_bounds_in_one_cell_and_a_cell_it_cannot_read() -> None:
    """`>1e5 and <2e5` is both bounds; syntax it cannot read (`or`) is named in `errors`
    and skipped, so the other cells still filter (issue 21)."""
    ops = pd.DataFrame({"cycles": [5e4, 1.5e5, 3e5, 1.2e5], "op": ["a", "conv", "conv", "b"]})
    for query in ("{cycles} > \"1e5 and <2e5\"", "{cycles} contains >1e5 and <2e5",
                  "{cycles} s> 1e5 and < 2e5"):
        assert analysis.filter_table(ops, query)["cycles"].tolist() == [1.5e5, 1.2e5], query
    errors: list[str] = []
    got = analysis.filter_table(ops, "{cycles} s> \"1e5 or <2e5\" && {op} contains conv",
                                errors=errors)
    assert got["op"].tolist() == ["conv", "conv"]
    assert len(errors) == 1 and "'1e5 or <2e5' is not one" in errors[0]
    with pytest.raises(ValueError):  # without `errors`, as before: it raises
        analysis.filter_table(ops, "{cycles} s> \"1e5 or <2e5\"")
