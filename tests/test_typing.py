"""The objects views pass around are typed: no parameter that holds a comparison, a
profile, a diff, a side, a cache entry or a report is `Any` (14 `comp: Any` once hid
attribute errors from mypy in the compare modules); mypy itself runs in `make test`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TYPED = {"comp", "comparison", "profile", "prof", "diff", "side", "entry", "report", "words",
         "naming", "result", "candidate"}


def test_structured_parameters_are_not_any() -> None:
    loose = []
    for path in sorted([*(ROOT / "popviz").rglob("*.py"), *(ROOT / "app").rglob("*.py")]):
        if path == ROOT / "popviz" / "vocab.py":  # the leaf: reads any profile-like object
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                if arg.arg in TYPED and (arg.annotation is None
                                         or ast.unparse(arg.annotation) in ("Any", "object")):
                    given = ast.unparse(arg.annotation) if arg.annotation else "?"
                    loose.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}"
                                 f"({arg.arg}: {given})")
    assert not loose, "\n".join(loose)
