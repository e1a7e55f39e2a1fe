"""Code on each tile: vertex code per vertex type, control code, vertex state and exchange
code per compute set, with PopART / PopTorch outlining when the options ask for it.

Split from memory.py (its caller). Poplar loads a codelet's machine code once on every tile
that runs a vertex of its type, however many compute sets use it, so vertex code grows with
the distinct vertex types a tile runs, not with the ops. Each compute set adds a little
control code (the supervisor's calls and syncs), its vertex instances' state and the
exchange code that feeds it on every tile it uses. With outlining, identical ops of
repeated layers (the same op, shapes, dtype and pass in modules that differ only by a layer
index, e.g. `encoder.layer.3.attention` / `encoder.layer.4.attention`) are one outlined
subgraph: their compute sets, state and exchange code exist once (on the first one's tiles).
Recompute ops call their forward's compute sets (PopART outlines them too): none of their own.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from popviz.options import Options
from popviz.target.machines import Target
from popviz.target.mapping import per_tile_sum, start_tiles

_INDEX = re.compile(r"(?<=[./])\d+(?=[./]|$)")  # a layer index inside a module path
_METHOD = re.compile(r"(?:^|; )\w+: ([\w-]+):")  # the conv vertex of each planned pass


def vertex_types(ops: pd.DataFrame) -> list[tuple[str, ...]]:
    """The vertex types each op runs. A conv / matmul: its planned vertex per pass (AMP,
    SLIC, HMAC, by channel grouping) and the partials reduction; a vector op: one vertex
    type per (op, dtype) (PopLibs' popops vertices are templated on operation and type)."""
    out: list[tuple[str, ...]] = []
    for op, dtype, plan in zip(ops["op"].astype(str), ops["dtype"].astype(str),
                               ops["plan"].astype(str) if "plan" in ops.columns
                               else [""] * len(ops), strict=True):
        methods = _METHOD.findall(plan) if plan else []
        if methods:
            out.append(tuple(sorted({f"conv:{m}" for m in methods} | {"conv:reduce"})))
        else:
            out.append((f"{op}:{dtype}",))
    return out


def outline_keys(ops: pd.DataFrame) -> np.ndarray:
    """Per op, the key of its outlined subgraph: ops with equal keys share code."""
    module = [_INDEX.sub("#", m) for m in ops["module"].astype(str)]
    parts = [ops["ipu"].astype(str), ops["pass"].astype(str), ops["op"].astype(str),
             ops["shapes"].astype(str), ops["dtype"].astype(str), pd.Series(module,
                                                                            index=ops.index)]
    key = parts[0]
    for p in parts[1:]:
        key = key + "|" + p
    return key.to_numpy(str)


def tile_code(ops: pd.DataFrame, target: Target, options: Options, num_ipus: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(code, exchange code, vertex state) bytes per (ipu, tile). Code = the tile's control
    code overhead + vertex code of each distinct vertex type it runs + control code per
    compute set on it."""
    T = target.tiles_per_ipu
    cost = target.cost
    code = np.full((num_ipus, T), float(target.tile_overhead_bytes))
    exch = np.zeros((num_ipus, T))
    state = np.zeros((num_ipus, T))
    nt_all = ops["tiles_used"].to_numpy(np.int64)
    run = (ops["source_op"].to_numpy() < 0) & (nt_all > 0)
    o = ops[run]
    if o.empty:
        return code, exch, state
    nt = nt_all[run]
    t0 = start_tiles(nt, o["op_id"].to_numpy(np.int64), T)  # as memory.py places ops
    ipu = o["ipu"].to_numpy(np.int64)
    own = np.ones(len(o), dtype=bool)
    if options.outlining:
        own = ~pd.Series(outline_keys(o)).duplicated().to_numpy()
    for i in range(num_ipus):
        m = own & (ipu == i)
        lo, hi = t0[m], t0[m] + nt[m]
        code[i] += per_tile_sum(T, lo, hi, np.full(m.sum(), float(
            cost.control_code_bytes_per_op_per_tile)))
        exch[i] = per_tile_sum(T, lo, hi, np.full(m.sum(), float(
            cost.exchange_code_bytes_per_op_per_tile)))
        state[i] = per_tile_sum(T, lo, hi, np.full(m.sum(), float(
            cost.vertex_state_bytes_per_op_per_tile)))
    # vertex code: each type once on every tile that runs it (a union of op tile ranges)
    types = vertex_types(o)
    rows = np.repeat(np.arange(len(o)), [len(t) for t in types])
    names = np.array([name for t in types for name in t], dtype=object)
    if len(rows):
        groups = pd.DataFrame({"ipu": ipu[rows], "type": names})
        gid = groups.groupby(["ipu", "type"], sort=True).ngroup().to_numpy(np.int64)
        g_ipu = np.zeros(gid.max() + 1, dtype=np.int64)
        g_ipu[gid] = groups["ipu"].to_numpy(np.int64)
        diff = np.zeros((gid.max() + 1, T + 1))
        np.add.at(diff, (gid, t0[rows]), 1.0)
        np.add.at(diff, (gid, t0[rows] + nt[rows]), -1.0)
        used = np.cumsum(diff, axis=1)[:, :T] > 0.5
        for i in range(num_ipus):
            code[i] += used[g_ipu == i].sum(axis=0) * float(cost.vertex_code_bytes_per_type)
    return code, exch, state
