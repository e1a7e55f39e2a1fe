"""`ReportProfile`: a compiled Report read through the `Profile` API, no file needed.

The /tune page serves re-planned runs this way (app/pages/tune.py); tests and benches wrap
synthetic reports (tooling.testing.synthetic) in it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from popviz.format.profile import TableViews
from popviz.format.schema import FORMAT_VERSION, WORD_ATTRS
from popviz.vocab import MODELLED_KIND, words_of

if TYPE_CHECKING:  # only the type: importing the compiler loads torch
    from popviz.compiler.report import Report


class ReportProfile(TableViews):
    """The read API of `popviz.open` over an in-memory Report (a `Profile`)."""

    def __init__(self, report: Report, name: str = "synthetic", path: str | Path = "") -> None:
        self._report = report
        self.summary: dict[str, Any] = report.summary
        self.name = name
        self.path = path
        self.kind: str = report.meta.get("kind", MODELLED_KIND)
        self.format_version = FORMAT_VERSION  # the version writing it would give
        # the words writing it would state, in `meta` too, as a file read back has them
        self.device_kind, self.time_unit = words_of(self.kind, report.meta)
        self.meta: dict[str, Any] = {**report.meta,
                                     **dict(zip(WORD_ATTRS, (self.device_kind, self.time_unit)))}

    def __repr__(self) -> str:
        return f"<popviz.ReportProfile {self.name} kind={self.kind}>"

    def __enter__(self) -> ReportProfile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: the tables are the report's."""

    @property
    def table_names(self) -> list[str]:
        return sorted(self._report.tables)

    def table(self, name: str) -> pd.DataFrame:
        return self._report.tables.get(name, pd.DataFrame())

    def trace_for(self, ipu: int, start: float | None = None,
                  end: float | None = None) -> pd.DataFrame:
        t = self._report.tables["trace"]
        m = t["ipu"] == ipu
        if start is not None:
            m &= t["end"] > start
        if end is not None:
            m &= t["start"] < end
        return t[m]

    def array_shape(self, name: str) -> tuple[int, ...]:
        arr = self._report.arrays.get(name)
        return () if arr is None else tuple(arr.shape)

    def tile_liveness(self, ipu: int, step_start: int = 0,
                      step_stop: int | None = None) -> np.ndarray:
        arr = self._report.arrays.get("tile_liveness")
        if arr is None or ipu >= arr.shape[0]:
            return np.zeros((0, 0), dtype=np.uint32)
        return arr[ipu, step_start:step_stop]
