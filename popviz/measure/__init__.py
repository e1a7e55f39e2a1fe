"""measure: live runs of real pipelines on torch.distributed.pipelining, timed by
torch.profiler and read through `popviz.ingest` (the importer's own path).

    python -m popviz.measure --model tutorial --ranks 2 --microbatches 4 \
        --schedule 1F1B --profile-dir DIR          # DIR/profile.h5, DIR/traces/rank{r}.json
    with popviz.measure.record("DIR") as rec:      # around your own pipelining steps,
        ...; rec.step()                            # on every rank (torchrun, any nodes)

API: `record(...)`, `measure(MeasureConfig(...))`. Names load lazily so
`import popviz.measure` does not import torch. See docs/measure.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "MeasureConfig": "popviz.measure.runner",
    "measure": "popviz.measure.launch",
    "run_rank": "popviz.measure.runner",
    "merge_profiles": "popviz.measure.merge",
    "record": "popviz.measure.live",
    "LiveRecording": "popviz.measure.live",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'popviz.measure' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
