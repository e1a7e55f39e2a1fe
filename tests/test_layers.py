"""The import contract: the layer table in docs/internals.md, checked on every import (AST)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FACADE = "api"  # `import popviz` loads names from every layer: it counts as the api layer


def layer_ranks() -> dict[str, int]:
    """package -> rank, from the table between the layers markers of docs/internals.md."""
    text = (ROOT / "docs" / "internals.md").read_text()
    block = text.split("<!-- layers: begin -->")[1].split("<!-- layers: end -->")[0]
    ranks: dict[str, int] = {}
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for name in re.findall(r"`([\w.]+)`", cells[1]):
                ranks[name] = int(cells[0])
    return ranks


def components() -> dict[str, list[Path]]:
    """Top-level component -> its source files (popviz/X.py, popviz/X/, app/ = popviz_app)."""
    out: dict[str, list[Path]] = {"popviz_app": sorted((ROOT / "app").rglob("*.py"))}
    for path in sorted((ROOT / "popviz").iterdir()):
        if path.name.startswith("__") or path.name.startswith("."):
            continue
        if path.suffix == ".py":
            out[path.stem] = [path]
        elif path.is_dir() and (path / "__init__.py").exists():
            out[path.name] = sorted(path.rglob("*.py"))
    return out


def imported(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """(line, component) of every popviz import in a file, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods = [node.module]
            if node.module == "popviz":  # from popviz import figures / Options / vocab
                mods = [f"popviz.{a.name}" if a.name in names else "popviz"
                        for a in node.names]
        else:
            continue
        for mod in mods:
            parts = mod.split(".")
            if parts[0] == "popviz_app":
                out.append((node.lineno, "popviz_app"))
            elif parts[0] == "popviz":
                target = parts[1] if len(parts) > 1 else FACADE
                out.append((node.lineno, target if target in names else FACADE))
    return out


def test_every_package_has_a_rank() -> None:
    ranks = layer_ranks()
    missing = sorted(set(components()) - set(ranks))
    assert not missing, f"add these to the layer table in docs/internals.md: {missing}"
    assert not set(ranks) - set(components()) - {FACADE}, "the table names a package that is gone"


def test_no_import_points_up_the_layers() -> None:
    ranks, comps = layer_ranks(), components()
    wrong = []
    for name, files in comps.items():
        for path in files:
            for line, target in imported(path, set(comps)):
                if target != name and ranks[target] >= ranks[name]:
                    wrong.append(f"{path.relative_to(ROOT)}:{line}: {name} (rank "
                                 f"{ranks[name]}) imports {target} (rank {ranks[target]})")
    assert not wrong, "\n".join(wrong)


def test_the_contract_catches_an_arrow_against_it(tmp_path: Path) -> None:
    # the checker itself: a metrics module importing analysis is reported
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from popviz.analysis import balance\n    import popviz\n")
    names = set(components())
    assert imported(bad, names) == [(2, "analysis"), (3, FACADE)]
    ranks = layer_ranks()
    assert ranks["analysis"] > ranks["metrics"] and ranks[FACADE] > ranks["analysis"]


def module_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (at any depth in the file;
    `from .x import` and `from . import x` too)."""
    in_app = package.relative_to(ROOT).parts[0] == "app"
    inner = package.relative_to(ROOT / ("app" if in_app else "popviz")).parts
    prefix = ".".join(("popviz_app" if in_app else "popviz", *inner))
    mods = {f"{prefix}.{p.stem}": p for p in package.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                base = f"{prefix}.{node.module}" if node.module else prefix
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                names = []
            graph[mod] |= {n for n in names if n in mods and n != mod}
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of `graph` (its modules in order, the first again at the end)."""
    done: set[str] = set()

    def visit(mod: str, path: tuple[str, ...]) -> list[str]:
        if mod in path:
            return [*path[path.index(mod):], mod]
        if mod in done:
            return []
        for dep in sorted(graph[mod]):
            found = visit(dep, (*path, mod))
            if found:
                return found
        done.add(mod)
        return []
    for mod in sorted(graph):
        found = visit(mod, ())
        if found:
            return found
    return []


PACKAGES = sorted({p.parent for p in (ROOT / "popviz").rglob("__init__.py")}
                  | {p.parent for p in (ROOT / "app").rglob("__init__.py")})


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_package_imports_itself_in_a_circle(package: Path) -> None:
    """Within a package no module imports (even inside a function) one that imports it
    back: compiler <-> gpu_compile and the compare page <-> its op table once did."""
    circle = _circle(module_graph(package))
    assert not circle, "import circle: " + " -> ".join(circle)


def test_the_circle_check_finds_a_circle(tmp_path: Path) -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) == []
    assert len(module_graph(ROOT / "popviz" / "analysis" / "compare")) >= 6


def test_no_runtime_module_imports_the_tooling() -> None:
    """Test data, fuzzers, calibration points and doc generation (tooling/) and the tests
    stay out of what `popviz` runs, and out of the package users install."""
    import tomllib

    users = []
    for path in [*(ROOT / "popviz").rglob("*.py"), *(ROOT / "app").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            users += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                      if n.split(".")[0] in ("tooling", "tests")]
    assert not users, users
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]
    assert not [p for p in packages if p.split(".")[0] in ("tooling", "tests")]
    assert not [p for p in (ROOT / "popviz").rglob("*.py")
                if p.stem in ("calibration", "costdoc", "gpu_fit", "gpu_programs", "fuzz")]


def test_the_layout_drawing_names_every_package() -> None:
    """docs/internals.md draws the package tree: every package (and sub-package) is in it."""
    text = (ROOT / "docs" / "internals.md").read_text()
    drawing = text.split("<!-- layout: begin -->")[1].split("<!-- layout: end -->")[0]
    named = set(re.findall(r"([\w.]+)/", drawing)) | set(re.findall(r"(\w+)\.py", drawing))
    packages = {p.parent.name for p in (ROOT / "popviz").rglob("__init__.py")} - {"popviz"}
    modules = {p.stem for p in (ROOT / "popviz").glob("*.py") if not p.stem.startswith("__")}
    missing = sorted(packages - named) + sorted(modules - named - set(re.findall(r"\w+",
                                                                                drawing)))
    assert not missing, f"draw these in docs/internals.md's layout: {missing}"
