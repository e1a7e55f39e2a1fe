"""Filter, sort and page a table the way Dash's DataTable asks for it (server side).

DataTable turns what a user types in a column's filter cell into `{col} op value`
clauses joined by ` && `; relational operators may carry a case prefix (`s>`, `i<=`,
`s=`), and a cell without an operator arrives as `=` (numeric column) or `contains`
(text). On top of DataTable's own syntax a value may be a range, `100..2000`,
`100 to 2000` or `between 100 and 2000` (inclusive), and a number may end in k, M, G
or T (1e3 ... 1e12): `> 1.5M` on flops."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

_RELATIONAL = r"<=|>=|!=|=|<|>|eq|ne|lt|le|gt|ge"
# one clause of DataTable's filter_query: {column} operator value
_CLAUSE = re.compile(
    r"^\{(?P<col>[^}]+)\}\s*(?P<op>[si]?contains|datestartswith|"
    rf"[si]?(?:{_RELATIONAL})|is (?:not )?blank)\s*(?P<val>.*)$")
_OPS = {"eq": "=", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_SUFFIX = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_NUMBER = r"-?\d[\d,_]*(?:\.\d*)?(?:e[+-]?\d+)?\s*[kmgt]?|-?\.\d+"
_RANGE = re.compile(rf"^(?:between\s+)?({_NUMBER})\s*(?:\.\.|to|and|–)\s*({_NUMBER})$",
                    re.IGNORECASE)
# an operator typed inside a value ("> 1000" sent as `{col} contains > 1000` or `= > 1000`)
_INNER = re.compile(r"^(<=|>=|!=|=|<|>)\s*(.+)$")
_HINT = " (try 2e5, > 1e5, 1e5..2e5 or > 1e5 and < 2e5)"


def _number(text: str) -> float | None:
    """A number as a user types it (1,000 · 1e6 · 2.5M), or None."""
    text = text.strip().replace(",", "").replace("_", "").lower()
    scale = 1.0
    if text and text[-1] in _SUFFIX:
        scale, text = _SUFFIX[text[-1]], text[:-1].strip()
    try:
        return float(text) * scale
    except ValueError:
        return None


def _value(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        return text[1:-1]
    number = _number(text)
    return text if number is None else number


def _text(val: Any) -> str:
    if isinstance(val, float) and val.is_integer():
        return str(int(val))
    return str(val)


def _normalise(op: str) -> str:
    if op in ("scontains", "icontains"):
        return "contains"
    if op[:1] in ("s", "i") and op[1:] and not op.startswith("is "):
        rest = op[1:]
        if rest in _OPS or rest in ("<=", ">=", "!=", "=", "<", ">"):
            op = rest
    return _OPS.get(op, op)


def _compare(series: pd.Series, op: str, val: Any) -> pd.Series:
    numeric = pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)
    if numeric and isinstance(val, float):
        left: Any = series
    else:
        left, val = series.astype(str), _text(val)
    return {"=": left == val, "!=": left != val, "<": left < val, "<=": left <= val,
            ">": left > val, ">=": left >= val}[op]


def _lower(frame: pd.DataFrame, col: str, texts: dict[str, pd.Series] | None) -> pd.Series:
    """Column `col` as lower-case text, built once per column when `texts` (a cache the
    caller keeps with the frame) is given: converting a big column is the costly part."""
    if texts is None:
        return frame[col].astype(str).str.lower()
    if col not in texts:
        texts[col] = frame[col].astype(str).str.lower()
    return texts[col]


def _clause(frame: pd.DataFrame, raw: str,
            texts: dict[str, pd.Series] | None = None) -> pd.Series:
    match = _CLAUSE.match(raw.strip())
    if not match:
        raise ValueError(f"cannot read filter {raw.strip()!r}")
    col, op, text = match["col"], _normalise(match["op"]), match["val"].strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        text = text[1:-1].strip()  # DataTable quotes a value with spaces in it
    if col not in frame.columns:
        raise ValueError(f"no column {col!r} to filter on")
    series = frame[col]
    # what the cell held, for a message: DataTable takes a leading operator out of what was
    # typed (`>>>` arrives as `s> >>`), so a value still starting with one gets it back
    typed = f"{op}{text}" if text[:1] and text[:1] in "<>=!" and op in (
        "<", "<=", ">", ">=", "!=") else text
    if op in ("is blank", "is not blank"):
        blank = series.isna() | (series.astype(str).str.strip() == "")
        return blank if op == "is blank" else ~blank
    numeric = pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)
    inner = _INNER.match(text)
    if inner and op in ("=", "contains"):  # "> 1000" typed where an operator was not parsed
        op, text = inner[1], inner[2].strip()
    span = _RANGE.match(text)
    if span and op in ("=", "contains") and numeric:
        lo, hi = sorted((_number(span[1]) or 0.0, _number(span[2]) or 0.0))
        return (series >= lo) & (series <= hi)
    val = _value(text)
    if numeric and text and isinstance(val, str) and _number(val) is None:
        # DataTable sends a word typed in a number column as `{col} s= word`: matching it
        # as text would silently give no rows
        raise ValueError(f"{col!r} holds numbers; {typed!r} is not one{_HINT}")
    if op == "contains" and numeric and isinstance(val, float):
        op = "="  # a bare number in a numeric column means equal
    if op in ("=", "!=") and not numeric and isinstance(val, str) and "*" in val:
        hit = _glob(series, val)
        return hit if op == "=" else ~hit
    if op in ("contains", "datestartswith"):
        lower = _lower(frame, col, texts)
        needle = _text(val).lower()
        return lower.str.contains(needle, regex=False) if op == "contains" else \
            lower.str.startswith(needle)
    if numeric and not isinstance(val, float) and op != "=" and op != "!=":
        raise ValueError(f"{col!r} holds numbers; {typed!r} is not one{_HINT}")
    if not numeric and op in ("<", "<=", ">", ">="):
        # as text every name sorts after "5": "> 5" kept every row and said nothing
        raise ValueError(f"{col!r} holds text; {op + ' ' + text!r} compares numbers (type "
                         "part of a name to match it, e.g. conv)")
    return _compare(series, op, val)


def _glob(series: pd.Series, pattern: str) -> pd.Series:
    """Rows whose text matches `pattern` (`*`: any run of characters); `a.*` also matches
    `a` itself, so a module path pattern takes the module and its children."""
    body = ".*".join(re.escape(part) for part in pattern.split("*"))
    if pattern.endswith(".*"):
        body = re.escape(pattern[:-2]) + r"(\..*)?"
    return series.astype(str).str.fullmatch(body)


def _clauses(frame: pd.DataFrame, raw: str,
             texts: dict[str, pd.Series] | None) -> pd.Series:
    """One clause, or several typed in one cell: `> 1e5 and < 2e5` on a number column is
    both bounds (each part must start with an operator)."""
    match = _CLAUSE.match(raw.strip())
    if match:
        op, text = _normalise(match["op"]), match["val"].strip()
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
            text = text[1:-1].strip()  # DataTable quotes a value with spaces in it
        if op in ("<", "<=", ">", ">=", "!="):  # DataTable took the first operator out
            text = f"{op} {text}"
        parts = re.split(r"\s+(?:and|&&|&)\s+", text, flags=re.IGNORECASE)
        if len(parts) > 1 and all(_INNER.match(part) for part in parts):
            mask = pd.Series(True, index=frame.index)
            for part in parts:
                mask &= _clause(frame, f"{{{match['col']}}} = {part}", texts)
            return mask
    return _clause(frame, raw, texts)


def filter_table(frame: pd.DataFrame, filter_query: str | None,
                 texts: dict[str, pd.Series] | None = None,
                 errors: list[str] | None = None) -> pd.DataFrame:
    """Rows matching every `{col} op value` clause joined by `&&`. Unknown columns,
    operators or a word where a number is needed raise ValueError naming them; with
    `errors` (a list) such a clause is skipped and its message appended instead, so one
    bad cell never blanks the table nor stops the other filters. `texts`: a dict kept
    with `frame` across calls, filled with lower-cased text columns."""
    if not filter_query or not filter_query.strip():
        return frame
    mask = pd.Series(True, index=frame.index)
    for raw in re.split(r"\s+&&\s+", filter_query.strip()):
        try:
            mask &= _clauses(frame, raw, texts).fillna(False).astype(bool)
        except ValueError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
    return frame[mask]


def sort_table(rows: pd.DataFrame, sort_by: list[dict[str, str]] | None) -> pd.DataFrame:
    """Rows sorted as DataTable's `sort_by` says (columns it does not have are ignored)."""
    cols = [s["column_id"] for s in sort_by or [] if s.get("column_id") in rows.columns]
    if not cols:
        return rows
    asc = [s.get("direction", "asc") == "asc" for s in sort_by or []
           if s.get("column_id") in rows.columns]
    return rows.sort_values(cols, ascending=asc, kind="stable")


def query_table(frame: pd.DataFrame, filter_query: str | None = None,
                sort_by: list[dict[str, str]] | None = None, page: int = 0,
                page_size: int = 50,
                texts: dict[str, pd.Series] | None = None,
                errors: list[str] | None = None) -> tuple[pd.DataFrame, int]:
    """(one page of the filtered, sorted rows, number of matching rows); `errors` as
    for `filter_table`."""
    rows = sort_table(filter_table(frame, filter_query, texts, errors), sort_by)
    total = len(rows)
    page = max(0, int(page or 0))
    return rows.iloc[page * page_size:(page + 1) * page_size], total
