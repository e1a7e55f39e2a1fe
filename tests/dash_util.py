"""Helpers for tests that inspect Dash component trees without a browser."""

from __future__ import annotations

from typing import Any


def component_text(component: Any) -> str:
    """All text inside a Dash component tree, space-joined."""
    if isinstance(component, (str, int, float)):
        return str(component)
    children = getattr(component, "children", None)
    if isinstance(children, (list, tuple)):
        return " ".join(component_text(c) for c in children)
    return "" if children is None else component_text(children)


def find_components(component: Any, kind: str) -> list[Any]:
    """Every component of type `kind` (a class name: "DataTable") in a tree."""
    found = [component] if type(component).__name__ == kind else []
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, (str, int, float)):
            found += find_components(child, kind)
    return found
