"""`popviz measure` inside a torchrun job spanning two nodes: two torchrun agents on
loopback (c10d rendezvous, one process each, gloo on CPU), each node with its own folder
as separate hosts would have. Every rank records itself; the tables reach rank 0 over the
job's own process group, never through the other node's files."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import popviz

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_torchrun_agents_make_one_profile(tmp_path: Path) -> None:
    port = _port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / ".shim")]),
           "OMP_NUM_THREADS": "1"}
    agents = []
    for node in (0, 1):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "popviz-test",
                   "-m", "popviz.cli.main", "measure", "--microbatches", "2",
                   "--steps", "1", "--profile-dir", str(tmp_path / f"node{node}")]
        agents.append(subprocess.Popen(command, env=env, cwd=tmp_path, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        logs = [a.communicate(timeout=90)[0] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
    assert [a.returncode for a in agents] == [0, 0], logs
    # which agent's worker became rank 0 is the rendezvous' choice: that node writes
    written = [n for n in (0, 1) if (tmp_path / f"node{n}" / "profile.h5").exists()]
    assert len(written) == 1, logs
    home, other = tmp_path / f"node{written[0]}", tmp_path / f"node{1 - written[0]}"
    assert f"wrote {home / 'profile.h5'}" in logs[written[0]]
    # each node holds only its own rank's trace; the other node wrote no profile
    assert [p.name for p in (home / "traces").iterdir()] == ["rank0.json"]
    assert sorted(p.relative_to(other).as_posix() for p in other.rglob("*")
                  if p.is_file()) == ["traces/rank1.json"]
    with popviz.open(home) as p:
        assert p.meta["measure"]["ranks"] == [0, 1] and p.meta["measure"]["live"]
        assert len(p.meta["measure"]["hosts"]) == 2
        assert sorted(p.trace["ipu"].unique()) == [0, 1]
        p2p = p.table("p2p")
        assert len(p2p) == 4 * 2 and p2p["matched"].all()  # 2 micro-batches, F and B
        assert p.summary["throughput"] > 0
