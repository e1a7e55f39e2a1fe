"""`popviz measure` and `popviz.record` inside a torchrun job spanning two nodes: two
torchrun agents on loopback (c10d rendezvous, one process each, gloo on CPU), each node
with its own folder as separate hosts would have. Every rank records itself; a measured
run's tables reach rank 0 over the job's own process group, never through the other
node's files, and a modelled recording is written by global rank 0 alone."""

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


def _two_agents(tmp_path: Path, *target: str) -> list[str]:
    """Run `target` (torchrun's `-m MODULE ...` or `SCRIPT ...`, `{node}` replaced by the
    agent's number) under two torchrun agents on loopback; their logs, both exit 0."""
    port = _port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / ".shim")]),
           "OMP_NUM_THREADS": "1"}
    agents = []
    for node in (0, 1):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "popviz-test",
                   *(a.replace("{node}", str(node)) for a in target)]
        agents.append(subprocess.Popen(command, env=env, cwd=tmp_path, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        logs = [a.communicate(timeout=90)[0] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
    assert [a.returncode for a in agents] == [0, 0], logs
    return logs


RECORD_SCRIPT = """
import sys
import torch
import torch.distributed as dist
import popviz

dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with popviz.record(popviz.Options(), profile_dir=sys.argv[1], model=model,
                   progress=False) as rec:
    loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1, 0, 1]))
    loss.backward()
    opt.step()
    opt.zero_grad()
print(f"rank {rec.job_rank} of {dist.get_world_size()}: wrote {rec.profile_path}, "
      f"{len(rec.program.ops)} ops")
dist.destroy_process_group()
"""


def test_popviz_record_in_a_two_node_torchrun_job_writes_once(tmp_path: Path) -> None:
    """Every rank of a data-parallel job runs the same step: each records and checks it,
    global rank 0 alone writes the profile (on its own node)."""
    (tmp_path / "step.py").write_text(RECORD_SCRIPT)
    logs = _two_agents(tmp_path, str(tmp_path / "step.py"), str(tmp_path / "node{node}"))
    written = [n for n in (0, 1) if (tmp_path / f"node{n}" / "profile.h5").exists()]
    assert len(written) == 1, logs
    assert "rank 0 of 2: wrote " in logs[written[0]]
    assert "rank 1 of 2: wrote None" in logs[1 - written[0]]
    assert not (tmp_path / f"node{1 - written[0]}").exists()
    with popviz.open(tmp_path / f"node{written[0]}") as p:
        assert p.summary["fits"] and len(p.ops) > 0


def test_two_torchrun_agents_make_one_profile(tmp_path: Path) -> None:
    logs = _two_agents(tmp_path, "-m", "popviz.cli.main", "measure", "--microbatches", "2",
                       "--steps", "1", "--profile-dir", str(tmp_path / "node{node}"))
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
