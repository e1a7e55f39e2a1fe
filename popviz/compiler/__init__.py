"""compiler: place a recorded Program on a target -> Report (see docs/cost-model.md).

The function is `popviz.compile(program, options)` (= `popviz.compiler.compile`); the
package has another name so that importing a submodule never hides the function."""

from __future__ import annotations

from popviz.compiler.compiler import compile
from popviz.compiler.report import Report

__all__ = ["Report", "compile"]
