"""The byte-level primitives of the vectorised Kineto reader, against Python's own parsing."""

from __future__ import annotations

import json
import random
import time
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from popviz.ingest import import_limits as limits
from popviz.ingest import kineto, kineto_fast
from popviz.ingest import kineto_scan as scan


def _buffer(texts: list[str]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """`texts` as JSON values of a list, with each one's start."""
    head = b'{"traceEvents": ['  # 8-byte loads reach back up to 16 bytes
    body = head + b", ".join(t.encode() for t in texts) + b"]" + b" " * scan.PAD
    starts, at = [], len(head)
    for t in texts:
        starts.append(at)
        at += len(t.encode()) + 2
    return body, np.frombuffer(body, np.uint8), np.array(starts, dtype=np.int64)


@pytest.mark.parametrize("decimals", [0, 3])
def test_numbers_read_eight_digits_at_a_time_equal_python(decimals: int) -> None:
    rng = np.random.default_rng(1)
    texts = ["0", "-7", "12345678", "123456789", "999999999999999", "4561953772008.644",
             "4561953772008.6", "1.23456", "-0.5", "42.0"]
    texts += [str(int(v)) for v in rng.integers(0, 10**15, 200)]
    texts += [f"{v:.3f}" for v in rng.uniform(-1e9, 1e9, 200)]
    _, arr, start = _buffer(texts)
    got = scan.parse_numbers(arr, scan.words(arr), start, decimals)
    want = [int(Decimal(t).scaleb(decimals).to_integral_value(rounding="ROUND_DOWN"))
            for t in texts]
    assert got.tolist() == want


@pytest.mark.parametrize("bad", ["1e5", "1.5E3", "12345678901234567", "-", "1.", "true",
                                 "12x"])
def test_what_is_not_a_plain_number_goes_to_the_general_decoder(bad: str) -> None:
    _, arr, start = _buffer(["1", bad, "2"])
    with pytest.raises(scan.NotKineto):
        scan.parse_numbers(arr, scan.words(arr), start, 3)


def test_factorize_gives_equal_codes_to_equal_bytes_only() -> None:
    rng = np.random.default_rng(2)
    long_a = "void kernel<" + "x" * 40 + "A" + "y" * 40 + ">"
    long_b = long_a.replace("A", "B")  # differs in the middle only
    pool = ["", "a", "ab", "abcdefgh", "abcdefghi", "cpu_op", "kernel", long_a, long_b,
            "user_annotation", "gpu_memcpy"]
    texts = [json.dumps(pool[i]) for i in rng.integers(0, len(pool), 500)]
    data, arr, start = _buffer(texts)
    stop = start + np.array([len(t) for t in texts]) - 1
    codes, uniques = scan.factorize(data, scan.words(arr), start + 1, stop)
    assert [uniques[c].decode() for c in codes] == [json.loads(t) for t in texts]
    assert len(set(uniques)) == len(uniques)
    assert uniques == list(pd.unique(pd.Series([json.loads(t).encode() for t in texts])))


def test_escaped_quotes_and_backslashes_read_as_the_json_decoder(tmp_path: Path) -> None:
    names = ['say "hi"', "back\\slash\\", 'a\\"b', "é ü", "x},{y", "[nested]"]
    events = [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": 10.5 + i,
               "dur": 1.25, "args": {"External id": i, "Input Dims": [[2, i]]}}
              for i, n in enumerate(names * 3)]
    events.insert(2, {"name": "first", "ph": "i", "s": "g", "pid": 1, "tid": 1, "ts": 11})
    path = tmp_path / "escapes.json"
    path.write_text(json.dumps({"traceEvents": events, "baseTimeNanoseconds": 0}))
    data = kineto.read_bytes(path)
    begin = kineto._KEY.search(data).end() - 1
    spans, _ = kineto_fast.fast_frames(data, begin, kineto.array_end(data, begin, path)[0])
    general, _, _ = kineto.read_general(data, path)
    assert spans["name"].astype(str).tolist() == general["name"].astype(str).tolist()
    assert spans["start"].tolist() == general["start"].tolist()
    assert [json.loads(d) for d in spans["dims"]] == general["dims"].tolist()


def test_a_cut_or_unbalanced_array_is_not_read_by_the_vectorised_reader() -> None:
    good = b'{"traceEvents": [{"ph": "X", "name": "a", "args": {"x": [1]}}], "y": 1}'
    begin = good.index(b"[")
    end = good.rindex(b"]")
    arr = np.frombuffer(good + b" " * scan.PAD, np.uint8)
    assert len(list(scan.blocks(arr, begin, end))) == 1
    for bad in (good.replace(b"[1]", b"[1"), good.replace(b'"a"', b'"a')):
        arr = np.frombuffer(bad + b" " * scan.PAD, np.uint8)
        with pytest.raises(scan.NotKineto):
            list(scan.blocks(arr, bad.index(b"["), bad.rindex(b"]")))


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, scan.BLOCK])
def test_escaped_quotes_are_found_across_any_block_cut(block: int) -> None:
    rng = random.Random(block)
    names = ["".join(rng.choice('\\"a{}[],') for _ in range(rng.randint(0, 12)))
             for _ in range(40)]
    data = json.dumps({"traceEvents": [{"ph": "X", "name": n} for n in names]}).encode()
    arr = np.frombuffer(data + b" " * scan.PAD, np.uint8)
    found = list(scan.blocks(arr, data.index(b"["), data.rindex(b"]"), block=block))
    quotes = np.concatenate([q for q, _ in found])
    assert len(np.concatenate([o for _, o in found])) == len(names)
    # every string's two quotes, none escaped: the strings between them are the names
    texts = [json.loads(data[a:b + 1]) for a, b in zip(quotes[0::2], quotes[1::2])]
    assert texts == [t for n in names for t in ("ph", "X", "name", n)]


def test_a_long_backslash_run_is_scanned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_STRING_BYTES", 64 << 20)
    for run in (10 << 20, (10 << 20) + 1):  # even: the quote ends it; odd: escaped
        body = b'"' + b"\\" * run + b'"' + (b'"' if run % 2 else b"")
        data = b'{"traceEvents": [{"name": ' + body + b"}]}"
        arr = np.frombuffer(data + b" " * scan.PAD, np.uint8)
        began = time.monotonic()
        found = list(scan.blocks(arr, data.index(b"["), data.rindex(b"]")))
        assert time.monotonic() - began < 5  # was one numpy step per backslash: minutes
        assert len(np.concatenate([q for q, _ in found])) == 4
