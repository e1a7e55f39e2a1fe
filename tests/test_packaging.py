"""Packaging: every package directory is installed, and the app is not a bare `app`."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = set()
    for init in (ROOT / "popviz").rglob("__init__.py"):
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    for init in (ROOT / "app").rglob("__init__.py"):
        found.add(".".join(("popviz_app", *init.parent.relative_to(ROOT / "app").parts)))
    assert found <= listed, f"add to pyproject [tool.setuptools] packages: {found - listed}"


def test_app_installs_as_popviz_app() -> None:
    import popviz_app

    assert Path(popviz_app.__file__).resolve().parent == ROOT / "app"
