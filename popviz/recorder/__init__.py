"""recorder: run a real (or fake-tensor) step and capture it as a Program.

Knows nothing of compile or format: `popviz.record(...)` (popviz/api.py) composes it with
the compiler and the writer. The package is not named `record`, so that importing a
submodule (`import popviz.recorder.recorder`) never hides the function `popviz.record`."""

from __future__ import annotations

from popviz.recorder.program import Program
from popviz.recorder.recorder import Recorder
from popviz.recorder.steps import record_program, train_step

__all__ = ["Program", "Recorder", "record_program", "train_step"]
