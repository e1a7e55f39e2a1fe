"""A profile says what it is once: its Naming (from the words the file states) owns its
device and time words and which views apply. Every page of each of the three kinds (an IPU
plan, a GPU plan, a measured run) speaks only its own family's words, and app/, figures/
and reporters/ ask the Naming instead of testing the target or the kind themselves."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from popviz_app import create_app, render
from popviz_app.pages import PAGES

import popviz
from popviz.compiler import compile
from popviz.format import write_report
from popviz.options import Options
from popviz.vocab import Naming, naming_for
from tests.dash_util import component_text, find_components
from tooling.gpu_programs import gpu_program

ROOT = Path(__file__).resolve().parents[1]
# the words of the other families; a page may still use them to say why something is absent
FOREIGN = {
    "ipu": re.compile(r"\b(GPUs?|ranks?|kernels?)\b"),
    "gpu": re.compile(r"\b(IPU\d*|IPUs|AMP|availableMemoryProportion|tiles?|cycles|ranks?)\b"),
    "rank": re.compile(r"\b(IPU\d*|IPUs|AMP|availableMemoryProportion|tiles?|cycles|"
                       r"GPU plan)\b"),
}
SAYS_WHY = ("has no tiles", "is an IPU compiler option", "no per-tile memory",
            "needs a modelled profile", "BSP view")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One profile of each kind: the bundled ResNet-50 IPU pipeline and measured tutorial
    run, and a two-stage MLP planned over two H100s."""
    root = tmp_path_factory.mktemp("kinds")
    shutil.copytree(ROOT / "profiles/rn50_pipeline", root / "ipu")
    shutil.copytree(ROOT / "profiles/tutorial_measured_2ranks", root / "rank")
    plan = compile(gpu_program("pipe", 256, 32), Options(
        target="h100", splits=["stage1"], num_ipus=2, schedule="1F1B",
        gradient_accumulation=4))
    write_report(plan, root / "gpu")
    return root


def _profile(served: Path, kind: str) -> str:
    return next((served / kind).rglob("profile.h5")).relative_to(served).as_posix()


@pytest.mark.parametrize("kind,device,unit,tiles,measured", [
    ("ipu", "IPU", "cycles", True, False),
    ("gpu", "GPU", "ns", False, False),
    ("rank", "rank", "ns", False, True),
])
def test_each_kind_says_what_applies(served: Path, kind: str, device: str, unit: str,
                                     tiles: bool, measured: bool) -> None:
    with popviz.open(served / _profile(served, kind)) as profile:
        words = naming_for(profile)
    assert (words.family, words.device, words.unit) == (kind, device, unit)
    assert words.has_tiles is tiles and words.has_amp is tiles
    assert words.measured is measured and words.timed == ("measured" if measured
                                                           else "modelled")
    assert words.gpu_plan is (kind == "gpu")
    assert words.label(1) == {"ipu": "IPU1", "gpu": "GPU 1", "rank": "rank 1"}[kind]
    assert (words.column("ipu"), words.column("total_cycles")) == {
        "ipu": ("ipu", "total cycles"), "gpu": ("gpu", "total ns"),
        "rank": ("rank", "total ns")}[kind]


def test_a_naming_is_its_stated_words_and_nothing_else() -> None:
    """No flag beside the words: a GPU plan is not 'measured' because its times are ns."""
    assert [f for f in Naming.__dataclass_fields__] == ["device", "unit"]
    assert not Naming("GPU", "ns").measured and Naming("rank", "ns").measured


def _page_text(body: Any) -> str:
    text = component_text(body)
    for graph in find_components(body, "Graph"):
        if graph.figure is not None:
            fig = graph.figure.to_plotly_json()
            text += "\n" + json.dumps(fig.get("layout", {})) + "\n" + "\n".join(
                f"{t.get('name', '')} {t.get('hovertemplate', '')}" for t in fig["data"])
    for table in find_components(body, "DataTable"):
        text += "\n" + " ".join(str(c.get("name")) for c in table.columns or [])
    return text


@pytest.mark.parametrize("kind", ["ipu", "gpu", "rank"])
def test_every_page_speaks_its_own_family(served: Path, kind: str) -> None:
    app = create_app(served)
    rel = _profile(served, kind)
    found = {}
    for page in [p for p in PAGES if p.NEEDS_PROFILE]:
        _, body = render(app.popviz_context, page.PATH, f"?profile={rel}")
        for sentence in re.split(r"(?<=[.:;])\s+|\n", _page_text(body)):
            if any(why in sentence for why in SAYS_WHY):
                continue
            for m in FOREIGN[kind].finditer(sentence):
                found.setdefault(f"{page.PATH}: {m.group(0)}", sentence[:160])
    assert not found, found


ASKED_OF_THE_PROFILE = {"is_gpu_target", "is_measured", "words_of"}


@pytest.mark.parametrize("folder", ["app", "popviz/figures", "popviz/reporters"])
def test_views_ask_the_naming_not_the_target(folder: str) -> None:
    wrong = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ASKED_OF_THE_PROFILE:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.id}()")
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) \
                    and node.left.attr in ("timed", "kind", "device"):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.left.attr} ==")
    assert not wrong, wrong


@pytest.mark.parametrize("kind,name", [("ipu", "ipu_time"), ("gpu", "gpu_time"),
                                       ("rank", "rank_time")])
def test_a_figure_download_is_named_in_the_profiles_words(served: Path, kind: str,
                                                          name: str) -> None:
    app = create_app(served)
    rel = _profile(served, kind)
    _, body = render(app.popviz_context, "/stages", f"?profile={rel}")
    links = {a.children: a.href for a in find_components(body, "A")}
    assert f"{name}.html" in links and links[f"{name}.html"].startswith("/download/html/ipu_time")
    reply = app.server.test_client().get(links[f"{name}.html"])
    assert reply.status_code == 200
    assert f'{kind}_profile_{name}.html"' in reply.headers["Content-Disposition"]
