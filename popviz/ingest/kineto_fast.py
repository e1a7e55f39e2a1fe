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

from popviz.ingest import import_limits as limits
from popviz.ingest import kineto_scan as scan
from popviz.ingest.kineto_launch import DIMENSIONS, LAUNCH_KEYS, dimensions_text, number_text
from popviz.ingest.kineto_scan import NotKineto

try:
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover
    import json

    _loads = json.loads

WHOLE = re.compile(r"^(?:gloo|nccl):(?:send|recv)$|^c10d::")
KEEP_CATS = ("cpu_op", "user_annotation", "gpu_user_annotation", "kernel", "gpu_memcpy",
             "gpu_memset", "cuda_runtime", "cuda_driver")

# key -> column name; each is read once per event (the first occurrence: "name" also
# appears in the args of metadata events, after the event's own)
STRING_KEYS = {b"ph": "ph", b"cat": "cat", b"name": "name", b"tid": "tid",
               b"Collective name": "collective", b"dtype": "dtype"}
NUMBER_KEYS = {b"ts": "ts", b"dur": "dur", b"External id": "ext", b"correlation": "corr",
               b"stream": "stream", b"bytes": "bytes", b"flops": "flops",
               b"In msg nelems": "nelems", b"Src Rank": "src_rank",
               b"Dst Rank": "dst_rank", b"Total Allocated": "allocated",
               b"Device Type": "device_type", b"Device Id": "device_id"}
TEXT_KEYS = {b"Input Dims": "dims",  # nested lists of ints, kept as text
             # a kernel's launch (kineto_launch.LAUNCH_KEYS), each read from its raw text
             **{k.encode(): f"launch{i}" for i, k in enumerate(LAUNCH_KEYS)}}
MILLI = {"ts", "dur"}  # µs in the file, read as ns (3 decimals, exactly)
WANTED = list(dict.fromkeys([b"ph", *STRING_KEYS, *NUMBER_KEYS, *TEXT_KEYS]))  # ph: 0


def _key_table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """A perfect hash of WANTED's first 8 bytes and length: slot -> key index (-1 none),
    with each key's two words and length to confirm a hit."""
    heads = np.array([int.from_bytes(k[:8].ljust(8, b"\0"), "little") for k in WANTED],
                     dtype=np.uint64)
    tails = np.array([int.from_bytes(k[8:16].ljust(8, b"\0"), "little") for k in WANTED],
                     dtype=np.uint64)
    lens = np.array([len(k) for k in WANTED], dtype=np.int64)
    for mult in range(1, 1 << 16, 2):  # the first multiplier that separates them all
        slot = _slot(heads, lens, mult)
        if len(set(slot.tolist())) == len(WANTED):
            table = np.full(1 << 12, -1, dtype=np.int16)
            table[slot] = np.arange(len(WANTED))
            return table, heads, tails, lens, mult
    raise AssertionError("no perfect hash for the wanted keys")  # pragma: no cover


def _slot(head: np.ndarray, length: np.ndarray, mult: int) -> np.ndarray:
    mixed = (head ^ (length.astype(np.uint64) << np.uint64(56))) * np.uint64(
        0x9E3779B97F4A7C15 + 2 * mult)
    return (mixed >> np.uint64(52)).astype(np.int64)


KEY_TABLE = _key_table()
# every wanted key as four little-endian words (a key is at most 32 bytes), to confirm a hit
assert max(len(k) for k in WANTED) <= 32, "a wanted key longer than _key_ids confirms"
KEY_WORDS = [np.array([int.from_bytes(k[8 * i:8 * i + 8].ljust(8, b"\0"), "little")
                       for k in WANTED], dtype=np.uint64) for i in range(4)]


def _key_ids(w: np.ndarray, kstart: np.ndarray, klen: np.ndarray) -> np.ndarray:
    """Index into WANTED of each key (its text from `kstart`, `klen` bytes; -1: not
    wanted): a table look-up on its first word and length, confirmed on both words."""
    table, heads, tails, lens, mult = KEY_TABLE
    head = w[kstart] & scan.LOWB[np.minimum(klen, 8)]
    kid = table[_slot(head, klen, mult)]
    hit = np.flatnonzero(kid >= 0)
    cand = kid[hit]
    ok = (head[hit] == heads[cand]) & (klen[hit] == lens[cand])
    long_ = np.flatnonzero(lens[cand] > 8)  # confirm the rest of the longer keys
    at = hit[long_]
    tail = w[kstart[at] + 8] & scan.LOWB[np.clip(klen[at] - 8, 0, 8)]
    ok[long_] &= tail == tails[cand[long_]]
    # keys past 16 bytes ("est. achieved occupancy %"): their third and fourth words too
    for word in (2, 3):
        more = np.flatnonzero(lens[cand] > 8 * word)
        at = hit[more]
        part = w[kstart[at] + 8 * word] & scan.LOWB[np.clip(klen[at] - 8 * word, 0, 8)]
        ok[more] &= part == KEY_WORDS[word][cand[more]]
    kid[hit[~ok]] = -1
    return kid


def fast_columns(data: bytes, begin: int, end: int) -> dict[str, Any]:
    """Columns of every event between the traceEvents array's `[` (begin) and `]` (end):
    "n" events, `brace` (where each opens), `kind` (the ph byte); per key of STRING_KEYS
    and TEXT_KEYS (codes per event, -1 absent; the distinct raw texts) and of NUMBER_KEYS
    (events, values), or None. Read a few MiB of events at a time: the temporaries stay
    small (in cache, no fresh pages) and the result does not depend on the cuts."""
    arr = np.frombuffer(data, dtype=np.uint8)
    if len(arr) - end < scan.PAD:  # 8-byte loads past the last value stay in the buffer
        arr = np.concatenate([arr, np.zeros(scan.PAD, np.uint8)])
    w = scan.words(arr)
    parts: list[dict[str, Any]] = []
    quotes: list[np.ndarray] = []
    opens: list[np.ndarray] = []
    n = 0
    seen = 0
    for q, o in scan.blocks(arr, begin, end):
        seen += len(o)
        limits.check_event_count(seen)
        quotes.append(q)
        opens.append(o)
        brace = np.concatenate(opens)
        if len(brace) < 2:
            continue
        q = np.concatenate(quotes)
        cut = int(np.searchsorted(q, brace[-1]))  # the last event may go on: keep it
        parts.append(_segment(data, arr, w, q[:cut], brace[:-1], int(brace[-1]), n))
        n += len(brace) - 1
        quotes, opens = [q[cut:]], [brace[-1:]]
    brace = np.concatenate(opens) if opens else np.zeros(0, np.int64)
    if len(brace):
        parts.append(_segment(data, arr, w, np.concatenate(quotes), brace, end, n))
        n += len(brace)
    if n == 0:
        raise NotKineto
    cols: dict[str, Any] = {"n": n, "brace": np.concatenate([p["brace"] for p in parts]),
                            "kind": np.concatenate([p["kind"] for p in parts])}
    for key in WANTED[1:]:
        name = _name(key)
        got = [p[name] for p in parts if p[name] is not None]
        if not got:
            cols[name] = None
        elif key in NUMBER_KEYS:
            cols[name] = (np.concatenate([g[0] for g in got]),
                          np.concatenate([g[1] for g in got]))
        else:
            cols[name] = _merge(got, n)
    return cols


def _merge(got: list[tuple[np.ndarray, np.ndarray, list[bytes]]],
           n: int) -> tuple[np.ndarray, list[bytes]]:
    """Codes per event (-1 absent) into one list of distinct texts, from each segment's
    (events, codes, distinct texts)."""
    codes = np.full(n, -1, dtype=np.int64)
    index: dict[bytes, int] = {}
    for ev, local, uniq in got:
        remap = np.array([index.setdefault(u, len(index)) for u in uniq], dtype=np.int64)
        codes[ev] = remap[local]
    return codes, list(index)


def _segment(data: bytes, arr: np.ndarray, w: np.ndarray, q: np.ndarray,
             brace: np.ndarray, stop: int, first_event: int) -> dict[str, Any]:
    """The columns of the events opening at `brace` (their strings' quotes `q`; the next
    event, or the array's end, at `stop`), numbered from `first_event`."""
    sopen, sclose = q[0::2], q[1::2]
    after = sclose + 1
    after += arr[after] == 32  # `"key": ` or `"key":`
    key = np.flatnonzero(arr[after] == 58)  # index of each key among the strings
    kcolon = after[key]
    kid = _key_ids(w, sopen[key] + 1, (sclose[key] - sopen[key] - 1).astype(np.int64))
    wanted = np.flatnonzero(kid >= 0)
    kid, kcolon, key = kid[wanted], kcolon[wanted], key[wanted]
    n = len(brace)
    # the event of a key: the last top-level `{` before it (torch.profiler writes "ph"
    # first, except in a few trailing instant events: "name" comes first there)
    event = np.searchsorted(brace, sopen[key], side="right") - 1
    if len(event) == 0 or event[0] < 0:
        raise NotKineto  # a key outside the array's objects
    vstart = kcolon.astype(np.int64) + 1
    vstart += arr[vstart] == 32
    ph = np.flatnonzero(kid == 0)
    if not (arr[vstart[ph]] == 34).all():
        raise NotKineto
    kind = np.zeros(n, dtype=np.uint8)  # 0: no "ph" (nothing read)
    at = event[ph]
    first = np.r_[True, at[1:] != at[:-1]] if len(at) else np.zeros(0, bool)
    kind[at[first]] = arr[vstart[ph[first]] + 1]  # an event's first "ph" (not its args')
    # only complete (X) and instant (i) events are read further (flows, metadata and
    # counters are skipped)
    used = (kind == 88) | (kind == 105)
    out: dict[str, Any] = {"brace": brace, "kind": kind}
    sel = np.flatnonzero((kid > 0) & used[event])
    sel = sel[np.argsort(kid[sel], kind="stable")]  # by key, each in file order
    bounds = np.searchsorted(kid[sel], np.arange(len(WANTED) + 1))
    for i, name in enumerate(WANTED[1:], start=1):
        rows = sel[bounds[i]:bounds[i + 1]]
        ev = event[rows]
        first = np.r_[True, ev[1:] != ev[:-1]] if len(ev) else np.zeros(0, bool)
        rows, ev = rows[first], ev[first]
        out[_name(name)] = _values(data, arr, w, name, ev, vstart[rows], key[rows],
                                   sopen, sclose, stop)
        if out[_name(name)] is not None:
            out[_name(name)] = (ev + first_event, *out[_name(name)][1:]) \
                if name not in NUMBER_KEYS else (out[_name(name)][0] + first_event,
                                                 out[_name(name)][1])
    return out


def _name(key: bytes) -> str:
    return STRING_KEYS.get(key) or NUMBER_KEYS.get(key) or TEXT_KEYS[key]


def _values(data: bytes, arr: np.ndarray, w: np.ndarray, key: bytes, ev: np.ndarray,
            start: np.ndarray, string: np.ndarray, sopen: np.ndarray, sclose: np.ndarray,
            stop: int) -> Any:
    """One key's column from its values' positions (`string`: the key's index among the
    strings, so its value, when a string, is the next one): (events, values) of a number,
    (events, codes, distinct raw texts) of a string or text."""
    if len(ev) == 0:
        return None
    first = arr[start]
    if key in NUMBER_KEYS:
        null = first == 110  # null: as if absent, as the general decoder reads it
        if null.any():
            ev, start, first = ev[~null], start[~null], first[~null]
        quoted = first == 34  # a number written as a string ("stream": "7")
        values = np.empty(len(ev), dtype=np.int64)
        plain = np.flatnonzero(~quoted)
        milli = 3 if NUMBER_KEYS[key] in MILLI else 0
        values[plain] = scan.parse_numbers(arr, w, start[plain], milli)
        if quoted.any():
            if milli:
                raise NotKineto
            at = np.flatnonzero(quoted)
            values[at] = scan.parse_numbers(arr, w, start[at] + 1, 0, quoted=True)
        return ev, values
    if key in TEXT_KEYS:  # a list up to the next key's quote, trailing `,` / `}` cut
        nxt = np.minimum(string + 1, len(sopen) - 1)
        ends = np.where(string + 1 < len(sopen), sopen[nxt], stop)
        codes, raw = scan.factorize(data, w, start, ends)
        return ev, codes, raw
    is_str = first == 34
    if not is_str.all():  # a number where a string is usual (tid): its digits as text
        num = np.flatnonzero(~is_str)
        ncodes, nuniq = pd.factorize(scan.parse_numbers(arr, w, start[num], 0))
        text = np.flatnonzero(is_str)
        scodes, suniq = scan.factorize(data, w, sopen[string[text] + 1] + 1,
                                       sclose[string[text] + 1])
        codes = np.empty(len(ev), dtype=np.int64)
        codes[num] = ncodes
        codes[text] = scodes + len(nuniq)
        return ev, codes, [str(v).encode() for v in nuniq.tolist()] + suniq
    codes, uniq = scan.factorize(data, w, sopen[string + 1] + 1, sclose[string + 1])
    return ev, codes, uniq


def _text(raw: bytes) -> str:
    """A JSON string's content (escapes decoded only where there are any); a bad escape
    is for the general decoder to name."""
    if b"\\" not in raw:
        return raw.decode("utf-8", "replace")
    try:
        return _loads(b'"' + raw + b'"')
    except ValueError:  # orjson's and json's decode errors are ValueErrors
        raise NotKineto from None


def _codes(cols: dict[str, Any], name: str, n: int) -> tuple[np.ndarray, list[str]]:
    """Per event: code into the distinct texts of a string key (-1 where absent)."""
    if cols[name] is None:
        return np.full(n, -1, dtype=np.int64), []
    codes, raw = cols[name]
    return codes, [_text(u) for u in raw]


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
    return (pd.Categorical.from_codes(remap[picked], categories=cats)  # type: ignore[call-overload]  # pandas-stubs: categories of a list
            if len(cats) else pd.Categorical([]))


def fast_frames(data: bytes, begin: int, end: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(spans, memory) as kineto.read_general builds them, from the vectorised columns."""
    cols = fast_columns(data, begin, end)
    n = cols["n"]
    cat, cat_u = _codes(cols, "cat", n)
    name, name_u = _codes(cols, "name", n)
    x = cols["kind"] == 88
    keep_cat = np.isin(cat, [i for i, c in enumerate(cat_u) if c in KEEP_CATS])
    rows = np.flatnonzero(x & keep_cat)
    tid, tid_u = _codes(cols, "tid", n)
    start = _numbers(cols, "ts", n, 0)
    dur = np.maximum(_numbers(cols, "dur", n, 0), 0)
    dims = np.full(n, None, dtype=object)  # text: ops only show their shapes
    if cols["dims"] is not None:
        codes, raw = cols["dims"]
        texts = np.array([None, *(r.rstrip(b" \t\r\n,{}").replace(b" ", b"").decode()
                                  for r in raw)], dtype=object)
        dims = texts[codes + 1]
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
        "launch": pd.Series(_launches(cols, rows, cat == (cat_u.index("kernel") if "kernel"
                                                           in cat_u else -2)), dtype=object),
    })
    gpu = spans["cat"].isin(["kernel", "gpu_memcpy", "gpu_memset"]).to_numpy()
    spans.loc[~gpu, "stream"] = -1  # only GPU rows carry a stream / bytes, as read_general
    spans.loc[~gpu, "bytes"] = 0
    op = spans["cat"].isin(["cpu_op", "user_annotation"]).to_numpy()
    spans.loc[~op, "dims"] = None
    mem = np.flatnonzero((cols["kind"] == 105)
                         & (name == (name_u.index("[memory]") if "[memory]" in name_u
                                     else -2)))
    memory = pd.DataFrame({"time": start[mem], "allocated": _numbers(cols, "allocated",
                                                                     n, 0)[mem],
                           "device_type": _numbers(cols, "device_type", n, 0)[mem],
                           "device_id": _numbers(cols, "device_id", n, -1)[mem]})
    return spans, memory


def _launches(cols: dict[str, Any], rows: np.ndarray, kernel: np.ndarray) -> list[Any]:
    """Per row: a kernel's launch tuple (kineto_launch), None for other events or a
    kernel without launch fields, each field read from its raw text as the general
    reader reads the decoded value."""
    fields, present = [], np.zeros(len(rows), dtype=bool)
    for i in range(len(LAUNCH_KEYS)):
        got = cols[f"launch{i}"]
        convert = dimensions_text if i < DIMENSIONS else number_text
        if got is None:
            fields.append(np.full(len(rows), "" if i < DIMENSIONS else np.nan, dtype=object))
            continue
        codes, raw = got
        values = np.array([*(convert(r) for r in raw), "" if i < DIMENSIONS else np.nan],
                          dtype=object)
        picked = codes[rows]
        present |= picked >= 0
        fields.append(values[picked])  # -1 (absent): the last entry
    keep = present & kernel[rows]
    out: list[Any] = [None] * len(rows)
    for j in np.flatnonzero(keep):
        out[j] = (fields[0][j], fields[1][j], *(float(f[j]) for f in fields[2:]))
    return out


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
