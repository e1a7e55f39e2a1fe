"""One meaning of always-live (PopVision's: everything present for the whole program,
code included) on the memory and the liveness page, checked on every bundled profile."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from popviz_app import create_app, render

from popviz.format import discover
from tests.dash_util import component_text as _text

ROOT = Path(__file__).resolve().parent.parent / "profiles"
LINE = re.compile(r"Always-live \(everything present for the whole program: code[^)]*\): "
                  r"((?:IPU\d+ [\d,.]+ MiB(?: · )?)+)")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, list[str]]:
    root = tmp_path_factory.mktemp("always")
    for name in ("rn50_pipeline", "tutorial_pipelined", "resnext101_inference_mk1"):
        shutil.copytree(ROOT / name, root / name)
    rels = [str(Path(p).relative_to(root)) for p in discover(root)]
    return create_app(root).popviz_context, rels


def _figures(ctx: object, page: str, rel: str) -> dict[str, str]:
    text = _text(render(ctx, page, "?profile=" + rel.replace("/", "%2F"))[1])
    found = LINE.search(text)
    assert found, f"{page} of {rel} has no always-live line"
    return dict(x.split(" ")[:2] for x in found.group(1).split(" · "))


def test_memory_and_liveness_pages_say_the_same_always_live(served: tuple) -> None:
    ctx, rels = served
    assert len(rels) >= 4
    for rel in rels:
        memory, liveness = _figures(ctx, "/memory", rel), _figures(ctx, "/liveness", rel)
        assert memory == liveness and memory, rel


def test_always_live_includes_code() -> None:
    import popviz

    p = popviz.open(ROOT / "rn50_pipeline")
    from popviz.analysis.memory import always_live_by_ipu, always_live_from_liveness

    tm = p.tile_memory
    by_tiles = always_live_by_ipu(tm)
    own = tm.groupby("ipu")[["code", "always_live", "exchange", "vertex_state"]].sum().sum(axis=1)
    assert by_tiles == {int(k): float(v) for k, v in own.items()}
    assert by_tiles[0] > float(tm[tm["ipu"] == 0]["always_live"].sum())  # code counted
    assert always_live_from_liveness(p.liveness) == by_tiles
