"""Issue 34, item 6: what pipelining's annotations claim (stage, micro-batch) is bounded
before anything is sized by it. The real pipelining fixture with one action renamed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import popviz
from popviz.cli.main import main
from tests.import_fixtures import PIPELINE, trace_json

REPO = Path(__file__).resolve().parents[1]


def renamed(to: Path, old: str, new: str) -> Path:
    """The pipelining fixture with annotation `old` (on the host and the GPU) renamed."""
    doc = trace_json(PIPELINE)
    hits = [e for e in doc["traceEvents"] if e.get("name") == old]
    assert len(hits) == 2
    for event in hits:
        event["name"] = new
    to.write_text(json.dumps(doc))
    return to


@pytest.mark.parametrize(("action", "claim"), [
    ("PP:100000000F0", "claims stage 100,000,000, but a rank of a world of 1 that "
                       "annotates 3 stage(s) runs stages 0..2; refused"),
    ("PP:1000000F0", "claims stage 1,000,000"),
    ("PP:1F1000000", "claims micro-batch 1,000,000, but the trace annotates only 22 "
                     "pipeline actions"),
    ("PP:1F99999999999", "gives micro-batch 99999999999, a number of 11 digits"),
])
def test_a_claimed_stage_or_micro_batch_past_the_trace_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str, claim: str) -> None:
    trace = renamed(tmp_path / "pp.json", "PP:1F0", action)
    out = tmp_path / "out.h5"
    assert main(["import", str(trace), "--to", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"popviz: error: {trace}: annotation '{action}' {claim}" or \
        (err.startswith(f"popviz: error: {trace}: annotation '{action}' ") and claim in err)
    assert "\n" not in err and not out.exists()


def test_the_refusal_comes_before_the_memory(tmp_path: Path) -> None:
    """`PP:100000000F0` took the import to 7.1 GB before "too large": now refused within
    a 3 GiB address space."""
    trace = renamed(tmp_path / "pp.json", "PP:1F0", "PP:100000000F0")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, "
            "resource.RLIM_INFINITY)); from popviz.cli.main import main; "
            f"sys.exit(main(['import', {str(trace)!r}, '--to', "
            f"{str(tmp_path / 'o.h5')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 1 and "claims stage 100,000,000" in done.stderr, done.stderr


def test_a_plausible_stage_still_imports(tmp_path: Path) -> None:
    """A third stage on a one-rank trace (stages 0..2): within what the trace holds."""
    trace = renamed(tmp_path / "pp.json", "PP:1F0", "PP:2F0")
    path = popviz.import_trace([trace], tmp_path / "ok.h5")
    with popviz.open(path) as profile:
        assert profile.trace["stage"].max() == 2
