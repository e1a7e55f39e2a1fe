"""The real H100 recordings the import tests read (copied from ../shared/fixtures/gpu: a
fresh clone has no ../shared), and the fixtures `resnet` and `pipeline`: each imported
once per test module that asks for it (a pytest plugin: tests/conftest.py names it)."""

from __future__ import annotations

import gzip
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import popviz

FIXTURES = Path(__file__).parent / "fixtures"
RESNET = FIXTURES / "kineto_resnet50_b64.json.gz"
PIPELINE = FIXTURES / "kineto_pipelining_interleaved_1rank.json.gz"
SNAPSHOT = FIXTURES / "memsnap_resnet50_b32.pickle.gz"


def trace_json(path: Path) -> dict[str, Any]:
    """A whole trace, read with json and gzip alone (independently of popviz)."""
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz"
                      else path.read_bytes())


def trace_events(path: Path) -> list[dict[str, Any]]:
    return trace_json(path)["traceEvents"]


def snapshot_with_times(to: Path, times_us: np.ndarray) -> Path:
    """The ResNet-50 snapshot with its device events' times replaced (in order)."""
    snap = pickle.loads(gzip.decompress(SNAPSHOT.read_bytes()))
    for event, t in zip(snap["device_traces"][0], times_us):
        event["time_us"] = int(t)
    path = to / "snap.pickle"
    path.write_bytes(pickle.dumps(snap))
    return path


def snapshot_inside_trace(to: Path) -> Path:
    """The snapshot's events spread over the ResNet-50 trace's span, as if taken in the
    same run (the fixtures are of two runs: batch 32 and 64)."""
    trace = trace_json(RESNET)
    base_us = trace["baseTimeNanoseconds"] / 1e3
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
             if e.get("ph") == "X" and isinstance(e.get("pid"), int)]
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    count = len(pickle.loads(gzip.decompress(SNAPSHOT.read_bytes()))["device_traces"][0])
    return snapshot_with_times(to, base_us + np.linspace(lo + 1, hi - 1, count))


def imported_profile(paths: list[Path], to: Path, **kwargs: Any) -> Iterator[Any]:
    """For a fixture: import `paths` to `to`, yield the opened profile, close it after."""
    with popviz.open(popviz.import_trace(paths, to, **kwargs)) as profile:
        yield profile


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The ResNet-50 training step on an H100, imported."""
    yield from imported_profile([RESNET], tmp_path_factory.mktemp("rn"))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The Interleaved 1F1B pipelining step (2 stages on one H100), imported."""
    yield from imported_profile([PIPELINE], tmp_path_factory.mktemp("pp") / "pp.h5")
