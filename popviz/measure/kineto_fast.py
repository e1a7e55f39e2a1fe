"""A vectorised reader for the layout torch.profiler writes, without a Python object per
event: numpy finds every string and key in the file's bytes at once, and the keys popviz
needs are read as columns (numbers parsed digit by digit, strings cut by slicing).

It relies on what Kineto's `export_chrome_trace` always does: every event is an object
whose first key is "ph". When a file breaks that (or anything looks off), `fast_columns`
returns None and the caller uses the general chunked JSON decoder (kineto.py); tests check
that both give the same tables. Keys are found as unescaped `"..."` strings followed by
`:`, which inside a JSON string cannot happen (quotes there are escaped).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

try:
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover
    import json

    _loads = json.loads

WHOLE = re.compile(r"^(?:gloo|nccl):(?:send|recv)$|^c10d::")
KEEP_CATS = ("cpu_op", "user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy",
             "gpu_memset", "cuda_runtime")

WS = np.array([32, 10, 13, 9], dtype=np.uint8)
NUMBER_WIDTH = 24
# key -> column name; each is read once per event (the first occurrence: "name" also
# appears in the args of metadata events, after the event's own)
STRING_KEYS = {b"ph": "ph", b"cat": "cat", b"name": "name", b"tid": "tid",
               b"Collective name": "collective", b"dtype": "dtype"}
NUMBER_KEYS = {b"ts": "ts", b"dur": "dur", b"External id": "ext", b"correlation": "corr",
               b"stream": "stream", b"bytes": "bytes", b"flops": "flops",
               b"In msg nelems": "nelems", b"Src Rank": "src_rank",
               b"Dst Rank": "dst_rank", b"Total Allocated": "allocated",
               b"Device Type": "device_type", b"Device Id": "device_id"}
TEXT_KEYS = {b"Input Dims": "dims"}  # nested lists of ints, kept as text
MILLI = {"ts", "dur"}  # µs in the file, read as ns (3 decimals, exactly)


class NotKineto(Exception):
    """The layout is not the one this reader handles; use the general decoder."""


def _positions(arr: np.ndarray, lo: int, hi: int, *values: int) -> np.ndarray:
    """Positions in [lo, hi) of bytes equal to any of `values`, found in 8 MiB blocks and
    kept as int32 when the file allows: tens of millions of them, without file-sized
    temporaries."""
    kind = np.int32 if len(arr) < 2**31 - 64 else np.int64
    parts = []
    for at in range(lo, hi, 8 << 20):
        part = arr[at:min(hi, at + (8 << 20))]
        hit = part == values[0]
        for v in values[1:]:
            hit |= part == v
        parts.append((np.flatnonzero(hit) + at).astype(kind))
    return np.concatenate(parts) if parts else np.zeros(0, kind)


def _strings(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(open, close) positions of every JSON string."""
    q = _positions(arr, 0, len(arr), 34)
    if len(q) == 0:
        raise NotKineto
    back = arr[np.maximum(q - 1, 0)] == 92
    if back.any():  # a quote after one backslash is escaped (after two it is not)
        back &= arr[np.maximum(q - 2, 0)] != 92
        q = q[~back]
    if len(q) % 2:
        raise NotKineto
    return q[0::2], q[1::2]


def _pack(arr: np.ndarray, at: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Up to 8 bytes from each `at` (fewer where `length` is shorter) as one uint64."""
    m = _rows(arr, at, 8)
    m[np.arange(8) >= length[:, None]] = 0
    return m.view(np.uint64).ravel()


def _rows(arr: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """A (len(at), width) uint8 copy of the bytes from each `at` (zero past the end),
    gathered through a sliding window view: no int64 index matrix."""
    if len(arr) < width:
        arr = np.concatenate([arr, np.zeros(width, np.uint8)])
    window = np.lib.stride_tricks.sliding_window_view(arr, width)
    return window[np.minimum(at, len(arr) - width)]


def _key_ids(arr: np.ndarray, kopen: np.ndarray, klen: np.ndarray,
             wanted: list[bytes]) -> np.ndarray:
    """Index into `wanted` of each key (-1: not wanted): length, first and last 8 bytes."""
    kid = np.full(len(kopen), -1, dtype=np.int16)
    head = _pack(arr, kopen + 1, klen)
    long_ = np.flatnonzero(klen > 8)
    tail = _pack(arr, kopen[long_] + 1 + klen[long_] - 8, np.full(len(long_), 8))
    for i, key in enumerate(wanted):
        k = np.frombuffer(key, np.uint8)
        first = _pack(k, np.zeros(1, np.int64), np.array([len(k)]))[0]
        if len(key) <= 8:
            kid[(klen == len(key)) & (head == first)] = i
            continue
        last = _pack(k, np.array([len(k) - 8]), np.array([8]))[0]
        hit = (klen[long_] == len(key)) & (head[long_] == first) & (tail == last)
        kid[long_[hit]] = i
    return kid


def parse_numbers(arr: np.ndarray, start: np.ndarray, decimals: int) -> np.ndarray:
    """int64 value x 10**decimals (truncated) of the JSON numbers starting at `start`,
    one column of digits at a time; NotKineto on exponents or anything longer."""
    m = len(start)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    mat = _rows(arr, start, NUMBER_WIDTH)
    neg = mat[:, 0] == 45
    value = np.zeros(m, dtype=np.int64)
    places = np.zeros(m, dtype=np.int64)  # fraction digits taken
    state = np.zeros(m, dtype=np.int8)  # 0 integer part, 1 fraction, 2 done
    for j in range(NUMBER_WIDTH):
        c = mat[:, j]
        if j == 0:
            c = np.where(neg, 48, c)  # the sign: read as a leading zero
        digit = (c >= 48) & (c <= 57)
        d = c.astype(np.int64) - 48
        take = digit & ((state == 0) | ((state == 1) & (places < decimals)))
        value = np.where(take, value * 10 + d, value)
        places += take & (state == 1)
        point = (c == 46) & (state == 0)
        done = ~digit & ~point & (state < 2)
        if (done & ((c == 101) | (c == 69))).any():
            raise NotKineto  # an exponent
        state = np.where(point, 1, np.where(done, 2, state)).astype(np.int8)
    if (state < 2).any():
        raise NotKineto
    value = value * 10 ** (decimals - places)
    return np.where(neg, -value, value)


def fast_columns(data: bytes, begin: int, end: int) -> dict[str, Any]:
    """Columns of every event between the traceEvents array's `[` (begin) and `]` (end):
    for each key of STRING_KEYS / NUMBER_KEYS / TEXT_KEYS an array over events (None /
    -1 / 0 where absent), and `brace`: where each event's object opens."""
    arr = np.frombuffer(data, dtype=np.uint8)
    sopen, sclose = _strings(arr)
    _check_balanced(arr, begin, end, sopen, sclose)
    after = arr[np.minimum(sclose + 1, len(arr) - 1)]
    spaced = after == 32
    colon = np.where(spaced, np.minimum(sclose + 2, len(arr) - 1), sclose + 1)
    is_key = (arr[colon] == 58) & (sopen > begin) & (sopen < end)
    kopen, kclose, kcolon = sopen[is_key], sclose[is_key], colon[is_key]
    del after, spaced, colon, is_key  # file-sized temporaries: free before the next ones
    wanted = [b"ph", *STRING_KEYS, *NUMBER_KEYS, *TEXT_KEYS]  # "ph" first: kid 0
    wanted = list(dict.fromkeys(wanted))
    kid = _key_ids(arr, kopen, kclose - kopen - 1, wanted)
    del kclose
    ph = kopen[kid == 0]
    if len(ph) == 0:
        raise NotKineto
    # every event opens with "ph": the byte before it (past whitespace) must be `{`
    brace = ph - 1
    for _ in range(16):
        ws = np.isin(arr[brace], WS)
        if not ws.any():
            break
        brace = brace - ws
    if not (arr[brace] == 123).all():
        raise NotKineto
    n = len(ph)
    # keys are in file order and each event starts with "ph"
    event = np.cumsum(kid == 0, dtype=np.int32) - 1
    vstart = kcolon + 1
    vstart = vstart + (arr[np.minimum(vstart, len(arr) - 1)] == 32)
    # the event's kind is the byte after "ph": "; only complete (X) and instant (i)
    # events are read further (flows, metadata and counters are skipped)
    kind = arr[np.minimum(vstart[kid == 0] + 1, len(arr) - 1)]
    used = np.isin(kind, np.frombuffer(b"Xi", np.uint8))
    cols: dict[str, Any] = {"n": n, "brace": brace,
                            "ph": (np.arange(n), [bytes([k]) for k in kind.tolist()])}
    keep = np.flatnonzero(kid > 0)  # one pass: wanted keys of X / i events, by key
    keep = keep[(event[keep] >= 0) & used[np.maximum(event[keep], 0)]]
    keep = keep[np.argsort(kid[keep], kind="stable")]
    bounds = np.searchsorted(kid[keep], np.arange(len(wanted) + 1))
    for i, key in enumerate(wanted):
        if key == b"ph":
            continue
        sel = keep[bounds[i]:bounds[i + 1]]
        if len(sel) == 0:
            cols[_name(key)] = None
            continue
        ev, first = np.unique(event[sel], return_index=True)
        sel = sel[first]
        cols[_name(key)] = (ev, _values(data, arr, key, vstart[sel], sopen, sclose))
    return cols


def _check_balanced(arr: np.ndarray, begin: int, end: int, sopen: np.ndarray,
                    sclose: np.ndarray) -> None:
    """Brackets outside strings balance between the array's `[` and `]`: else the file is
    cut short or the `]` taken for the array's end is not it (NotKineto: the general
    decoder then names the problem)."""
    for a, b in ((123, 125), (91, 93)):
        pos = _positions(arr, begin + 1, end, a, b)
        last = np.searchsorted(sopen, pos, side="right") - 1
        inside = (last >= 0) & (sclose[np.maximum(last, 0)] > pos)
        pos = pos[~inside]
        depth = np.cumsum(np.where(arr[pos] == a, 1, -1))
        if len(depth) and (depth[-1] != 0 or depth.min() < 0):
            raise NotKineto


def _name(key: bytes) -> str:
    return STRING_KEYS.get(key) or NUMBER_KEYS.get(key) or TEXT_KEYS[key]


def _values(data: bytes, arr: np.ndarray, key: bytes, start: np.ndarray,
            sopen: np.ndarray, sclose: np.ndarray) -> Any:
    if key in NUMBER_KEYS:
        quoted = arr[start] == 34  # a number written as a string ("tid": "12")
        start = start + quoted
        return parse_numbers(arr, start, 3 if NUMBER_KEYS[key] in MILLI else 0)
    if key in TEXT_KEYS:  # a list up to the next key's quote, trailing `,` / `}` cut
        nxt = sopen[np.minimum(np.searchsorted(sopen, start), len(sopen) - 1)]
        return [data[a:b].rstrip(b" \t\r\n,{}").replace(b" ", b"").decode()
                for a, b in zip(start.tolist(), nxt.tolist())]
    is_str = arr[start] == 34
    out = np.empty(len(start), dtype=object)
    if not is_str.all():  # a number where a string is usual (tid): its digits as text
        num = np.flatnonzero(~is_str)
        out[num] = [str(v).encode() for v in parse_numbers(arr, start[num], 0).tolist()]
    text = np.flatnonzero(is_str)
    close = sclose[np.minimum(np.searchsorted(sopen, start[text]), len(sclose) - 1)]
    out[text] = [data[a:b] for a, b in zip((start[text] + 1).tolist(), close.tolist())]
    return out


def _text(raw: bytes) -> str:
    """A JSON string's content (escapes decoded only where there are any)."""
    return _loads(b'"' + raw + b'"') if b"\\" in raw else raw.decode("utf-8", "replace")


def _codes(cols: dict[str, Any], name: str, n: int) -> tuple[np.ndarray, list[str]]:
    """Per event: code into the distinct texts of a string key (-1 where absent)."""
    codes = np.full(n, -1, dtype=np.int64)
    if cols[name] is None:
        return codes, []
    ev, raw = cols[name]
    c, uniques = pd.factorize(np.asarray(raw, dtype=object))
    codes[ev] = c
    return codes, [_text(u) for u in uniques]


def _numbers(cols: dict[str, Any], name: str, n: int, default: int) -> np.ndarray:
    out = np.full(n, default, dtype=np.int64)
    if cols[name] is not None:
        out[cols[name][0]] = cols[name][1]
    return out


def _categorical(codes: np.ndarray, uniques: list[str], rows: np.ndarray,
                 absent: str = "") -> pd.Categorical:
    """Categorical of `rows` of a string column, `absent` where the key was missing."""
    picked = codes[rows]
    cats = list(dict.fromkeys([*uniques, absent]))
    where = {c: i for i, c in enumerate(cats)}
    remap = np.array([where[u] for u in uniques] + [where[absent]], dtype=np.int64)
    return pd.Categorical.from_codes(remap[picked], categories=cats) if len(cats) \
        else pd.Categorical([])


def fast_frames(data: bytes, begin: int, end: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(spans, memory) as kineto.read_general builds them, from the vectorised columns."""
    cols = fast_columns(data, begin, end)
    n = cols["n"]
    ph, ph_u = _codes(cols, "ph", n)
    cat, cat_u = _codes(cols, "cat", n)
    name, name_u = _codes(cols, "name", n)
    x = ph == (ph_u.index("X") if "X" in ph_u else -2)
    keep_cat = np.isin(cat, [i for i, c in enumerate(cat_u) if c in KEEP_CATS])
    rows = np.flatnonzero(x & keep_cat)
    tid, tid_u = _codes(cols, "tid", n)
    start = _numbers(cols, "ts", n, 0)
    dur = np.maximum(_numbers(cols, "dur", n, 0), 0)
    dims = np.full(n, None, dtype=object)  # text: ops only show their shapes
    if cols["dims"] is not None:
        dims[cols["dims"][0]] = cols["dims"][1]
    whole = _whole_events(data, cols, rows, name, name_u, end)
    coll, coll_u = _codes(cols, "collective", n)
    dtype, dtype_u = _codes(cols, "dtype", n)
    dtype_text = np.array([*dtype_u, ""], dtype=object)[dtype]
    spans = pd.DataFrame({
        "cat": _categorical(cat, cat_u, rows), "name": _categorical(name, name_u, rows),
        "tid": _categorical(tid, tid_u, rows), "start": start[rows],
        "end": start[rows] + dur[rows],
        "ext": _numbers(cols, "ext", n, -1)[rows], "corr": _numbers(cols, "corr", n, -1)[rows],
        "stream": _numbers(cols, "stream", n, -1)[rows],
        "bytes": _numbers(cols, "bytes", n, 0)[rows],
        "flops": _numbers(cols, "flops", n, 0)[rows],
        "dims": pd.Series(np.where(whole["dims"] != None, whole["dims"],  # noqa: E711
                                   dims[rows]), dtype=object),
        "types": pd.Series(whole["types"], dtype=object),
        "concrete": pd.Series(whole["concrete"], dtype=object),
        "collective": _categorical(coll, coll_u, rows),
        "nelems": _numbers(cols, "nelems", n, 0)[rows], "dtype": dtype_text[rows],
        "src_rank": _numbers(cols, "src_rank", n, -1)[rows],
        "dst_rank": _numbers(cols, "dst_rank", n, -1)[rows],
    })
    gpu = spans["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"]).to_numpy()
    spans.loc[~gpu, "stream"] = -1  # only GPU rows carry a stream / bytes, as read_general
    spans.loc[~gpu, "bytes"] = 0
    op = spans["cat"].isin(["cpu_op", "user_annotation"]).to_numpy()
    spans.loc[~op, "dims"] = None
    mem = np.flatnonzero((ph == (ph_u.index("i") if "i" in ph_u else -2))
                         & (name == (name_u.index("[memory]") if "[memory]" in name_u
                                     else -2)))
    memory = pd.DataFrame({"time": start[mem], "allocated": _numbers(cols, "allocated",
                                                                     n, 0)[mem],
                           "device_type": _numbers(cols, "device_type", n, 0)[mem],
                           "device_id": _numbers(cols, "device_id", n, -1)[mem]})
    return spans, memory


def _whole_events(data: bytes, cols: dict[str, Any], rows: np.ndarray, name: np.ndarray,
                  name_u: list[str], end: int) -> dict[str, np.ndarray]:
    """Input shapes, types and concrete inputs as lists for the few rows whose whole event
    is needed (gloo / nccl p2p annotations, c10d calls), decoded one by one."""
    wanted = [i for i, u in enumerate(name_u) if WHOLE.match(u)]
    need = np.flatnonzero(np.isin(name[rows], wanted))
    out = {k: np.full(len(rows), None, dtype=object) for k in ("dims", "types", "concrete")}
    brace = cols["brace"]
    stops = np.append(brace[1:], end)
    for i in need.tolist():
        e = int(rows[i])
        args = _loads(data[brace[e]:stops[e]].rstrip(b" \t\r\n,")).get("args") or {}
        out["dims"][i] = args.get("Input Dims")
        out["types"][i] = args.get("Input type")
        out["concrete"][i] = args.get("Concrete Inputs")
    return out
