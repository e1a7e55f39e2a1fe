"""The last step of `popviz import` before anything is written: the tables and meta checked
against what the profile reader accepts (popviz/format/validate.py), so an import never
exits 0 leaving a profile that `popviz.open` then calls damaged. The readers upstream
already drop or refuse what is out of range (docs/import.md, "Hostile input"); this is
the guard that names the inputs if anything still slips through."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from popviz.errors import ProfileError
from popviz.format import bounds, schema, validate


def clean_text(tables: dict[str, pd.DataFrame]) -> None:
    """Text the HDF5 string table cannot hold (lone surrogates from a `\\ud800` escape)
    becomes its UTF-8 replacement, in place; each distinct value is checked once."""
    for frame in tables.values():
        for column in frame.columns:
            values = frame[column]
            if values.dtype.kind in "iufbmM":  # numbers; text is object, str or category
                continue
            uniques = values.cat.categories if isinstance(values.dtype, pd.CategoricalDtype) \
                else pd.unique(values.to_numpy(dtype=object))
            bad = {u: _encodable(u) for u in uniques if isinstance(u, str) and not _utf8(u)}
            if bad:  # as objects: a replacement may equal another value
                kind = "category" if isinstance(values.dtype, pd.CategoricalDtype) \
                    else values.dtype
                frame[column] = pd.Series(values.to_numpy(dtype=object), index=frame.index
                                          ).replace(bad).astype(kind)  # type: ignore[arg-type]  # pandas-stubs: only literal dtype names


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _encodable(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")


def check_tables(tables: dict[str, pd.DataFrame], meta: dict[str, Any], label: str) -> None:
    """ProfileError naming `label` (the inputs) if a table or meta would be refused."""
    dims = bounds.dimensions(meta, "rank", {n: len(f) for n, f in tables.items()}, {})
    for name, frame in tables.items():
        check_rows(name, frame, dims, label)
    check_meta(meta, label)


def check_rows(name: str, frame: pd.DataFrame, dims: bounds.Dimensions, label: str) -> None:
    """ProfileError naming `label` if a row of table `name` (all of it, or one rank's
    slice) would be refused by a reader bounding the profile by `dims`."""
    try:
        for column in schema.NON_NEGATIVE.get(name, ()):
            if column not in frame.columns:
                continue
            values = frame[column].to_numpy()
            if values.dtype.kind not in "iuf":
                raise ProfileError(f"{label}: table '{name}' column '{column}' holds "
                                   f"{values.dtype}, not numbers")
            validate.check_values(name, column, values, label)
        if name in ("trace", "ops") and len(frame) and "end" in frame and "start" in frame \
                and (frame["end"].to_numpy() < frame["start"].to_numpy()).any():
            raise ProfileError(f"{label}: table '{name}' has a row ending before it starts")
        for column in bounds.COLUMNS.get(name, {}):
            if column in frame.columns and frame[column].dtype.kind in "iuf":
                bounds.check_column(name, column, frame[column].to_numpy(), dims, label)
    except ProfileError as exc:
        raise _refused(exc) from None


def check_meta(meta: dict[str, Any], label: str) -> None:
    """ProfileError naming `label` if the meta would be refused."""
    try:
        text = json.dumps(meta, default=str)
        if len(text) > schema.MAX_JSON_CHARS:
            raise ProfileError(f"{label}: meta is {len(text):,} characters, more than "
                               f"{schema.MAX_JSON_CHARS:,}")
        validate.check_meta(meta, label)
    except ProfileError as exc:
        raise _refused(exc) from None


def _refused(exc: ProfileError) -> ProfileError:
    return ProfileError(f"{exc} (the import would write a profile the reader refuses; "
                        "nothing written)")
