"""Shared fixtures. Helpers for building small profiles live in tests/profiles_util.py."""

from __future__ import annotations

import os

# Tests must be deterministic and light on this 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
