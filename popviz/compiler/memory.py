"""Memory: tensor lifetimes over program steps, liveness, per-tile memory and OOM tiles.

Program steps are the ops of one micro-batch on an IPU (popviz.compiler.order). In a
pipeline, the other in-flight micro-batches' stash is a constant extra over every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.compiler.accounting import random_masks, stored_bytes
from popviz.compiler.oom import oom_table
from popviz.compiler.tilecode import tile_code
from popviz.options import Options
from popviz.target.cost import Precision, dtype_scale
from popviz.target.machines import Target
from popviz.target.mapping import (
    grain_split,
    per_tile_sum,
    rectangle_runs,
    run_index,
    start_tiles,
    tiles_for,
)

MAX_STEPS = 4000  # per IPU; longer programs are binned (a bin holds the union of its steps)


@dataclass
class Memory:
    liveness: pd.DataFrame
    tile_memory: pd.DataFrame
    variables: pd.DataFrame
    oom: pd.DataFrame
    tensors: pd.DataFrame
    tile_liveness: np.ndarray
    peak_bytes: np.ndarray  # per IPU: always-live + max not-always-live
    stash_bytes: np.ndarray  # per stage: stash depth x stashed bytes per micro-batch
    stash_per_microbatch: np.ndarray
    always_live: pd.DataFrame  # always-live tensors and where they sit (ipu, tiles, bytes)


def _parse_ids(texts: list[str]) -> pd.DataFrame:
    """(row, tensor_id) from ';'-separated id lists: one split of one joined string (an
    optimiser op can list hundreds of tensors)."""
    texts = [t.strip() for t in texts]
    counts = np.array([t.count(";") + 1 if t else 0 for t in texts], dtype=np.int64)
    flat = ";".join(t for t in texts if t).split(";") if counts.sum() else []
    rows = np.repeat(np.arange(len(texts), dtype=np.int64), counts)
    try:
        ids = np.array(flat, dtype=np.int64)
    except ValueError:  # a non-numeric entry: keep only the numeric ones
        keep = np.array([f.strip().isdigit() for f in flat], dtype=bool)
        rows = rows[keep]
        ids = np.array([f for f, k in zip(flat, keep, strict=True) if k], dtype=np.int64)
    return pd.DataFrame({"row": rows, "tensor_id": ids})


def consumers(ops: pd.DataFrame, tensors: pd.DataFrame, prod_row: pd.Series
               ) -> pd.DataFrame:
    """(row, tensor_id, dataflow) rows: which program row reads which tensor. From the
    recorded `inputs` column when there is one (dataflow), plus every tensor's `last_use`
    op for the tensors it does not cover (not dataflow: a stand-in for liveness only)."""
    parts = []
    read: set[int] = set()
    if "inputs" in ops.columns:
        parts.append(_parse_ids(ops["inputs"].astype(str).tolist()).assign(dataflow=True))
        read = set(parts[0]["tensor_id"].tolist())
    # last_use only for tensors the dataflow does not cover (it is the program's last op
    # for tensors still referenced at the end, which says nothing about where they are read)
    lu = prod_row.reindex(tensors["last_use"].to_numpy()).to_numpy()
    ok = ~np.isnan(lu) & ~tensors["tensor_id"].isin(read).to_numpy()
    parts.append(pd.DataFrame({"row": lu[ok].astype(np.int64),
                               "tensor_id": tensors["tensor_id"].to_numpy(np.int64)[ok],
                               "dataflow": False}))
    pairs = pd.concat(parts, ignore_index=True).drop_duplicates()
    return pairs[pairs["tensor_id"].isin(tensors["tensor_id"])].reset_index(drop=True)


def _intervals(ops: pd.DataFrame, tensors: pd.DataFrame, options: Options,
               precision: Precision, module_stage: dict[str, int], stage_ipu: np.ndarray
               ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(tensors with stage and ipu, always-live tensors, not-always-live intervals); the
    last two with ipu, name, category, bytes, t0, t1 (tile range), and s0, s1 (steps).

    A not-always-live tensor lives on its producer's IPU from the producer's step to its
    last reader there, and on every other IPU that reads it from its first to its last
    reader. With recomputation, backward readers of a tensor made inside a recomputed
    section read its recomputed copy instead (born at the recompute op), unless it is a
    section output (a checkpoint, or read by a later section's forward)."""
    t = tensors.reset_index(drop=True)
    cat = t["category"].to_numpy(str)
    nbytes = stored_bytes(t, precision, options)
    tiles_per_ipu = int(ops.attrs["tiles_per_ipu"])

    real = ops["source_op"].to_numpy() < 0
    row_of = pd.Series(np.flatnonzero(real), index=ops["op_id"].to_numpy()[real])
    o_ipu, o_step = ops["ipu"].to_numpy(np.int64), ops["step"].to_numpy(np.int64)
    o_stage, o_pass = ops["stage"].to_numpy(np.int64), ops["pass"].to_numpy(str)
    o_section = ops["section"].to_numpy(np.int64)
    prod = row_of.reindex(t["producer"].to_numpy()).to_numpy()
    has_p = ~np.isnan(prod)
    pi = np.where(has_p, prod, 0).astype(np.int64)

    pairs = consumers(ops, t, row_of)
    tix = pd.Series(np.arange(len(t)), index=t["tensor_id"].to_numpy())
    pairs["t"] = tix.reindex(pairs["tensor_id"].to_numpy()).to_numpy(np.int64)
    c_row = pairs["row"].to_numpy(np.int64)
    c_t = pairs["t"].to_numpy(np.int64)

    # home stage: the producer's, else the owning module's, else the first reader's
    mod_stage = np.array([_module_stage(m, module_stage) for m in t["module"].tolist()],
                         dtype=np.int64)
    first_reader = np.full(len(t), -1, dtype=np.int64)
    if len(pairs):
        fr = pairs.assign(step=o_step[c_row], stage=o_stage[c_row]).sort_values(
            ["t", "stage", "step"]).groupby("t")["stage"].first()
        first_reader[fr.index.to_numpy()] = fr.to_numpy()
    stage = np.where(has_p, o_stage[pi], np.where(
        (cat == "input") & (first_reader >= 0), first_reader,
        np.where(mod_stage >= 0, mod_stage, np.maximum(first_reader, 0))))
    ipu = stage_ipu[np.clip(stage, 0, len(stage_ipu) - 1)]
    t = t.assign(stage=stage.astype(np.int64), ipu=ipu.astype(np.int64))

    # grains over the tiles of the op that makes the tensor (a tensor smaller than that op
    # gets a contiguous run of its tiles, placed by id so that small ones do not all land
    # on the op's first tile); a tensor no op makes (weights, inputs) over the tiles of its
    # first reader, as a conv plan maps its weights; one nobody reads, from tile 0
    grain = int(ops.attrs.get("grain_bytes", 128))
    nt = tiles_for(nbytes, tiles_per_ipu, grain)
    op_nt = ops["tiles_used"].to_numpy(np.int64)
    op_key = np.where(ops["source_op"] >= 0, ops["source_op"], ops["op_id"]).astype(np.int64)
    op_start = start_tiles(op_nt, op_key, tiles_per_ipu)
    home_op = np.where(has_p, pi, -1)
    reads = pairs[pairs["dataflow"]]  # a last_use stand-in says nothing about where it is read
    if len(reads):
        first = reads.groupby("t")["row"].min()
        idx = first.index.to_numpy(np.int64)
        home_op[idx] = np.where(has_p[idx], home_op[idx], first.to_numpy(np.int64))
    hop = np.maximum(home_op, 0)
    on_op = (home_op >= 0) & (op_nt[hop] > 0)
    nt = np.where(on_op, np.minimum(nt, np.maximum(op_nt[hop], 1)), nt)
    room = np.maximum(op_nt[hop] - nt + 1, 1)
    offset = start_tiles(np.zeros(len(t), dtype=np.int64), t["tensor_id"].to_numpy(), 1 << 30) \
        % room
    start = np.where(on_op, np.minimum(op_start[hop] + offset, tiles_per_ipu - nt), 0)

    base = pd.DataFrame({"ipu": ipu, "name": t["name"].astype(str).to_numpy(),
                         "category": cat, "bytes": nbytes, "t0": start, "t1": start + nt,
                         "stage": stage})
    accum = options.gradient_accumulation > 1 or options.replication_factor > 1
    always = (cat == "parameter") | ((cat == "optimiser_state") & (not options.optimiser_offload))
    always |= (cat == "gradient") & accum
    al = base[always].reset_index(drop=True)

    # recomputation: which readers read the recomputed copy
    rec_rows = np.flatnonzero(~real)
    rec_of = pd.Series(rec_rows, index=ops["source_op"].to_numpy()[~real])
    p_op = np.where(has_p, ops["op_id"].to_numpy()[pi], -1)
    copy_row = rec_of[~rec_of.index.duplicated()].reindex(p_op).to_numpy()
    has_copy = has_p & ~np.isnan(copy_row)
    # a section output is kept when a later section of the same stage reads it; another
    # stage's copy is that stage's input, and this stage recomputes its own
    later_fwd = (o_pass[c_row] == "F") & (o_section[c_row] != o_section[pi[c_t]]) & \
        (o_stage[c_row] == o_stage[pi[c_t]])
    output = ops["checkpoint"].to_numpy(bool)[pi] & has_p
    output[np.unique(c_t[later_fwd & has_p[c_t]])] = True
    is_copy = has_copy[c_t] & ~output[c_t] & np.isin(o_pass[c_row], ("R", "B")) & \
        (o_stage[c_row] == o_stage[pi[c_t]])
    pairs["copy"] = is_copy
    pairs["ipu"] = o_ipu[c_row]
    pairs["step"] = o_step[c_row]
    pairs["rstage"] = o_stage[c_row]
    # a dropout mask is drawn again from its seed for each backward reader (one step there)
    regen = random_masks(ops, t["tensor_id"].to_numpy())[c_t] & (o_pass[c_row] == "B")
    drawn, pairs = pairs[regen], pairs[~regen]
    span = pairs.groupby(["t", "copy", "ipu"]).agg(
        min=("step", "min"), max=("step", "max"), rstage=("rstage", "min")).reset_index()

    nal = ~always
    ipu_last = ops.groupby("ipu")["step"].max()
    wu_first = ops[ops["pass"] == "WU"].groupby("ipu")["step"].min()
    tt, cp, si = (span["t"].to_numpy(np.int64), span["copy"].to_numpy(bool),
                  span["ipu"].to_numpy(np.int64))
    home = (si == ipu[tt]) & ~cp
    # offloaded optimiser state is streamed in for its weight's update (its first reader),
    # not from the op that made it: the recorded step is the first, where the optimiser
    # creates every weight's state at the start of the update (torch's _init_group); in the
    # steps PopART repeats it exists off chip already (optimizerStateTensorLocation OffChip)
    made = has_p[tt] & ~(options.optimiser_offload & (cat[tt] == "optimiser_state"))
    s0 = np.where(cp, o_step[np.nan_to_num(copy_row[tt], nan=0).astype(np.int64)],
                  np.where(home & made, o_step[pi[tt]], span["min"].to_numpy()))
    s1 = np.maximum(span["max"].to_numpy(), s0)
    keep = nal[tt]
    # a received copy belongs to the stage that reads it
    rstage = np.where(home, stage[tt], span["rstage"].to_numpy(np.int64))
    iv = base.iloc[tt[keep]].assign(ipu=si[keep], s0=s0[keep], s1=s1[keep],
                                    stage=rstage[keep]).reset_index(drop=True)
    iv.loc[cp[keep], "name"] = iv.loc[cp[keep], "name"] + " (recomputed)"
    # readerless tensors live one step; weight gradients until the update; offloaded
    # optimiser state only around the update
    read = np.zeros(len(t), dtype=bool)
    read[tt[home]] = True
    lone = nal & ~read & has_p
    extra = [base[lone].assign(s0=o_step[pi[lone]], s1=o_step[pi[lone]]),
             base.iloc[drawn["t"].to_numpy()].assign(
                 ipu=drawn["ipu"].to_numpy(), s0=drawn["step"].to_numpy(),
                 s1=drawn["step"].to_numpy(), stage=drawn["rstage"].to_numpy(),
                 name=base["name"].to_numpy()[drawn["t"].to_numpy()] + " (drawn again)")]
    iv = pd.concat([iv, *extra], ignore_index=True)
    grad = (iv["category"] == "gradient").to_numpy()
    iv.loc[grad, "s1"] = ipu_last.reindex(iv.loc[grad, "ipu"]).fillna(0).to_numpy(np.int64)
    # offloaded optimiser state keeps its own interval: streamed in for its weight's update
    # (its first reader) and out after it (its last), not all of it for the whole update;
    # state no update step reads comes in for one step at the start of the update
    off = (cat == "optimiser_state") & options.optimiser_offload & ~read & ~lone
    if off.any():
        iv = pd.concat([iv, base[off].assign(
            s0=wu_first.reindex(ipu[off]).fillna(0).to_numpy(np.int64),
            s1=wu_first.reindex(ipu[off]).fillna(0).to_numpy(np.int64))], ignore_index=True)
    iv["s0"] = iv["s0"].astype(np.int64)
    iv["s1"] = np.maximum(iv["s1"].astype(np.int64), iv["s0"])
    return t, al, iv.reset_index(drop=True)


def _module_stage(module: str, table: dict[str, int]) -> int:
    while True:
        if module in table:
            return table[module]
        if "." not in module:
            return -1
        module = module.rsplit(".", 1)[0]


def analyse_memory(ops: pd.DataFrame, tensors: pd.DataFrame, options: Options,
                   precision: Precision, target: Target, module_stage: dict[str, int],
                   stage_ipu: np.ndarray, depth: np.ndarray, num_ipus: int) -> Memory:
    T = target.tiles_per_ipu
    ops = ops.copy()
    ops.attrs["tiles_per_ipu"] = T
    ops.attrs["grain_bytes"] = int(target.cost.grain_bytes)
    tens, al, iv = _intervals(ops, tensors, options, precision, module_stage, stage_ipu)
    n_stages = len(stage_ipu)

    # AMP temporaries and incoming-operand exchange buffers: one step on the op's own tiles
    amp_ops = ops[ops["temp_bytes"] > 0]
    nt = amp_ops["tiles_used"].to_numpy(np.int64)
    key = np.where(amp_ops["source_op"] >= 0, amp_ops["source_op"], amp_ops["op_id"])
    t0 = start_tiles(nt, key, T)
    label = amp_ops["op"].astype(str) + "#" + amp_ops["op_id"].astype(str)
    scale = dtype_scale(amp_ops["dtype"], precision.compute_bytes)
    buffer = np.ceil(amp_ops["bytes_read"].to_numpy(np.float64) * scale
                     * target.cost.exchange_buffer_fraction)
    temps = pd.concat([pd.DataFrame({
        "ipu": amp_ops["ipu"].to_numpy(), "name": prefix + label, "category": category,
        "bytes": nbytes, "t0": t0, "t1": t0 + nt, "stage": amp_ops["stage"].to_numpy(),
        "s0": amp_ops["step"].to_numpy(), "s1": amp_ops["step"].to_numpy()})
        for prefix, category, nbytes in (
            ("temporary of ", "temporary", amp_ops["temp_bytes"].to_numpy(np.int64) * nt),
            ("exchange buffer of ", "exchange_buffer", buffer.astype(np.int64)))],
        ignore_index=True)

    # stash: tensors alive from a forward step into the backward, x (depth - 1) other
    # micro-batches in flight (the current one is the interval itself)
    ipu_last = ops.groupby("ipu")["step"].max()
    f_last_ipu = ops[ops["pass"] == "F"].groupby("ipu")["step"].max()
    fl = f_last_ipu.reindex(iv["ipu"]).fillna(-1).to_numpy()
    crosses = (iv["s0"].to_numpy() <= fl) & (iv["s1"].to_numpy() > fl) & \
        iv["category"].isin(["activation", "input", "temporary"]).to_numpy()
    stashed = iv[crosses]
    per_mb = np.bincount(stashed["stage"].to_numpy(np.int64),
                         weights=stashed["bytes"].to_numpy(np.float64), minlength=n_stages)
    per_mb = per_mb[:n_stages].astype(np.int64)
    extra_n = np.maximum(depth - 1, 0)
    ex = stashed[extra_n[stashed["stage"].to_numpy(np.int64)] > 0].copy()
    if len(ex):
        mult = extra_n[ex["stage"].to_numpy(np.int64)]
        ex["bytes"] = ex["bytes"].to_numpy(np.int64) * mult
        ex["name"] = "stash of " + ex["name"] + " x" + pd.Series(mult, index=ex.index).astype(str)
        ex["category"] = "stash"
        ex["s0"] = 0
        ex["s1"] = ipu_last.reindex(ex["ipu"]).fillna(0).to_numpy(np.int64)
    nal = pd.concat([iv, temps, ex], ignore_index=True)
    nal = nal[nal["bytes"] > 0].reset_index(drop=True)

    # bin long programs, then per-IPU step x tile rectangles
    steps = ops.groupby("ipu")["step"].max().reindex(range(num_ipus)).fillna(-1) \
        .astype(np.int64).to_numpy() + 1
    width = np.maximum(np.ceil(steps / MAX_STEPS), 1).astype(np.int64)
    rows = np.maximum((steps + width - 1) // width, 1)
    R = int(rows.max()) if num_ipus else 0
    tile_live = np.empty((num_ipus, R, T), dtype=np.uint32)  # every row written below
    alive_tiles = np.zeros((num_ipus, T))
    nal_step = np.zeros((num_ipus, R))
    nal_ipu = nal["ipu"].to_numpy(np.int64)
    grain = int(target.cost.grain_bytes)
    code, exch, state = tile_code(ops, target, options, num_ipus)
    # per IPU: tile liveness of each run of equal steps (runs x tiles), first step of each
    runs: list[tuple[np.ndarray, np.ndarray]] = []
    for i in range(num_ipus):
        m = nal_ipu == i
        sub = nal[m]
        r0 = sub["s0"].to_numpy(np.int64) // width[i]
        r1 = np.minimum(sub["s1"].to_numpy(np.int64) // width[i], rows[i] - 1)
        t0s, t1s, per_tile, rr0, rr1 = _grains(sub, grain, r0, r1)
        # runs of steps with the same live bytes: one row each, expanded at the end
        grid, row_starts, col_starts = rectangle_runs(R, T, rr0, rr1, t0s, t1s, per_tile)
        # in place: each step over the (steps x tiles) grid would otherwise allocate a copy
        np.subtract(grid, 1e-6, out=grid)
        np.ceil(grid, out=grid)
        np.minimum(grid, np.iinfo(np.uint32).max, out=grid)
        live = np.take(grid.astype(np.uint32), run_index(col_starts, T), axis=1)
        runs.append((live, row_starts))
        np.take(live, run_index(row_starts, R), axis=0, out=tile_live[i])
        diff = np.zeros(R + 1)
        np.add.at(diff, r0, sub["bytes"].to_numpy(np.float64))
        np.add.at(diff, r1 + 1, -sub["bytes"].to_numpy(np.float64))
        nal_step[i] = np.cumsum(diff)[:R]
        a = al[al["ipu"].to_numpy() == i]
        zero = np.zeros(len(a), dtype=np.int64)
        t0s, t1s, per_tile, _, _ = _grains(a, grain, zero, zero)
        alive_tiles[i] = per_tile_sum(T, t0s, t1s, per_tile)

    nal_peak = np.stack([r.max(axis=0) for r, _ in runs]) if R and num_ipus \
        else np.zeros((num_ipus, T))
    code_i, exch_i = np.ceil(code).astype(np.int64), np.ceil(exch).astype(np.int64)
    state_i = np.ceil(state).astype(np.int64)
    al_i = np.ceil(alive_tiles).astype(np.int64)
    total = code_i + state_i + exch_i + al_i + nal_peak.astype(np.int64)
    tile_memory = pd.DataFrame({
        "ipu": np.repeat(np.arange(num_ipus), T).astype(np.int64),
        "tile": np.tile(np.arange(T), num_ipus).astype(np.int64),
        "capacity_bytes": np.int64(target.bytes_per_tile),
        "total_bytes": total.ravel(), "code": code_i.ravel(), "always_live": al_i.ravel(),
        "not_always_live_peak": nal_peak.ravel().astype(np.int64), "exchange": exch_i.ravel(),
        "vertex_state": state_i.ravel(),
    })
    always_ipu = (code_i + state_i + exch_i + al_i).sum(axis=1)
    liveness = _liveness_table(ops, rows, width, nal_step, always_ipu, num_ipus)
    peak = always_ipu + (nal_step.max(axis=1) if R else 0)
    variables = pd.DataFrame({
        "ipu": nal["ipu"].astype(np.int64), "name": nal["name"].astype(str),
        "category": nal["category"].astype(str), "bytes": nal["bytes"].astype(np.int64),
        "first_step": nal["s0"].astype(np.int64), "last_step": nal["s1"].astype(np.int64),
        "stage": nal["stage"].astype(np.int64),
        # where it sits: whole grains over [first_tile, first_tile + tiles) (grain_split)
        "first_tile": nal["t0"].astype(np.int64),
        "tiles": (nal["t1"] - nal["t0"]).astype(np.int64), "grain_bytes": np.int64(grain)})
    always_live = pd.DataFrame({
        "ipu": al["ipu"].astype(np.int64), "name": al["name"].astype(str),
        "category": al["category"].astype(str), "bytes": al["bytes"].astype(np.int64),
        "first_tile": al["t0"].astype(np.int64),
        "tiles": (al["t1"] - al["t0"]).astype(np.int64), "grain_bytes": np.int64(grain)})
    oom = oom_table(total, runs, nal_peak, al, nal, width, target.bytes_per_tile, grain)
    # a stage without a stash (the last: its backward follows its forward at once) holds
    # its activations across F -> B for the current micro-batch only: no stash per one
    per_mb = np.where(np.asarray(depth) > 0, per_mb, 0).astype(np.int64)
    return Memory(liveness, tile_memory, variables, oom, tens, tile_live,
                  peak.astype(np.int64), (per_mb * depth).astype(np.int64), per_mb,
                  always_live)


def _grains(rows: pd.DataFrame, grain: int, r0: np.ndarray, r1: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Tile ranges holding whole grains: a tensor of g grains over n tiles gives g // n
    grains to each and one more to its first g % n tiles (so 1.5 grains per tile is 2 on
    half the tiles and 1 on the rest, as a real mapping is). Two ranges per tensor:
    (t0, t1, bytes per tile, r0, r1) of each."""
    t0 = rows["t0"].to_numpy(np.int64)
    t1 = rows["t1"].to_numpy(np.int64)
    mid, high, low, _ = grain_split(t0, t1, rows["bytes"].to_numpy(np.float64), grain)
    return (np.concatenate([t0, mid]), np.concatenate([mid, t1]),
            np.concatenate([high, low]), np.concatenate([r0, r0]), np.concatenate([r1, r1]))


def _liveness_table(ops: pd.DataFrame, rows: np.ndarray, width: np.ndarray,
                    nal_step: np.ndarray, always: np.ndarray, num_ipus: int) -> pd.DataFrame:
    parts = []
    for i in range(num_ipus):
        o = ops[ops["ipu"] == i]
        first = o[o["step"] % width[i] == 0]
        r = (first["step"] // width[i]).to_numpy(np.int64)
        parts.append(pd.DataFrame({
            "ipu": np.int64(i), "step": r, "phase": first["phase"].astype(str).to_numpy(),
            "always_live_bytes": np.int64(always[i]),
            "not_always_live_bytes": np.ceil(nal_step[i, r]).astype(np.int64),
            "label": first["op"].astype(str).to_numpy(), "op_id": first["op_id"].to_numpy(),
            "microbatch": np.int64(0), "stage": first["stage"].to_numpy(np.int64),
            "pass": first["pass"].astype(str).to_numpy()}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
