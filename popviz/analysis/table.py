"""Filter, sort and page a table the way Dash's DataTable asks for it (server side)."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

# one clause of DataTable's filter_query: {column} operator value
_CLAUSE = re.compile(
    r"^\{(?P<col>[^}]+)\}\s*(?P<op>scontains|icontains|contains|datestartswith|s=|i=|"
    r"<=|>=|!=|=|<|>|eq|ne|lt|le|gt|ge)\s*(?P<val>.*)$")
_OPS = {"eq": "=", "s=": "=", "i=": "=", "ne": "!=", "lt": "<", "le": "<=", "gt": ">",
        "ge": ">=", "scontains": "contains", "icontains": "contains"}


def _value(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        return text[1:-1]
    try:
        return float(text)
    except ValueError:
        return text


def _text(val: Any) -> str:
    if isinstance(val, float) and val.is_integer():
        return str(int(val))
    return str(val)


def filter_table(frame: pd.DataFrame, filter_query: str | None) -> pd.DataFrame:
    """Rows matching every `{col} op value` clause joined by `&&`. Unknown columns or
    operators raise ValueError naming them."""
    if not filter_query or not filter_query.strip():
        return frame
    mask = pd.Series(True, index=frame.index)
    for raw in filter_query.split(" && "):
        match = _CLAUSE.match(raw.strip())
        if not match:
            raise ValueError(f"cannot read filter {raw.strip()!r}")
        col, op, val = match["col"], _OPS.get(match["op"], match["op"]), _value(match["val"])
        if col not in frame.columns:
            raise ValueError(f"no column {col!r} to filter on")
        series = frame[col]
        numeric = pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(
            series)
        if op in ("contains", "datestartswith"):
            text = series.astype(str).str.lower()
            needle = _text(val).lower()
            part = text.str.contains(needle, regex=False) if op == "contains" else \
                text.str.startswith(needle)
        elif numeric and isinstance(val, float):
            part = {"=": series == val, "!=": series != val, "<": series < val,
                    "<=": series <= val, ">": series > val, ">=": series >= val}[op]
        else:
            text = series.astype(str)
            sval = _text(val)
            part = {"=": text == sval, "!=": text != sval, "<": text < sval,
                    "<=": text <= sval, ">": text > sval, ">=": text >= sval}[op]
        mask &= part.fillna(False).astype(bool)
    return frame[mask]


def query_table(frame: pd.DataFrame, filter_query: str | None = None,
                sort_by: list[dict[str, str]] | None = None, page: int = 0,
                page_size: int = 50) -> tuple[pd.DataFrame, int]:
    """(one page of the filtered, sorted rows, number of matching rows)."""
    rows = filter_table(frame, filter_query)
    if sort_by:
        cols = [s["column_id"] for s in sort_by if s.get("column_id") in rows.columns]
        if cols:
            asc = [s.get("direction", "asc") == "asc" for s in sort_by
                   if s.get("column_id") in rows.columns]
            rows = rows.sort_values(cols, ascending=asc, kind="stable")
    total = len(rows)
    page = max(0, int(page or 0))
    return rows.iloc[page * page_size:(page + 1) * page_size], total
