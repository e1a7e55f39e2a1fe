"""Recording a real (or fake-tensor) training step into a Program.

`popviz.record(options, profile_dir=...)` is this package called as a function: importing
`popviz.record` (the package) must not hide the function of the public contract, so the
module object itself is callable and forwards to `record`.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from popviz.record.program import Program
from popviz.record.recorder import Recorder
from popviz.record.session import (
    PlanSession,
    Recording,
    compile_options,
    plan,
    plan_step,
    record,
    record_program,
    train_step,
)

__all__ = ["PlanSession", "Program", "Recorder", "Recording", "compile_options", "plan",
           "plan_step", "record", "record_program", "train_step"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return record(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
