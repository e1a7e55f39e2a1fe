"""A table's columns encoded where the table was made, ready for a streamed profile.

A Dask worker that finishes a rank (ingest/import_dask.py) encodes each column the way
the writer would (`writer.encode_column`: numbers as they are, bools as uint8, text as
int32 codes), with the codes into the frame's own distinct texts. The client, which
writes every rank and shares its cores with the workers, then only interns those few
texts in the profile's string table and re-indexes the codes (`StreamTable.append`):
no pandas work per column on its thread, and plain arrays, not frames, to unpickle.
The stored bytes and their encodings are the ones the frame itself would give.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.format import schema
from popviz.format.strings import StringTable
from popviz.format.writer import encode_column

TEXT_KINDS = (schema.ENC_STRING_REF, schema.ENC_INT_OR_STRING)


@dataclass
class EncodedColumn:
    kind: str  # schema.ENC_*
    data: np.ndarray  # as stored; for text kinds int32 codes into `texts`
    texts: list[str] | None = None  # text kinds: the distinct texts, by local code

    def encoded(self, strings: StringTable) -> tuple[str, np.ndarray]:
        """(kind, the array to store): text codes made codes of the profile's `strings`,
        as `encode_column` gives a frame's column."""
        if self.texts is None:
            return self.kind, self.data
        return self.kind, strings.encode_distinct(self.texts)[self.data]

    def empty(self) -> pd.Series:
        """An empty column of this one's kind (what a slice without it is filled from)."""
        if self.kind == schema.ENC_BOOL:
            return pd.Series([], dtype=bool)
        if self.kind == schema.ENC_NUMERIC:
            return pd.Series([], dtype=self.data.dtype)
        return pd.Series([], dtype=object)


@dataclass
class EncodedFrame:
    columns: dict[str, EncodedColumn]
    rows: int

    def __len__(self) -> int:
        return self.rows


def encode_frame(frame: pd.DataFrame) -> EncodedFrame:
    """`frame`'s columns as `encode_column` stores them, text against the frame's own
    texts (text columns as categories first: each distinct text hashed once)."""
    columns: dict[str, EncodedColumn] = {}
    for name, series in frame.items():
        if series.dtype.kind not in "iufbmM" and \
                not isinstance(series.dtype, pd.CategoricalDtype):
            series = series.astype("category")
        local = StringTable()
        kind, data = encode_column(series, local)
        texts = local.texts() if kind in TEXT_KINDS else None
        columns[str(name)] = EncodedColumn(kind, np.ascontiguousarray(data), texts)
    return EncodedFrame(columns, len(frame))


__all__ = ["EncodedColumn", "EncodedFrame", "encode_frame"]
