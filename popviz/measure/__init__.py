"""measure: real multi-process pipelines on torch.distributed.pipelining, timed per rank.

    python -m popviz.measure --model tutorial --ranks 2 --microbatches 4 \
        --schedule 1F1B --profile-dir DIR          # DIR/rank{r}/profile.h5
    popviz merge DIR --out DIR_merged              # one profile, ipu = rank

API: `measure(MeasureConfig(...))`, `merge_profiles(inputs, out)`. Names load lazily so
`import popviz.measure` does not import torch. See docs/measure.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "MeasureConfig": "popviz.measure.runner",
    "measure": "popviz.measure.runner",
    "run_rank": "popviz.measure.runner",
    "merge_profiles": "popviz.measure.merge",
    "import_trace": "popviz.ingest.importer",
    "Probe": "popviz.measure.probe",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'popviz.measure' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
