"""ingest: what others recorded, read into popviz's measured tables.

torch.profiler (Kineto) traces of one or many ranks and CUDA memory snapshots, parsed rank
by rank (`import_rank`), aligned on one clock, their sends and recvs matched and split
into waiting and transfer, and turned into the contract tables (`tables`). `popviz.measure`
(live runs) feeds its own ranks' traces through the same path. See docs/import.md.

    popviz import rank*.json.gz --to DIR

Names load lazily so `import popviz.ingest` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "import_trace": "popviz.ingest.importer",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'popviz.ingest' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
