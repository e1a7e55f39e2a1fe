"""compiler: place a recorded Program on a target -> Report (see docs/cost-model.md).

The function is `popviz.compile(program, options)` (= `popviz.compiler.compile`); the
package has another name so that importing a submodule never hides the function. Both
names load on first use: `compile` brings torch (the recorder's types), and a reader of
one torch-free submodule (the import's `schedule_zb`) must not pay for it (~250 MiB)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from popviz.compiler.compiler import compile
    from popviz.compiler.report import Report

__all__ = ["Report", "compile"]


def __getattr__(name: str) -> Any:
    if name == "compile":
        from popviz.compiler.compiler import compile

        return compile
    if name == "Report":
        from popviz.compiler.report import Report

        return Report
    raise AttributeError(f"module 'popviz.compiler' has no attribute {name!r}")
