"""Byte-level primitives of the vectorised Kineto reader (kineto_fast.py): find a JSON
text's strings and check its brackets in one pass, read numbers eight digits at a time,
and give equal strings one code, all with numpy over the file's bytes (no Python object per
value). Anything outside what they handle raises NotKineto: the caller then uses the
general JSON decoder.

Numbers are read with the SWAR trick (eight ASCII digits in one uint64, combined pairwise
by three multiplies), from unaligned 8-byte loads of the file (`words`): a handful of
array operations per column instead of one per digit.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd

from popviz.ingest import import_limits as limits

BLOCK = 4 << 20
ONES = np.uint64(0x0101010101010101)
HIGH = np.uint64(0x8080808080808080)
LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
ZERO = np.uint64(0x3030303030303030)
NIBBLE = np.uint64(0x0F0F0F0F0F0F0F0F)
# TOP[k]: the k highest bytes of a little-endian word (the last k in memory)
TOP = np.array([0] + [((1 << (8 * k)) - 1) << (8 * (8 - k)) for k in range(1, 9)],
               dtype=np.uint64)
# LOWB[k]: the k lowest bytes (the first k in memory)
LOWB = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)
POW10 = 10 ** np.arange(19, dtype=np.int64)
NUMBER_END = np.zeros(256, dtype=bool)  # what may follow a number in JSON
NUMBER_END[[44, 125, 93, 32, 10, 13, 9]] = True
PAD = 40  # bytes past the last value that 8-byte loads may touch
LONG_STRING = 4096  # longer strings are told apart as Python bytes (factorize)


class NotKineto(Exception):
    """The layout is not the one this reader handles; use the general decoder."""


def words(arr: np.ndarray) -> np.ndarray:
    """An unaligned uint64 view starting at every byte: w[i] is bytes i..i+7."""
    return np.ndarray((len(arr) - 7,), dtype="<u8", buffer=arr, strides=(1,))


def blocks(arr: np.ndarray, begin: int, end: int, block: int = BLOCK,
           close: list[int] | None = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(unescaped quotes, events' opening braces) of successive blocks of (begin, end), the
    array's inside, in one pass over its bytes: brackets outside strings must balance and
    never close more than opened, and the array must hold objects only (else the file is
    cut short, or the `]` taken for its end is not: NotKineto, at the latest once the last
    block is out). A string longer than MAX_STRING_BYTES or nesting deeper than MAX_DEPTH
    raises LimitError (import_limits.py) as soon as its block is read. With `close` (a
    list), the scan stops at the bracket that closes the array, appending its position."""
    parity = depth = 0
    braces = 0  # `{` minus `}` outside strings
    carry = 0  # backslashes ending the previous block
    open_at = -1  # where the string still open at the end of the previous block began
    for at in range(begin + 1, end, block):
        stop = min(end, at + block)
        part = arr[at:stop]
        hit = part == 34
        hit |= (part | 32) == 123  # `{` and `[`
        hit |= (part | 32) == 125  # `}` and `]`
        pos = np.flatnonzero(hit) + at
        byte = arr[pos]
        quote = byte == 34
        if carry or (part == 92).any():
            escaped, carry = _escaped(arr, at, stop, pos, quote, carry)
            quote &= ~escaped
        else:
            carry = 0
        seen = np.cumsum(quote) + parity  # quotes so far: odd inside a string
        br = np.flatnonzero(((seen & 1) == 0) & (byte != 34))
        bb = byte[br]
        step = np.where((bb | 32) == 123, 1, -1)
        now = np.cumsum(step) + depth
        if len(now) and now.min() < 0:
            if close is None:
                _check_strings(pos[quote], parity, open_at, stop)
                raise NotKineto
            # the array ends here: only its own strings count (what follows it is the
            # document's, with a limit of its own)
            end_at = int(pos[br[int(np.argmax(now < 0))]])
            _check_strings(pos[quote & (pos < end_at)], parity, open_at, end_at)
            close.append(end_at)
            return
        open_at = _check_strings(pos[quote], parity, open_at, stop)
        parity = int(seen[-1] & 1) if len(seen) else parity
        if len(now):
            if now.max() > limits.MAX_DEPTH:
                raise limits.LimitError(f"traceEvents nests more than {limits.MAX_DEPTH} "
                                        "brackets deep; refused")
            depth = int(now[-1])
        braces += int(np.count_nonzero(bb == 123)) - int(np.count_nonzero(bb == 125))
        opens = pos[br[now - step == 0]]  # opened at the array's own level: events
        if not (arr[opens] == 123).all():
            raise NotKineto  # a list as an element of the array
        yield pos[quote], opens
    if depth or parity or braces:
        raise NotKineto


def _check_strings(quotes: np.ndarray, parity: int, open_at: int, stop: int) -> int:
    """LimitError if a string between these quotes (the first closing the one opened at
    `open_at` when `parity` is odd) or the one left open at `stop` is too long; returns
    where the string left open began (-1: none)."""
    both = np.r_[open_at, quotes] if parity else quotes
    n = len(both) // 2 * 2
    longest = int((both[1:n:2] - both[0:n:2]).max()) if n else 0
    left = int(both[-1]) if len(both) % 2 else -1
    if left >= 0:
        longest = max(longest, stop - left)
    if longest > limits.MAX_STRING_BYTES:
        raise limits.LimitError(f"a string in traceEvents is longer than "
                                f"{limits.MAX_STRING_BYTES:,} bytes; refused")
    return left


def _escaped(arr: np.ndarray, lo: int, hi: int, pos: np.ndarray, quote: np.ndarray,
             carry: int) -> tuple[np.ndarray, int]:
    """Quotes after an odd run of backslashes (escaped inside a string) among `pos` in the
    block [lo, hi), and how many backslashes end the block; `carry`: how many ended the
    block before. Linear in the block: each backslash run is measured once, however long."""
    out = np.zeros(len(pos), dtype=bool)
    slash = np.flatnonzero(arr[lo:hi] == 92) + lo
    first = np.diff(slash, prepend=-2) != 1  # each run's first backslash
    run_start = slash[first][np.cumsum(first) - 1]  # per backslash: where its run began
    run_len = slash - run_start + 1 + np.where(run_start == lo, carry, 0)
    cand = np.flatnonzero(quote & (arr[np.maximum(pos - 1, 0)] == 92))
    if len(cand):
        edge = pos[cand] == lo  # a quote opening the block: the run is all in `carry`
        if edge.any():
            out[cand[edge]] = carry % 2 == 1
            cand = cand[~edge]
        before = np.searchsorted(slash, pos[cand] - 1)  # the backslash just before
        out[cand[run_len[before] % 2 == 1]] = True
    tail = int(run_len[-1]) if len(slash) and slash[-1] == hi - 1 else 0
    return out, tail


def _digits(x: np.ndarray) -> np.ndarray:
    """How many of a word's first bytes (in memory order) are ASCII digits (0..8)."""
    t = x ^ ZERO
    bad = (((t & LOW7) + (ONES * np.uint64(0x76))) | t) & HIGH
    low = bad & (~bad + np.uint64(1))  # lowest non-digit byte's high bit
    _, exp = np.frexp(low.astype(np.float64))
    return np.where(bad == 0, 8, (exp.astype(np.int64) - 8) >> 3)


def _eight(x: np.ndarray) -> np.ndarray:
    """The value of a word of digit values (first byte in memory most significant)."""
    x = (x * np.uint64(10) + (x >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    x = (x * np.uint64(100) + (x >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    x = (x * np.uint64(10000) + (x >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
    return x.astype(np.int64)


def _run(w: np.ndarray, stop: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Value of the `k` (<= 16) digits that end just before `stop`."""
    hi = w[stop - 8] & TOP[np.minimum(k, 8)] & NIBBLE
    lo = w[stop - 16] & TOP[np.clip(k - 8, 0, 8)] & NIBBLE
    return _eight(lo) * 100_000_000 + _eight(hi)


def parse_numbers(arr: np.ndarray, w: np.ndarray, start: np.ndarray, decimals: int,
                  quoted: bool = False) -> np.ndarray:
    """int64 value x 10**decimals (fraction digits past `decimals` truncated) of the JSON
    numbers starting at `start`; NotKineto on exponents, more than 16 integer digits or
    anything that is not a number followed by what may follow one (`"` when `quoted`)."""
    if len(start) == 0:
        return np.zeros(0, dtype=np.int64)
    if start.min() < 16:  # loads reach 16 bytes back (never so early in a trace)
        raise NotKineto
    neg = arr[start] == 45
    s = start + neg
    n0 = _digits(w[s])
    short = bool((n0 < 8).all())  # ids, streams, sizes: one word each
    ilen = n0 if short else n0 + np.where(n0 == 8, _digits(w[s + 8]), 0)
    if (ilen == 0).any() or (ilen > 15).any():
        raise NotKineto
    if short:
        value = _eight(w[s + ilen - 8] & TOP[ilen] & NIBBLE)
    else:
        value = _run(w, s + ilen, ilen)
    stop = s + ilen
    point = arr[stop] == 46
    if point.any():
        at = np.flatnonzero(point)
        f = _digits(w[stop[at] + 1])
        f = f + np.where(f == 8, _digits(w[stop[at] + 9]), 0)
        if (f == 0).any() or (f == 16).any():
            raise NotKineto
        stop[at] += 1 + f
        if decimals:
            k = np.minimum(f, decimals)
            frac = _run(w, stop[at] - f + k, k)
            value[at] = value[at] * POW10[decimals] + frac * POW10[decimals - k]
        point_rows = point
    else:
        point_rows = np.zeros(len(s), dtype=bool)
    if decimals:
        value[~point_rows] *= POW10[decimals]
    end = arr[stop]
    if not (end == 34).all() if quoted else not NUMBER_END[end].all():
        raise NotKineto
    return np.where(neg, -value, value)


def factorize(data: bytes, w: np.ndarray, start: np.ndarray,
              stop: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
    """Codes (first-seen order) of the byte strings data[start:stop] and the distinct ones:
    a fingerprint of every 8-byte word of each string, then every string compared with the
    first one of its fingerprint, so equal codes mean equal bytes."""
    n = len(start)
    if n == 0:
        return np.zeros(0, dtype=np.int64), []
    length = (stop - start).astype(np.int64)
    if int(length.max()) > LONG_STRING:  # one numpy pass per 8 bytes of the longest
        return _factorize_bytes(data, start, stop)
    order = np.argsort(-length, kind="stable")
    ln, st = length[order], start[order].astype(np.int64)
    fp = ln.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    for j, rows in _word_rows(ln):
        word = w[st[:rows] + 8 * j] & LOWB[np.minimum(ln[:rows] - 8 * j, 8)]
        fp[:rows] = (fp[:rows] ^ word) * np.uint64(0xFF51AFD7ED558CCD)
        fp[:rows] ^= fp[:rows] >> np.uint64(29)
    fp_file = np.empty(n, dtype=np.uint64)
    fp_file[order] = fp
    codes, _ = pd.factorize(fp_file)  # first-seen file order
    codes = codes.astype(np.int64)
    seen = np.maximum.accumulate(codes)
    first = np.flatnonzero(np.r_[True, codes[1:] > seen[:-1]])  # each code's first row
    rep = first[codes[order]]
    same = ln == length[rep]
    rep_st = start[rep].astype(np.int64)
    for j, rows in _word_rows(ln):
        mask = LOWB[np.minimum(ln[:rows] - 8 * j, 8)]
        same[:rows] &= (w[st[:rows] + 8 * j] & mask) == (w[rep_st[:rows] + 8 * j] & mask)
    if not same.all():  # a fingerprint collision: exact, the slow way
        return _factorize_bytes(data, start, stop)
    uniques = [data[a:b] for a, b in zip(start[first].tolist(), stop[first].tolist())]
    return codes, uniques


def _word_rows(length: np.ndarray) -> list[tuple[int, int]]:
    """(word index j, rows with a byte in word j) for lengths sorted longest first."""
    longest = int(length[0]) if len(length) else 0
    neg = -length
    return [(j, int(np.searchsorted(neg, -8 * j, side="left")))
            for j in range((longest + 7) // 8)]


def _factorize_bytes(data: bytes, start: np.ndarray,
                     stop: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
    raw = np.empty(len(start), dtype=object)
    raw[:] = [data[a:b] for a, b in zip(start.tolist(), stop.tolist())]
    codes, uniques = pd.factorize(raw)
    return codes.astype(np.int64), list(uniques)
