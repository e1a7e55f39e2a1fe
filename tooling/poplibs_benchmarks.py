"""PopLibs' own layer benchmarks, extracted from its history (graphcore/poplibs): each
convolution and fully connected layer that `tests/CMakeLists.txt` ran through
`single_conv_layer` / `fully_connected_layer` on the IPU models (IpuModel1: Mk1, 1,216
tiles; IpuModel2: Mk2, 1,472 tiles), with the cycles `tests/benchmark_results.csv` pinned
for it: Poplar's cycle estimate of the whole program (forward, input gradient, weight
gradient and its update; half data, no bias) as PopLibs planned and ran it, the last
version before the benchmarks were removed (commit 3a650a11's parent, 2021-03-16).

    python tooling/poplibs_benchmarks.py /work/.mirror/graphcore+poplibs/repo

writes tooling/poplibs_benchmarks.json (which bench/bench_poplibs_layers.py reads).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

COMMIT = "8dcde1ec43c7463babb57c1cc3800d0ae4076078"
OUT = Path(__file__).with_name("poplibs_benchmarks.json")
TOOLS = {"add_conv_benchmark": "single_conv_layer", "add_fc_benchmark": "fully_connected_layer"}
BLOCK = re.compile(r"(add_conv_benchmark|add_fc_benchmark)\(NAME\s+(\S+)\s+PARAMS(.*?)\)\s*$",
                   re.S | re.M)


def _git_show(repo: Path, path: str) -> str:
    return subprocess.run(["git", "--git-dir", str(repo), "show", f"{COMMIT}:{path}"],
                          check=True, capture_output=True, text=True).stdout


def _params(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for flag, value in re.findall(r"--([a-z-]+)[ =]?(\S*)", text):
        out[flag] = value
    return out


def _loops() -> list[tuple[str, str, dict[str, str]]]:
    """The two blocks CMake generates in loops (expanded as tests/CMakeLists.txt does)."""
    rows = []
    for dtype in ("half", "float"):
        for bs in (1, 4, 8, 16):
            for out in (1000, 5):
                rows.append((f"fc_layer_{bs}_1000_{out}_{dtype}", "fully_connected_layer",
                             {"batch-size": str(bs), "input-size": "1000",
                              "output-size": str(out), "data-type": dtype}))
    for h, k, fx in ((768, 12, 3072), (1024, 16, 4096)):
        for s in (128, 384, 512):
            fc = "fully_connected_layer"
            rows += [(f"bert_kqv_{s}x{h}x{3 * h}", fc, {"input-size": str(h),
                      "output-size": str(3 * h), "batch-size": str(s)}),
                     (f"bert_grouped_{k}x{s}x64x{s}", fc, {"input-size": "64",
                      "output-size": str(s), "batch-size": str(s), "num-groups": str(k)}),
                     (f"bert_proj_{s}x{h}x{h}", fc, {"input-size": str(h),
                      "output-size": str(s), "batch-size": str(h)}),
                     (f"bert_ffn1_{s}x{h}x{fx}", fc, {"input-size": str(h),
                      "output-size": str(fx), "batch-size": str(s)}),
                     (f"bert_ffn2_{s}x{fx}x{h}", fc, {"input-size": str(fx),
                      "output-size": str(h), "batch-size": str(s)})]
    return rows


def extract(repo: Path) -> dict:
    cmake = _git_show(repo, "tests/CMakeLists.txt")
    table = _git_show(repo, "tests/benchmark_results.csv")
    layers = [(name, TOOLS[kind], _params(body)) for kind, name, body in BLOCK.findall(cmake)
              if "$" not in name]
    layers += _loops()
    cycles: dict[str, dict[str, dict[str, int]]] = {}
    for row in csv.reader(io.StringIO(table)):
        if not row or row[0].startswith("#") or row[1] != "default":
            continue
        cycles.setdefault(row[2], {})[row[0]] = {"cycles": int(row[3]),
                                                 "max_tile_memory": int(row[7])}
    points = []
    for name, tool, params in layers:
        if name not in cycles:
            continue
        points.append({"name": name, "tool": tool, "params": params,
                       "models": cycles[name]})
    return {"source": f"graphcore/poplibs {COMMIT}: tests/CMakeLists.txt (add_conv_benchmark, "
                      "add_fc_benchmark: --bias 0, --ignore-data) and "
                      "tests/benchmark_results.csv (tools/bench.py: executionProfile "
                      "simulation cycles; graphProfile byTile totalIncludingGaps max)",
            "defaults": {"data-type": "half", "batch-size": "1", "kernel-size": "1",
                         "passes": "fwd, bwd, wu (Pass::ALL)", "bias": "0"},
            "layers": points}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", type=Path, help="a git directory of graphcore/poplibs")
    args = parser.parse_args(argv)
    data = extract(args.repo)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['layers'])} layers -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
