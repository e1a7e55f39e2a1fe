"""The summary page's cards: none about pipelines for a one-IPU run; amber, not green, for
a fitting profile whose fullest tile is at or past TILE_AMBER."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from popviz_app import create_app, render

from tests.dash_util import component_text as _text

ROOT = Path(__file__).resolve().parent.parent / "profiles"


def _cards(body: object) -> list[object]:
    out, todo = [], [body]
    while todo:
        node = todo.pop()
        if "card" in str(getattr(node, "className", "")).split():
            out.append(node)
        kids = getattr(node, "children", None)
        todo += kids if isinstance(kids, list) else [kids] if kids is not None and \
            not isinstance(kids, (str, int, float)) else []
    return out


def test_one_ipu_run_has_no_bottleneck_or_bubble_card(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "resnext101_inference_mk1", tmp_path / "one")
    shutil.copytree(ROOT / "rn50_pipeline", tmp_path / "four")
    ctx = create_app(tmp_path).popviz_context
    one = _text(render(ctx, "/summary", "?profile=one%2Fprofile.h5")[1])
    four = _text(render(ctx, "/summary", "?profile=four%2Fprofile.h5")[1])
    assert "pipeline bubbles" in four and "bottleneck" in four
    assert "pipeline bubbles" not in one and "bottleneck" not in one
    assert "fits · fullest tile" in one


def test_a_nearly_full_tile_is_an_amber_card() -> None:
    from popviz_app.pages.summary import _cards as summary_cards

    from popviz.vocab import naming_of

    def memory_card(use: float) -> object:
        info = {"fit": {"known": True, "fits": True, "max_utilisation": use},
                "throughput": None, "latency_ms": None, "step_cycles": None,
                "bottleneck": None, "num_ipus": 1, "bubble_fraction": 0.0}
        cards = _cards(summary_cards(info, naming_of("modelled")))
        return next(c for c in cards if "memory" in _text(c))

    assert memory_card(0.5).className.split()[-1] == "good"
    tight = memory_card(0.97)
    assert tight.className.split()[-1] == "warn" and "little headroom" in _text(tight)
    assert memory_card(0.90).className.split()[-1] == "warn"


def test_a_sharded_run_waits_for_other_shards_not_in_pipeline_bubbles(
        capsys: pytest.CaptureFixture) -> None:
    """A sharded run has no pipeline: one shard runs at a time and each IPU idles while
    another runs. The pipelined run of the same model keeps its pipeline bubbles."""
    from popviz.cli.main import main

    ctx = create_app(ROOT).popviz_context
    sharded = _cards(render(ctx, "/summary", "?profile=tutorial_sharded%2Ftraining")[1])
    idle = [_text(c) for c in sharded if "idle" in _text(c)]
    assert len(idle) == 1 and "waiting for other shards" in idle[0]
    page = _text(render(ctx, "/summary", "?profile=tutorial_sharded%2Ftraining")[1])
    # nor a bottleneck the others wait for: the heaviest shard, and pipelining as the way
    # to run the shards at once
    assert "pipeline bubbles" not in page and "bottleneck" not in page
    # (the flag is in its own no-wrap element: component_text spaces it from its value)
    assert "heaviest shard" in page and "--strategy pipelined" in " ".join(page.split())
    pipelined = _text(render(ctx, "/summary", "?profile=tutorial_pipelined%2Ftraining")[1])
    assert "pipeline bubbles" in pipelined and "other shards" not in pipelined
    # `popviz summary` says it in the same words
    assert main(["summary", str(ROOT / "tutorial_sharded" / "training"), "--no-vet"]) == 0
    text = capsys.readouterr().out
    assert "waiting for other shards: " in text and "pipeline bubbles" not in text
    assert "heaviest shard: " in text and "bottleneck" not in text
    # inference has no gradients to accumulate: device iterations fill its pipeline
    inference = _text(render(ctx, "/summary", "?profile=tutorial_sharded%2Finference")[1])
    assert "with device iterations to fill" in inference
    assert "gradient accumulation" not in inference


def test_a_sharded_runs_stages_page_paints_no_bottleneck_or_bubbles() -> None:
    """/stages says what /summary says of a sharded run: its stages take turns, so the
    heaviest is not red, and its idle is an idle share, not a bubble fraction; a
    pipelined run keeps both."""
    import json

    ctx = create_app(ROOT).popviz_context
    sharded = json.dumps(render(ctx, "/stages", "?profile=tutorial_sharded%2Ftraining")[1]
                         .to_plotly_json(), default=str)
    assert "red: bottleneck" not in sharded and "#c53a32" not in sharded
    assert "sharded: they run in turn" in sharded and "shards take turns" in sharded
    assert "bubble" not in sharded and "idle_fraction" in sharded
    pipelined = json.dumps(render(ctx, "/stages", "?profile=tutorial_pipelined%2Ftraining")[1]
                           .to_plotly_json(), default=str)
    assert "bubble fraction on top" in pipelined and "bubble_fraction" in pipelined
