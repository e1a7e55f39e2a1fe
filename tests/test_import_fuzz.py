"""Seeded import fuzzing in the suite (issue 22): mutants of small slices of the real H100
trace and snapshot fixtures, each imported by `popviz import` in a forked worker with a
20 s limit and 3 GB more address space (tooling.import_fuzz).

Asserted: no traceback, hang or crash; every failure is one line naming the file (exit 1)
and leaves nothing in the output folder; every profile written opens and reads whole; no
worker passes 1 GiB resident. bench/bench_fuzz_import.py runs thousands.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.import_fixtures import PIPELINE, RESNET, SNAPSHOT
from tooling import import_fuzz

MUTANTS = int(os.environ.get("POPVIZ_IMPORT_FUZZ_MUTANTS", "200"))
SEED = 20261125


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[Path]]:
    root = tmp_path_factory.mktemp("import-fuzz")
    traces = [import_fuzz.small_trace(PIPELINE, root / "pipeline.json", every=3, limit=800),
              import_fuzz.small_trace(RESNET, root / "resnet.json", every=40, limit=800)]
    return traces, [import_fuzz.small_snapshot(SNAPSHOT, root / "snapshot.pickle")]


def test_sources_import_as_they_are(sources: tuple[list[Path], list[Path]],
                                    tmp_path: Path) -> None:
    traces, snapshots = sources
    for k, trace in enumerate(traces):
        result = import_fuzz.import_isolated(
            [str(trace), "--memory-snapshot", str(snapshots[0])],
            [trace.name, snapshots[0].name],
            tmp_path / f"out{k}", timeout_s=60, memory_bytes=3 << 30)
        assert result.outcome == "ok", result.message


def test_mutants_end_in_a_profile_or_one_line(sources: tuple[list[Path], list[Path]]
                                              ) -> None:
    traces, snapshots = sources
    campaign = import_fuzz.run_campaign(traces, snapshots, MUTANTS, seed=SEED, workers=2)
    counts = campaign.outcomes
    print(f"\nimport fuzz: {MUTANTS} mutants: {dict(counts)}; rss over 1 GiB "
          f"{campaign.rss_over}; leftovers {campaign.leftovers}; worker peak RSS "
          f"{campaign.max_rss / 2**20:.0f} MiB")
    for kind, result in campaign.examples:
        print(f"  {result.outcome:10} {kind:28} {result.message[:200]} {result.leftovers}")
    assert sum(counts.values()) == MUTANTS
    bad = [(k, r.outcome, r.message) for k, r in campaign.examples
           if r.outcome not in ("ok", "error")]
    assert not bad, bad[:5]
    assert campaign.rss_over == 0 and campaign.leftovers == 0
    # the mutants do damage, and many still import
    assert counts["error"] >= MUTANTS // 4 and counts["ok"] >= MUTANTS // 10
