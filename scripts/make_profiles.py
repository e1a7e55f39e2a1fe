#!/usr/bin/env python
"""Regenerate the example profiles in profiles/ (`make profiles`).

Every run uses train.py's --plan-only (the recorder's fake-tensor mode): full-size models
record in seconds without computing, and with no measured host times in them the files
hold the same tables on every run. The commands are Graphcore's published ones
(docs/hardware.md) plus --plan-only --profile --profile-dir.

    python scripts/make_profiles.py [--out profiles] [--only rn50_pipeline ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RN50_CHECKPOINTS = ["b1/0/relu", "b1/2/relu", "b2/0/relu", "b2/2/relu", "b3/0/relu",
                    "b3/3/relu"]

# profile folder -> train.py arguments
PROFILES: dict[str, list[str]] = {
    # PopTorch tutorial defaults; training/ and inference/ (the test pass)
    "tutorial_pipelined": ["--strategy", "pipelined"],
    "tutorial_sharded": ["--strategy", "sharded"],
    # ResNet-50, 4-stage pipeline (published benchmark command)
    "rn50_pipeline": [
        "--model", "resnet", "--model-size", "50", "--batch-size", "16", "--shards", "4",
        "--pipeline", "--pipeline-splits", "b1/2/relu", "b2/3/relu", "b3/3/relu",
        "--pipeline-schedule", "Grouped", "--gradient-accumulation-count", "1024",
        "--enable-recomputation", "--available-memory-proportion", "0.15",
        "--precision", "16.32", "--enable-half-partials",
        # mk2_resnet50_bn_16ipus's base configuration sets stable_norm
        "--stable-norm"],
    # ResNet-50 on one IPU with the six published recomputation checkpoints, micro-batch 20,
    # FP16, half partials, AMP 0.15 (the MLPerf v1.1 configuration, one replica)
    "rn50_recompute": [
        "--model", "resnet", "--model-size", "50", "--batch-size", "20", "--shards", "1",
        "--pipeline-splits", *RN50_CHECKPOINTS, "--enable-recomputation",
        "--gradient-accumulation-count", "16", "--available-memory-proportion", "0.15",
        "--precision", "16.16", "--enable-half-partials"],
    # EfficientNet-B4 at its native 380x380, 4-stage pipeline (published benchmark command)
    "effnet_b4_pipeline": [
        "--model", "efficientnet", "--model-size", "4", "--batch-size", "5", "--shards", "4",
        "--pipeline", "--pipeline-split", "block2c", "block4c", "block6a",
        "--gradient-accumulation-count", "40", "--enable-recomputation",
        "--available-memory-proportion", "0.15", "--precision", "16.32"],
    # ResNeXt-101 (32x4d) bulk inference on a Mk1 C2 card: one session per IPU, total
    # batch = micro-batch 4 x 2 IPUs
    "resnext101_inference_mk1": [
        "--model", "resnext", "--model-size", "101", "--inference", "--batch-size", "8",
        "--num-ipus", "2", "--target", "mk1", "--precision", "16.16"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "profiles"), help="output folder")
    parser.add_argument("--only", nargs="+", choices=sorted(PROFILES), help="a subset")
    args = parser.parse_args(argv)
    out = Path(args.out)
    for name in args.only or PROFILES:
        target = out / name
        # a fresh folder, so a profile that a run no longer writes cannot linger
        shutil.rmtree(target, ignore_errors=True)
        # relative to the repo, so the command line stored in the profile is portable
        where = os.path.relpath(target, ROOT)
        cmd = [sys.executable, "train.py", *PROFILES[name], "--plan-only", "--quiet",
               "--profile", "--profile-dir", where]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(), check=False)
        if proc.returncode:
            print(f"make_profiles: {name} failed (exit {proc.returncode})", file=sys.stderr)
            return proc.returncode
        size = sum(p.stat().st_size for p in target.rglob("*.h5"))
        print(f"{name}: {size / 1e6:.2f} MB in {time.perf_counter() - start:.1f} s")
    return 0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


if __name__ == "__main__":
    sys.exit(main())
