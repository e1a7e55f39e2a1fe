"""Seeded fuzzing in the suite (issue 10): mutants of two small profiles, each read in a
forked worker with a 10 s time limit and 1.5 GB more address space (popviz.open, every
table, each IPU's trace, a tile-liveness slice, the summary facts).

Asserted: no exception but ProfileError escapes the reader, nothing runs out of memory,
and every mutant gets a verdict, so a crash or hang inside libhdf5 (which no in-process
code can stop) is caught by the worker guard. The counts are printed (`pytest -s`);
bench/bench_fuzz.py runs thousands over the bundled profiles.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import popviz.analysis.facts  # noqa: F401 - imported before forking, so workers start warm
from popviz.format import write_report
from tests.profiles_util import to_format_1_0
from tests.test_format import write_tiny
from tooling.testing.fuzz import run_campaign
from tooling.testing.synthetic import synthetic_report


def _own_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


MUTANTS = int(os.environ.get("POPVIZ_FUZZ_MUTANTS", "200"))
SEED = 20261123


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("fuzz")
    small = write_report(synthetic_report(num_ipus=2, events=200, steps=20, num_ops=20,
                                          target="mk1"), root / "small")
    tiny = write_tiny(root / "tiny")
    legacy = to_format_1_0(write_tiny(root / "legacy.h5"))  # 1.0: vlen strings
    return [small, tiny, legacy]


def test_mutants_end_in_profile_error_or_a_caught_crash(sources: list[Path]) -> None:
    campaign = run_campaign(sources, MUTANTS, seed=SEED, workers=2, timeout_s=10,
                            memory_bytes=1_500_000_000,
                            probe="popviz.analysis.facts:profile_facts")
    counts = campaign.outcomes
    print(f"\nfuzz: {MUTANTS} mutants: {dict(counts)}; worker peak RSS "
          f"{campaign.max_rss_bytes / 2**20:.0f} MiB")
    for label, kind, verdict in campaign.examples:
        print(f"  {verdict.outcome:6} {kind:22} {label}: {verdict.message}")
    assert sum(counts.values()) == MUTANTS  # every mutant got a verdict
    escapes = [e for e in campaign.examples if e[2].outcome == "error"]
    assert not escapes, f"exceptions other than ProfileError: {escapes[:5]}"
    assert counts["memory"] == 0
    assert counts["profile_error"] >= MUTANTS // 4  # the mutants do damage
    # a forked worker's RSS counts the pages it shares with this process (large late in
    # the suite): what the limit bounds is its growth past them
    assert campaign.max_rss_bytes < _own_rss_bytes() + 1_500_000_000
    for _, _, verdict in campaign.examples:  # crashes and hangs: caught, with their cause
        assert verdict.outcome in ("crash", "hang")
        assert verdict.signal is not None or "worker" in verdict.message
