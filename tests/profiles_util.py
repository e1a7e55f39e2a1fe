"""Small hand-made tables that satisfy the profile contract, for format and CLI tests."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pandas as pd


def tiny_tables() -> dict[str, pd.DataFrame]:
    stages = pd.DataFrame({
        "stage": [0, 1], "ipu": [0, 1],
        "forward_cycles": [1000, 1500], "backward_cycles": [2000, 2900],
        "recompute_cycles": [0, 0], "exchange_cycles": [40, 40],
        "idle_cycles": [900, 0], "stash_bytes": [4096, 0], "peak_bytes": [9000, 7000],
    })
    trace = pd.DataFrame({
        "ipu": [1, 0, 0, 1], "start": [0, 100, 0, 50], "end": [50, 200, 100, 80],
        "kind": ["idle", "compute", "compute", "exchange"], "stage": [1, 0, 0, 1],
        "microbatch": [-1, 1, 0, 0], "pass": ["", "F", "F", ""],
        "op": ["", "conv1", "conv1", "act b1->b2"],
    })
    liveness = pd.DataFrame({
        "ipu": [0, 0, 1], "step": [0, 1, 0], "phase": ["forward", "backward", "forward"],
        "always_live_bytes": [500, 500, 300], "not_always_live_bytes": [100, 80, 40],
    })
    tile_memory = pd.DataFrame({
        "ipu": [0, 0, 1, 1], "tile": [0, 1, 0, 1],
        "capacity_bytes": [638976] * 4, "total_bytes": [300, 200, 100, 700000],
        "code": [100, 100, 50, 50], "always_live": [150, 50, 25, 600000],
        "not_always_live_peak": [50, 50, 25, 99950], "exchange": [0, 0, 0, 0],
    })
    exchange = pd.DataFrame({
        "src": [0, "host", 1], "dst": [1, 0, "host"], "bytes": [4096, 1024, 64],
        "start": [100, 0, 900], "end": [120, 10, 905],
        "kind": ["activation", "host_in", "host_out"],
    })
    ops = pd.DataFrame({
        "op_id": [0, 1, 2], "op": ["aten.convolution.default", "aten.relu.default",
                                   "aten.convolution_backward.default"],
        "phase": ["forward", "forward", "backward"], "flops": [10**9, 10**6, 2 * 10**9],
        "checkpoint": [False, True, False], "cycles": [1.5, 2.25, 3.0],
        "module": ["conv1", "relu", "conv1"],
    })
    return {"stages": stages, "trace": trace, "liveness": liveness,
            "tile_memory": tile_memory, "exchange": exchange, "ops": ops}


def tiny_meta() -> dict[str, Any]:
    return {
        "target": {"name": "mk2", "num_ipus": 2, "tiles_per_ipu": 2,
                   "bytes_per_tile": 638976, "clock_hz": 1.33e9},
        "options": {"strategy": "pipelined", "schedule": "Grouped", "splits": ["b1/2/relu"],
                    "available_memory_proportion": {"IPU0": 0.6}},
        "model": {"name": "tiny", "parameters": 123},
    }


def tiny_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"tile_liveness": rng.integers(0, 1000, size=(2, 5, 2)).astype(np.uint32)}


def tiny_summary() -> dict[str, Any]:
    return {"fits": False, "oom_tiles": 1, "throughput": 1234.5, "step_cycles": 5000}


def to_format_1_0(path: Any) -> Any:
    """Rewrite a profile's string table the 1.0 way (one vlen UTF-8 dataset `/strings`)
    and mark it 1.0.0: what popviz wrote before format 1.1, for the compatibility tests."""
    import h5py

    with h5py.File(path, "a") as h5:
        blob = h5["strings/bytes"][()].tobytes()
        offsets = h5["strings/offsets"][()]
        texts = [blob[a:b].decode("utf-8") for a, b in itertools.pairwise(offsets)]
        del h5["strings"]
        h5.create_dataset("strings", data=np.array(texts, dtype=object),
                          dtype=h5py.string_dtype("utf-8"))
        h5.attrs["format_version"] = "1.0.0"
    return path
