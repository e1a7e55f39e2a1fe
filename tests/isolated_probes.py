"""Probes for tests/test_isolated.py: each misbehaves the way a damaged file makes libhdf5
misbehave, so the worker guard can be tested without hunting for such a file."""

from __future__ import annotations

import ctypes
import time
from typing import Any


def segfault(profile: Any) -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV, as libhdf5 does on some flipped bytes


def loop_forever(profile: Any) -> None:
    while True:  # as libhdf5 on a damaged heap: never returns
        time.sleep(0.01)


def allocate(profile: Any) -> None:
    blocks = [bytearray(256 << 20) for _ in range(64)]  # 16 GiB, far past any limit
    del blocks


def raise_type_error(profile: Any) -> None:
    raise TypeError("a bug, not a bad file")
