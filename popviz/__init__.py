"""popviz: a PopVision-style profiler for pipelined and recomputed PyTorch training.

The public names are re-exported here lazily, so `import popviz` stays cheap and does not
import torch or Dash until a name that needs them is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from popviz._version import __version__
from popviz.errors import ProfileError

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "Options": "popviz.options",
    "Block": "popviz.annotate",
    "BeginBlock": "popviz.annotate",
    "Stage": "popviz.annotate",
    "PipelinedExecution": "popviz.annotate",
    "ShardedExecution": "popviz.annotate",
    "recomputation_checkpoint": "popviz.annotate",
    "host_io": "popviz.annotate",
    "record": "popviz.api",
    "plan": "popviz.api",
    "plan_step": "popviz.api",
    "Program": "popviz.recorder.program",
    "compile": "popviz.compiler.compiler",
    "Report": "popviz.compiler.report",
    "open": "popviz.format.reader",
    "discover": "popviz.format.reader",
    "Profile": "popviz.format.profile",
    "FileProfile": "popviz.format.reader",
    "ReportProfile": "popviz.format.memory",
    "write_profile": "popviz.format.writer",
    "compare": "popviz.api",
    "import_trace": "popviz.ingest.importer",
}

__all__ = ["ProfileError", "__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'popviz' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
