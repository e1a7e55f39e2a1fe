"""The one profile type: `Profile`, what `popviz.open` returns and every reader of profiles takes.

Two classes implement it: `FileProfile` (`reader.py`: an `.h5` file, tables read lazily and
checked) and `ReportProfile` (`memory.py`: a compiled `Report` held in memory, as the
/tune page serves a re-planned run and tests use synthetic reports). Both close(); a
ReportProfile's close() has nothing to release. Code that needs the file itself (the
vetting worker, the fuzzer) takes `FileProfile`.

The protocol is not runtime-checkable on purpose: on Python 3.11 `isinstance` against it
would evaluate every table property, i.e. read every table of a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd


class Profile(Protocol):
    """The read API of a profile (docs/internals.md, "Profile")."""

    @property
    def path(self) -> str | Path: ...  # the file; "" for one held in memory
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...  # vocab.MODELLED_KIND or MEASURED_KIND
    @property
    def format_version(self) -> str: ...
    @property
    def meta(self) -> dict[str, Any]: ...
    @property
    def summary(self) -> dict[str, Any]: ...
    @property
    def table_names(self) -> list[str]: ...

    def table(self, name: str) -> pd.DataFrame: ...

    @property
    def stages(self) -> pd.DataFrame: ...
    @property
    def trace(self) -> pd.DataFrame: ...
    @property
    def liveness(self) -> pd.DataFrame: ...
    @property
    def tile_memory(self) -> pd.DataFrame: ...
    @property
    def exchange(self) -> pd.DataFrame: ...
    @property
    def ops(self) -> pd.DataFrame: ...
    @property
    def tensors(self) -> pd.DataFrame: ...
    @property
    def variables(self) -> pd.DataFrame: ...
    @property
    def oom(self) -> pd.DataFrame: ...

    def trace_for(self, ipu: int, start: float | None = None,
                  end: float | None = None) -> pd.DataFrame: ...
    def array_shape(self, name: str) -> tuple[int, ...]: ...
    def tile_liveness(self, ipu: int, step_start: int = 0,
                      step_stop: int | None = None) -> np.ndarray: ...
    def close(self) -> None: ...


class TableViews:
    """The contract tables as properties over `table(name)`, shared by both profiles."""

    def table(self, name: str) -> pd.DataFrame:
        raise NotImplementedError

    @property
    def stages(self) -> pd.DataFrame:
        return self.table("stages")

    @property
    def trace(self) -> pd.DataFrame:
        return self.table("trace")

    @property
    def liveness(self) -> pd.DataFrame:
        return self.table("liveness")

    @property
    def tile_memory(self) -> pd.DataFrame:
        return self.table("tile_memory")

    @property
    def exchange(self) -> pd.DataFrame:
        return self.table("exchange")

    @property
    def ops(self) -> pd.DataFrame:
        return self.table("ops")

    @property
    def tensors(self) -> pd.DataFrame:
        return self.table("tensors")

    @property
    def variables(self) -> pd.DataFrame:
        return self.table("variables")

    @property
    def oom(self) -> pd.DataFrame:
        return self.table("oom")
