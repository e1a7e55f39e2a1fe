"""Reporters: commands hand their result to one `render(result)`; the CLI prints exactly
what the reporter renders, and `summary --json` has one source (analysis.facts)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import popviz
from popviz.analysis.facts import summary_facts
from popviz.cli.main import main
from popviz.reporters import Reporter
from popviz.reporters.compare import CompareJson, CompareText, OpsJson, OpsText
from popviz.reporters.summary import SummaryJson, SummaryReport, SummaryText
from popviz.reporters.table import aligned
from popviz.reporters.tune import TuneJson, TuneText

ROOT = Path(__file__).resolve().parents[1]
PIPELINE, RECOMPUTE = ROOT / "profiles/rn50_pipeline", ROOT / "profiles/rn50_recompute"
MEASURED = ROOT / "profiles/tutorial_measured_2ranks"


def test_aligned_columns_by_hand() -> None:
    lines = aligned(["op", "ms"], [["conv", "1.5"], ["matmul", "12.25"]], right={1})
    assert lines == ["  op         ms",
                     "  conv      1.5",
                     "  matmul  12.25"]
    # a left-aligned last column leaves no trailing blanks
    assert aligned(["a", "name"], [["1", "x"]], right=set(), indent="") == ["a  name", "1  x"]


@pytest.mark.parametrize("path", [PIPELINE, MEASURED], ids=["modelled", "measured"])
def test_summary_json_is_the_facts_and_the_cli_prints_the_reporter(
        path: Path, capsys: pytest.CaptureFixture) -> None:
    with popviz.open(path) as profile:
        facts = summary_facts(profile)
    assert main(["summary", str(path), "--json", "--no-vet"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed) == json.loads(json.dumps(facts))  # one source
    assert printed.strip() == SummaryJson().render(SummaryReport([facts], single=True))
    assert main(["summary", str(path), "--no-vet"]) == 0
    assert capsys.readouterr().out.strip() == SummaryText().render(SummaryReport([facts]))


def test_summary_of_a_folder_is_a_list_in_json_and_a_paragraph_each_in_text() -> None:
    facts = []
    for path in (PIPELINE, RECOMPUTE):
        with popviz.open(path) as profile:
            facts.append(summary_facts(profile))
    listed = json.loads(SummaryJson().render(SummaryReport(facts, single=False)))
    assert [f["name"] for f in listed] == [f["name"] for f in facts]
    paragraphs = SummaryText().render(SummaryReport(facts)).split("\n\n")
    assert [p.split()[0] for p in paragraphs] == [f["name"] for f in facts]


def test_compare_reporters_render_the_same_comparison(capsys: pytest.CaptureFixture) -> None:
    from popviz.analysis.compare.ops import compare_ops

    with popviz.open(PIPELINE) as a, popviz.open(RECOMPUTE) as b:
        comp = popviz.compare(a, b)
        diff = compare_ops(a, b, comp, by="class")
    text = CompareText().render(comp)
    assert text.splitlines()[0].startswith("A: ") and comp.verdict["headline"] in text
    assert json.loads(CompareJson().render(comp))["verdict"]["headline"] == \
        comp.verdict["headline"]
    ops_text = OpsText(top=3).render(diff)
    assert "more (--top 0 prints all)" in ops_text or len(diff.table) <= 3
    assert len(json.loads(OpsJson().render(diff))["rows"]) == len(diff.table)  # no cut
    assert main(["compare", str(PIPELINE), str(RECOMPUTE), "--no-vet"]) == 0
    assert capsys.readouterr().out.strip() == text


def test_every_reporter_is_a_reporter() -> None:
    reporters: list[Reporter] = [SummaryText(), SummaryJson(), CompareText(), CompareJson(),
                                 OpsText(top=5), OpsJson(), TuneText(), TuneJson()]
    assert all(callable(r.render) for r in reporters)


@pytest.mark.parametrize("command", ["summary", "compare", "compare_ops", "tune"])
def test_commands_do_not_render(command: str) -> None:
    """A command parses, calls and hands over: no JSON dumping, no text tables in cli/."""
    tree = ast.parse((ROOT / "popviz/cli" / f"{command}.py").read_text())
    calls = {f"{n.func.value.id}.{n.func.attr}" for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Name)}
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert "json.dumps" not in calls
    assert not defined & {"render_text", "render_ops", "render_amp_steps", "python_lines"}
