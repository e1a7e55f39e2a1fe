"""Memory: tensor lifetimes over program steps, liveness, per-tile memory and OOM tiles.

Program steps are the ops of one micro-batch on an IPU (popviz.compile.order). In a
pipeline, the other in-flight micro-batches' stash is a constant extra over every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.options import Options
from popviz.target.cost import Precision, dtype_scale
from popviz.target.machines import Target
from popviz.target.mapping import per_tile_sum, rectangles, start_tiles, tiles_for

MAX_STEPS = 4000  # per IPU; longer programs are binned (a bin holds the union of its steps)
WEIGHT_CATEGORIES = ("parameter", "optimiser_state", "gradient")
OOM_CANDIDATES = 200


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


def _intervals(ops: pd.DataFrame, tensors: pd.DataFrame, options: Options,
               precision: Precision, module_stage: dict[str, int], stage_ipu: np.ndarray
               ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(tensors with stage and ipu, always-live tensors, not-always-live intervals); the
    last two with ipu, name, category, bytes, t0, t1 (tile range), and s0, s1 (steps)."""
    t = tensors.reset_index(drop=True)
    cat = t["category"].to_numpy(str)
    weight = np.isin(cat, WEIGHT_CATEGORIES)
    scale = np.where(weight, dtype_scale(t["dtype"], precision.weight_bytes),
                     dtype_scale(t["dtype"], precision.compute_bytes))
    nbytes = np.ceil(t["bytes"].to_numpy(np.float64) * scale).astype(np.int64)

    real = ops[ops["source_op"] < 0]
    by_id = pd.Series(np.arange(len(real)), index=real["op_id"].to_numpy())
    o_ipu, o_step = real["ipu"].to_numpy(), real["step"].to_numpy()
    o_stage, o_pass = real["stage"].to_numpy(), real["pass"].to_numpy(str)
    prod = by_id.reindex(t["producer"].to_numpy()).to_numpy()
    use = by_id.reindex(t["last_use"].to_numpy()).to_numpy()
    has_p, has_u = ~np.isnan(prod), ~np.isnan(use)
    pi = np.where(has_p, prod, 0).astype(np.int64)
    ui = np.where(has_u, use, 0).astype(np.int64)

    # home IPU / stage: the producer's, else the owning module's, else the last user's
    mod_stage = np.array([_module_stage(m, module_stage) for m in t["module"].tolist()],
                         dtype=np.int64)
    stage = np.where(has_p, o_stage[pi], np.where(mod_stage >= 0, mod_stage,
                                                   np.where(has_u, o_stage[ui], 0)))
    if cat.size and np.isin(cat, ("input",)).any():
        inp = (cat == "input") & ~has_p
        stage = np.where(inp & has_u, o_stage[ui], np.where(inp, 0, stage))
    ipu = stage_ipu[np.clip(stage, 0, len(stage_ipu) - 1)]
    t = t.assign(stage=stage.astype(np.int64), ipu=ipu.astype(np.int64))

    tiles_per_ipu = int(ops.attrs["tiles_per_ipu"])
    nt = tiles_for(nbytes, tiles_per_ipu)
    op_start = start_tiles(real["tiles_used"].to_numpy(np.int64), real["op_id"].to_numpy(),
                           tiles_per_ipu)
    start = np.where(has_p, np.minimum(op_start[pi] if len(real) else 0,
                                       tiles_per_ipu - nt),
                     start_tiles(nt, t["tensor_id"].to_numpy(), tiles_per_ipu))
    base = pd.DataFrame({"ipu": ipu, "name": t["name"].astype(str).to_numpy(),
                         "category": cat, "bytes": nbytes, "t0": start, "t1": start + nt,
                         "stage": stage})

    accum = options.gradient_accumulation > 1 or options.replication_factor > 1
    always = np.isin(cat, ("parameter",)) | ((cat == "optimiser_state") &
                                             (not options.optimiser_offload))
    always |= (cat == "gradient") & accum
    al = base[always].reset_index(drop=True)

    # not-always-live: producer step (or 0) .. last user's step on the same IPU
    f_last = _last_step(ops, ops["pass"] == "F", "stage")  # per stage, last F step
    f_first = _first_step(ops, ops["pass"] == "F", "stage")
    ipu_last = ops.groupby("ipu")["step"].max()
    nal = ~always
    s0 = np.where(has_p, o_step[pi], 0)
    same = has_u & (o_ipu[ui] == ipu)
    end_default = np.where(cat == "gradient", ipu_last.reindex(ipu).fillna(0).to_numpy(),
                           f_last.reindex(stage).fillna(0).to_numpy())
    s1 = np.where(same, o_step[ui], end_default).astype(np.int64)
    offload = (cat == "optimiser_state") & options.optimiser_offload
    wu_first = _first_step(ops, ops["pass"] == "WU", "ipu")
    s0 = np.where(offload, wu_first.reindex(ipu).fillna(0).to_numpy(), s0)
    s1 = np.where(offload, ipu_last.reindex(ipu).fillna(0).to_numpy(), s1)
    s1 = np.maximum(s1, s0)
    iv = base.assign(s0=s0.astype(np.int64), s1=s1)[nal]

    rows = [iv]
    # a tensor used on a later IPU gets a received copy there
    cross = nal & has_u & ~same & has_p
    if cross.any():
        u_stage = o_stage[ui[cross]]
        rows.append(base[cross].assign(
            ipu=o_ipu[ui[cross]], stage=u_stage,
            s0=f_first.reindex(u_stage).fillna(0).to_numpy(np.int64),
            s1=o_step[ui[cross]]).assign(s1=lambda d: np.maximum(d["s0"], d["s1"])))
    iv = pd.concat(rows, ignore_index=True)
    iv["producer_row"] = np.r_[np.where(has_p, pi, -1)[nal], np.where(has_p, pi, -1)[cross]]
    iv["is_fwd"] = np.r_[(has_p & (o_pass[pi] == "F"))[nal], np.zeros(int(cross.sum()), bool)]
    return t, al, _recompute(ops, real, iv)


def _module_stage(module: str, table: dict[str, int]) -> int:
    while True:
        if module in table:
            return table[module]
        if "." not in module:
            return -1
        module = module.rsplit(".", 1)[0]


def _last_step(ops: pd.DataFrame, mask: pd.Series, key: str) -> pd.Series:
    return ops[mask].groupby(key)["step"].max()


def _first_step(ops: pd.DataFrame, mask: pd.Series, key: str) -> pd.Series:
    return ops[mask].groupby(key)["step"].min()


def _recompute(ops: pd.DataFrame, real: pd.DataFrame, iv: pd.DataFrame) -> pd.DataFrame:
    """Forward tensors of a recomputed section die at the section's end and are born
    again at their recompute op; section outputs (checkpoints) are kept."""
    rec = ops[ops["source_op"] >= 0]
    if rec.empty:
        return iv.drop(columns=["producer_row", "is_fwd"])
    rec_step = pd.Series(rec["step"].to_numpy(), index=rec["source_op"].to_numpy())
    fwd = real[real["pass"] == "F"]
    sec_end = fwd.groupby("section")["step"].max()
    sec_last_op = fwd.groupby("section")["op_id"].max()
    pr = iv["producer_row"].to_numpy()
    ok = iv["is_fwd"].to_numpy() & (pr >= 0)
    op_id = np.where(ok, real["op_id"].to_numpy()[np.maximum(pr, 0)], -1)
    section = np.where(ok, real["section"].to_numpy()[np.maximum(pr, 0)], -1)
    ckpt = np.where(ok, real["checkpoint"].to_numpy(bool)[np.maximum(pr, 0)], False)
    r_step = rec_step.reindex(op_id).to_numpy()
    end = sec_end.reindex(section).to_numpy()
    last_op = sec_last_op.reindex(section).to_numpy()
    split = ok & ~np.isnan(r_step) & ~ckpt & (op_id != last_op) & (iv["s1"].to_numpy() > end)
    out = iv.drop(columns=["producer_row", "is_fwd"])
    if not split.any():
        return out
    again = out[split].copy()
    again["s0"] = r_step[split].astype(np.int64)
    again["s1"] = np.maximum(again["s1"], again["s0"])
    again["name"] = again["name"] + " (recomputed)"
    out.loc[split, "s1"] = end[split].astype(np.int64)
    return pd.concat([out, again], ignore_index=True)


def analyse_memory(ops: pd.DataFrame, tensors: pd.DataFrame, options: Options,
                   precision: Precision, target: Target, module_stage: dict[str, int],
                   stage_ipu: np.ndarray, depth: np.ndarray, num_ipus: int) -> Memory:
    T = target.tiles_per_ipu
    ops = ops.copy()
    ops.attrs["tiles_per_ipu"] = T
    tens, al, iv = _intervals(ops, tensors, options, precision, module_stage, stage_ipu)
    n_stages = len(stage_ipu)

    # AMP temporaries: one step on the op's own tiles
    amp_ops = ops[ops["temp_bytes"] > 0]
    nt = amp_ops["tiles_used"].to_numpy(np.int64)
    key = np.where(amp_ops["source_op"] >= 0, amp_ops["source_op"], amp_ops["op_id"])
    t0 = start_tiles(nt, key, T)
    temps = pd.DataFrame({
        "ipu": amp_ops["ipu"].to_numpy(), "name": ("temporary of " + amp_ops["op"].astype(str)
                                                   + "#" + amp_ops["op_id"].astype(str)),
        "category": "temporary",
        "bytes": amp_ops["temp_bytes"].to_numpy(np.int64) * nt, "t0": t0, "t1": t0 + nt,
        "stage": amp_ops["stage"].to_numpy(), "s0": amp_ops["step"].to_numpy(),
        "s1": amp_ops["step"].to_numpy()})

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
    tile_live = np.zeros((num_ipus, R, T), dtype=np.uint32)
    code = np.zeros((num_ipus, T))
    exch = np.zeros((num_ipus, T))
    alive_tiles = np.zeros((num_ipus, T))
    nal_step = np.zeros((num_ipus, R))
    nal_ipu = nal["ipu"].to_numpy(np.int64)
    op_ipu = ops["ipu"].to_numpy(np.int64)
    op_nt = ops["tiles_used"].to_numpy(np.int64)
    op_key = np.where(ops["source_op"] >= 0, ops["source_op"], ops["op_id"]).astype(np.int64)
    op_t0 = start_tiles(op_nt, op_key, T)
    for i in range(num_ipus):
        m = nal_ipu == i
        sub = nal[m]
        r0 = sub["s0"].to_numpy(np.int64) // width[i]
        r1 = np.minimum(sub["s1"].to_numpy(np.int64) // width[i], rows[i] - 1)
        ntile = (sub["t1"] - sub["t0"]).to_numpy(np.int64)
        per_tile = sub["bytes"].to_numpy(np.float64) / np.maximum(ntile, 1)
        grid = rectangles(R, T, r0, r1, sub["t0"].to_numpy(), sub["t1"].to_numpy(), per_tile)
        tile_live[i] = np.minimum(np.ceil(grid - 1e-6), np.iinfo(np.uint32).max)
        diff = np.zeros(R + 1)
        np.add.at(diff, r0, sub["bytes"].to_numpy(np.float64))
        np.add.at(diff, r1 + 1, -sub["bytes"].to_numpy(np.float64))
        nal_step[i] = np.cumsum(diff)[:R]
        om = op_ipu == i
        code[i] = target.tile_overhead_bytes + per_tile_sum(
            T, op_t0[om], op_t0[om] + op_nt[om],
            np.full(om.sum(), target.code_bytes_per_op_per_tile))
        exch[i] = per_tile_sum(T, op_t0[om], op_t0[om] + op_nt[om],
                               np.full(om.sum(), target.exchange_code_bytes_per_op_per_tile))
        a = al[al["ipu"].to_numpy() == i]
        n_a = (a["t1"] - a["t0"]).to_numpy(np.int64)
        alive_tiles[i] = per_tile_sum(T, a["t0"].to_numpy(), a["t1"].to_numpy(),
                                      a["bytes"].to_numpy(np.float64) / np.maximum(n_a, 1))

    nal_peak = tile_live.max(axis=1) if R else np.zeros((num_ipus, T))
    code_i, exch_i = np.ceil(code).astype(np.int64), np.ceil(exch).astype(np.int64)
    al_i = np.ceil(alive_tiles).astype(np.int64)
    total = code_i + exch_i + al_i + nal_peak.astype(np.int64)
    tile_memory = pd.DataFrame({
        "ipu": np.repeat(np.arange(num_ipus), T).astype(np.int64),
        "tile": np.tile(np.arange(T), num_ipus).astype(np.int64),
        "capacity_bytes": np.int64(target.bytes_per_tile),
        "total_bytes": total.ravel(), "code": code_i.ravel(), "always_live": al_i.ravel(),
        "not_always_live_peak": nal_peak.ravel().astype(np.int64), "exchange": exch_i.ravel(),
    })
    always_ipu = (code_i + exch_i + al_i).sum(axis=1)
    liveness = _liveness_table(ops, rows, width, nal_step, always_ipu, num_ipus)
    peak = always_ipu + (nal_step.max(axis=1) if R else 0)
    variables = pd.DataFrame({
        "ipu": nal["ipu"].astype(np.int64), "name": nal["name"].astype(str),
        "category": nal["category"].astype(str), "bytes": nal["bytes"].astype(np.int64),
        "first_step": nal["s0"].astype(np.int64), "last_step": nal["s1"].astype(np.int64),
        "stage": nal["stage"].astype(np.int64)})
    oom = _oom(tile_memory, total, tile_live, al, nal, width, target.bytes_per_tile)
    return Memory(liveness, tile_memory, variables, oom, tens, tile_live,
                  peak.astype(np.int64), (per_mb * depth).astype(np.int64), per_mb)


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


def _oom(tile_memory: pd.DataFrame, total: np.ndarray, tile_live: np.ndarray,
         al: pd.DataFrame, nal: pd.DataFrame, width: np.ndarray, capacity: int) -> pd.DataFrame:
    """Tiles over capacity, each with its largest variables (always-live, plus the
    not-always-live ones alive at that tile's peak step)."""
    over = total - capacity
    rows = []
    for i, tiles in enumerate(over):
        bad = np.flatnonzero(tiles > 0)
        if not len(bad):
            continue
        peak_row = tile_live[i][:, bad].argmax(axis=0) if tile_live.shape[1] else \
            np.zeros(len(bad), dtype=np.int64)
        cand = pd.concat([al[al["ipu"] == i].assign(s0=-1, s1=np.iinfo(np.int64).max // 2),
                          nal[nal["ipu"] == i]], ignore_index=True)
        cand = cand.assign(per_tile=cand["bytes"] / (cand["t1"] - cand["t0"]).clip(lower=1))
        cand = cand.nlargest(OOM_CANDIDATES, "per_tile", keep="first")
        t0, t1 = cand["t0"].to_numpy()[:, None], cand["t1"].to_numpy()[:, None]
        r0 = cand["s0"].to_numpy()[:, None] // width[i]
        r1 = cand["s1"].to_numpy()[:, None] // width[i]
        names = cand["name"].to_numpy(str)
        per_tile = cand["per_tile"].to_numpy()
        for lo in range(0, len(bad), 512):
            b, pr = bad[lo:lo + 512][None, :], peak_row[lo:lo + 512][None, :]
            hit = (t0 <= b) & (b < t1) & ((r0 < 0) | ((r0 <= pr) & (pr <= r1)))
            score = np.where(hit, per_tile[:, None], 0.0)
            top = np.argsort(-score, axis=0, kind="stable")[:3]
            for j in range(b.shape[1]):
                picks = [f"{names[v]} ({per_tile[v] / 1024:.1f} KiB)" for v in top[:, j]
                         if score[v, j] > 0]
                rows.append((i, int(b[0, j]), int(tiles[b[0, j]]), "; ".join(picks)))
    return pd.DataFrame(rows, columns=["ipu", "tile", "bytes_over", "variables"]).astype(
        {"ipu": np.int64, "tile": np.int64, "bytes_over": np.int64, "variables": str})
