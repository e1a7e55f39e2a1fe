"""compile: place a recorded Program on a target -> Report (see docs/cost-model.md).

`popviz.compile(program, options)` is this package called as a function: importing any
submodule (e.g. `popviz.compile.synthetic`) binds the package to the name `popviz.compile`,
so the module object itself is callable and forwards to `compile`.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from popviz.compile.compiler import compile  # the package is callable: see below
from popviz.compile.report import Report

__all__ = ["Report", "compile"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return compile(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
