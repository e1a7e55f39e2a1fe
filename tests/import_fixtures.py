"""The real H100 recordings the import tests read (copied from ../shared/fixtures/gpu: a
fresh clone has no ../shared), and a helper that imports and opens them."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def imported_profile(paths: list[Path], to: Path, **kwargs: Any) -> Iterator[Any]:
    """For a fixture: import `paths` to `to`, yield the opened profile, close it after."""
    with popviz.open(popviz.import_trace(paths, to, **kwargs)) as profile:
        yield profile
