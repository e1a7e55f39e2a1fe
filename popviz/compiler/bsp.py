"""Bulk-synchronous timing of a schedule: each superstep is compute, sync, exchange (a
Grouped training clock: its forwards, a sync, its recomputes and backwards, then sync and
exchange).

Every IPU waits at the sync for the slowest one (that wait is `idle`), then all transfers
of the superstep run (IPU-Links in parallel, host stream copies share the PCIe link).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.compiler.schedule import Schedule
from popviz.target.machines import Target

KIND_CODES = ("compute", "exchange", "sync", "host_io", "idle")


@dataclass
class StageCosts:
    """Per-stage inputs of the timing, per micro-batch (WU per weight update)."""

    ipu: np.ndarray
    forward: np.ndarray
    recompute: np.ndarray
    backward: np.ndarray
    optimiser: np.ndarray
    boundary_bytes: np.ndarray  # activation bytes into stage s (0 for stage 0)
    grad_bytes: np.ndarray  # weight-gradient bytes to all-reduce, per stage
    offload_bytes: np.ndarray  # optimiser state streamed in and out per WU, per stage
    input_bytes: int  # host -> first stage per micro-batch
    output_bytes: int  # last stage -> host per micro-batch
    # the weight-gradient part of `backward` per stage (GPU plans: zero-bubble schedules
    # run it apart as W)
    weight_grad: np.ndarray | None = None


@dataclass
class Timing:
    trace: pd.DataFrame
    exchange: pd.DataFrame
    superstep_start: np.ndarray
    superstep_end: np.ndarray
    total_cycles: int
    latency_cycles: float  # mean host-in to host-out of one micro-batch
    phase_cycles: dict[str, int]  # ramp_up, main, ramp_down, update


def _transfers(schedule: Schedule, costs: StageCosts, target: Target,
               replicas: int) -> pd.DataFrame:
    a = schedule.actions
    n = len(costs.ipu)
    k, s, mb, ps = (a["superstep"].to_numpy(), a["stage"].to_numpy(),
                    a["microbatch"].to_numpy(), a["pass"].to_numpy(str))
    cols: dict[str, list[np.ndarray]] = {c: [] for c in
                                         ("k", "src", "dst", "bytes", "kind", "stage", "mb")}

    def add(mask: np.ndarray, kk, src, dst, nbytes, kind: str, stage) -> None:
        m = int(mask.sum())
        if not m:
            return
        for name, value in (("k", kk), ("src", src), ("dst", dst), ("bytes", nbytes),
                            ("stage", stage)):
            cols[name].append(np.broadcast_to(np.asarray(value, dtype=object)
                                              if name in ("src", "dst") else value,
                                              mask.shape)[mask])
        cols["kind"].append(np.full(m, kind, dtype=object))
        cols["mb"].append(mb[mask] if kind not in ("allreduce", "weights") else np.full(m, -1))

    ipu = costs.ipu
    fwd, bwd = ps == "F", ps == "B"
    nxt = np.minimum(s + 1, n - 1)
    add(fwd & (s < n - 1) & (ipu[s] != ipu[nxt]), k, ipu[s], ipu[nxt],
        costs.boundary_bytes[nxt], "activation", s)
    prv = np.maximum(s - 1, 0)
    add(bwd & (s > 0) & (ipu[s] != ipu[prv]), k, ipu[s], ipu[prv],
        costs.boundary_bytes[s], "gradient", s)
    add(fwd & (s == 0), k - 1, "host", ipu[0], costs.input_bytes, "host_in", s)
    add(fwd & (s == n - 1), k, ipu[n - 1], "host", costs.output_bytes, "host_out", s)
    wu = ps == "WU"
    add(wu & (costs.offload_bytes[s] > 0), k, "host", ipu[s], costs.offload_bytes[s],
        "host_in", s)
    add(wu & (costs.offload_bytes[s] > 0), k, ipu[s], "host", costs.offload_bytes[s],
        "host_out", s)
    if replicas > 1 and len(schedule.allreduce_steps):
        ks = np.repeat(schedule.allreduce_steps, n)
        ss = np.tile(np.arange(n), len(schedule.allreduce_steps))
        ring = costs.grad_bytes[ss] * 2.0 * (replicas - 1) / replicas
        add(np.ones(len(ks), dtype=bool), ks, ipu[ss], ipu[ss], ring.astype(np.int64),
            "allreduce", ss)
    if not cols["k"]:
        return pd.DataFrame({c: [] for c in (*cols, "cycles")})
    out = pd.DataFrame({c: np.concatenate(v) for c, v in cols.items()})
    out = out[out["bytes"].astype(np.int64) > 0].reset_index(drop=True)
    nbytes = out["bytes"].to_numpy(np.float64)
    host = out["kind"].isin(["host_in", "host_out"]).to_numpy()
    cyc = np.where(host, [target.host_cycles(b) for b in nbytes],
                   [target.stage_copy_cycles(b) for b in nbytes])
    ar = (out["kind"] == "allreduce").to_numpy()
    if ar.any():  # the ring in a rack, and across racks over GW-Links where replicas span them
        per_replica = len(np.unique(ipu))
        grads = costs.grad_bytes[out.loc[ar, "stage"].to_numpy(np.int64)]
        cyc[ar] = [target.allreduce_cycles(float(g), replicas, per_replica) for g in grads]
    out["cycles"] = np.ceil(cyc).astype(np.int64)
    return out


def time_schedule(schedule: Schedule, costs: StageCosts, target: Target, num_ipus: int,
                  replicas: int, overlap_host: bool = False) -> Timing:
    a = schedule.actions
    K, n = schedule.num_supersteps, len(costs.ipu)
    s = a["stage"].to_numpy()
    ps = a["pass"].to_numpy(str)
    # compute segments: one per action, back to back in action order on each IPU
    per_pass = {"F": costs.forward, "R": costs.recompute, "B": costs.backward,
                "WU": costs.optimiser}
    seg_rows = []
    for p, cycles in per_pass.items():
        m = ps == p
        seg_rows.append(pd.DataFrame({
            "order": np.flatnonzero(m), "k": a["superstep"].to_numpy()[m], "stage": s[m],
            "microbatch": a["microbatch"].to_numpy()[m], "pass": p,
            "dur": cycles[s[m]].astype(np.int64)}))
    seg = pd.concat(seg_rows, ignore_index=True)
    seg = seg[seg["dur"] > 0].sort_values("order", kind="stable").reset_index(drop=True)
    seg["ipu"] = costs.ipu[seg["stage"].to_numpy()]
    # with one group a clock runs every pass back to back
    forward = (seg["pass"] == "F").to_numpy() & grouped_clocks(schedule)
    busy_f, busy_rb = group_busy(seg["k"].to_numpy(), seg["ipu"].to_numpy(),
                                 seg["dur"].to_numpy(np.int64), forward, (K, num_ipus))
    busy = busy_f + busy_rb
    f_len, rb_len = ((b.max(axis=1) if num_ipus else np.zeros(K, dtype=np.int64))
                     for b in (busy_f, busy_rb))
    # a Grouped clock: every forward, a sync, then every recompute and backward
    mid = np.where((f_len > 0) & (rb_len > 0), target.sync_cycles, 0).astype(np.int64)
    compute_len = f_len + mid + rb_len

    tr = _transfers(schedule, costs, target, replicas)
    link_x = np.zeros((K, num_ipus), dtype=np.int64)
    host_x = np.zeros((K, num_ipus), dtype=np.int64)
    host_total = np.zeros(K, dtype=np.int64)
    if len(tr):
        tk = tr["k"].to_numpy(np.int64)
        tc = tr["cycles"].to_numpy(np.int64)
        is_host = tr["kind"].isin(["host_in", "host_out"]).to_numpy()
        for col in ("src", "dst"):
            v = tr[col].to_numpy(object)
            on = np.array([x != "host" for x in v], dtype=bool)
            idx = np.where(on, v, 0).astype(np.int64)
            lm = on & ~is_host
            np.maximum.at(link_x, (tk[lm], idx[lm]), tc[lm])
            hm = on & is_host
            np.add.at(host_x, (tk[hm], idx[hm]), tc[hm])
        np.add.at(host_total, tk[is_host], tc[is_host])
    if overlap_host:  # I/O tiles copy the next iteration's streams during this compute:
        # only what the compute does not cover waits (PopTorch's overlapped I/O)
        host_x = np.maximum(host_x - busy, 0)
        host_total = np.maximum(host_total - compute_len, 0)
    if K and num_ipus:  # the host call's fixed cost (stream setup, program start) opens it
        call = int(np.ceil(getattr(target, "host_call_cycles", 0.0)))
        host_x[0, int(costs.ipu[0])] += call
        host_total[0] += call
    x_len = np.maximum((link_x + host_x).max(axis=1), host_total)
    sync = np.full(K, target.sync_cycles, dtype=np.int64)
    length = compute_len + sync + x_len
    start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
    end = start + length

    # compute events, back to back within (superstep, ipu, group)
    offs = seg.groupby([seg["k"], seg["ipu"], forward])["dur"].cumsum().to_numpy() \
        - seg["dur"].to_numpy()
    seg_k = seg["k"].to_numpy()
    c_start = start[seg_k] + offs + np.where(forward, 0, f_len[seg_k] + mid[seg_k])
    stage_of_ipu = np.full(num_ipus, -1, dtype=np.int64)
    for st in range(n - 1, -1, -1):
        stage_of_ipu[costs.ipu[st]] = st
    kk, ii = (a.ravel() for a in np.meshgrid(np.arange(K), np.arange(num_ipus), indexing="ij"))
    bf, brb = busy_f.ravel(), busy_rb.ravel()
    sync_at = start[kk] + compute_len[kk]
    rb0 = start[kk] + f_len[kk] + mid[kk]  # where the recompute / backward group starts
    x0 = sync_at + sync[kk]
    lx, hx = link_x.ravel(), host_x.ravel()
    phase = schedule_phases(schedule, n)
    pieces = [
        (seg["k"].to_numpy(), seg["ipu"].to_numpy(), c_start,
         c_start + seg["dur"].to_numpy(), "compute",
         seg["stage"].to_numpy(), seg["microbatch"].to_numpy(), seg["pass"].to_numpy(str),
         (seg["pass"] + seg["stage"].astype(str) + " mb" + seg["microbatch"].astype(str))
         .to_numpy(str)),
    ]

    def ipu_events(mask, t0, t1, kind, label):
        m = mask & (t1 > t0)
        pieces.append((kk[m], ii[m], t0[m], t1[m], kind, stage_of_ipu[ii[m]], np.full(m.sum(), -1),
                       np.full(m.sum(), ""), np.full(m.sum(), label)))

    ones = np.ones(len(kk), dtype=bool)
    split = mid[kk] > 0
    ipu_events(split, start[kk] + bf, start[kk] + f_len[kk], "idle", "wait for sync")
    ipu_events(split, start[kk] + f_len[kk], rb0, "sync", "sync")
    ipu_events(ones, np.where(split, rb0 + brb, start[kk] + bf + brb), sync_at, "idle",
               "wait for sync")
    ipu_events(ones, sync_at, x0, "sync", "sync")
    ipu_events(ones, x0, x0 + lx, "exchange", "exchange")
    ipu_events(ones, x0 + lx, x0 + lx + hx, "host_io", "host stream copy")
    ipu_events(ones, x0 + lx + hx, end[kk], "idle", "wait for exchange")
    cols = ("superstep", "ipu", "start", "end", "kind", "stage", "microbatch", "pass", "op")
    trace = pd.DataFrame({c: np.concatenate([np.broadcast_to(np.asarray(p[i]), p[0].shape)
                                             for p in pieces]) for i, c in enumerate(cols)})
    trace = trace.astype({"ipu": np.int64, "start": np.int64, "end": np.int64,
                          "stage": np.int64, "microbatch": np.int64, "superstep": np.int64})
    trace["schedule_phase"] = phase[trace["superstep"].to_numpy()]
    for c in ("kind", "pass", "op", "schedule_phase"):
        trace[c] = trace[c].astype(str)
    trace = trace[[*cols[1:], "superstep", "schedule_phase"]]
    trace = trace.sort_values(["ipu", "start", "end"], kind="stable").reset_index(drop=True)

    exchange = pd.DataFrame({
        "src": tr["src"].astype(object) if len(tr) else pd.Series(dtype=object),
        "dst": tr["dst"].astype(object) if len(tr) else pd.Series(dtype=object),
        "bytes": tr["bytes"].astype(np.int64) if len(tr) else pd.Series(dtype=np.int64),
    })
    if len(tr):
        tk = tr["k"].to_numpy(np.int64)
        exchange["start"] = start[tk] + compute_len[tk] + sync[tk]
        exchange["end"] = exchange["start"] + tr["cycles"].to_numpy(np.int64)
        exchange["kind"] = tr["kind"].astype(str).to_numpy()
        exchange["stage"] = tr["stage"].astype(np.int64).to_numpy()
        exchange["microbatch"] = tr["mb"].astype(np.int64).to_numpy()
    else:
        for c in ("start", "end", "stage", "microbatch"):
            exchange[c] = pd.Series(dtype=np.int64)
        exchange["kind"] = pd.Series(dtype=str)

    latency = _latency(a, n, start, end, compute_len, sync)
    phase_cycles = {p: int(length[phase == p].sum()) for p in PHASES}
    return Timing(trace, exchange, start, end, int(end[-1]) if K else 0, latency,
                  phase_cycles)


PHASES = ("ramp_up", "main", "ramp_down", "update")


def grouped_clocks(schedule: Schedule) -> bool:
    """Whether each clock runs as two groups: TensorFlow's Grouped schedule runs every
    stage's forward, then every stage's recompute and backward ("at any given point in
    time, the pipelined stages are either all running their forward pass or all running
    their backward pass": graphcore/tutorials tutorials/tensorflow1/pipelining/README.md,
    Grouped Scheduling): a sync between the groups; the copies to the neighbouring IPUs
    stay at the clock's end, where the next clock needs them."""
    return schedule.name == "Grouped" and bool((schedule.actions["pass"] == "B").any())


def group_busy(superstep: np.ndarray, ipu: np.ndarray, cycles: np.ndarray,
               forward: np.ndarray, shape: tuple[int, int]
               ) -> tuple[np.ndarray, np.ndarray]:
    """Each (superstep, IPU)'s compute in the forward group and in the other (recompute,
    backward, WU): `forward` marks the actions of the first group (none without Grouped
    clocks)."""
    groups = []
    for m in (forward, ~forward):
        busy = np.zeros(shape, dtype=cycles.dtype)
        np.add.at(busy, (superstep[m], ipu[m]), cycles[m])
        groups.append(busy)
    return groups[0], groups[1]


def schedule_phases(schedule: Schedule, num_stages: int) -> np.ndarray:
    """Label each superstep: `main` when every stage works (always, for one-at-a-time
    schedules), `update` for all-reduce and WU, else `ramp_up` before a main phase and
    `ramp_down` after it."""
    K = schedule.num_supersteps
    a = schedule.actions
    label = np.full(K, "", dtype=object)
    work = a[a["pass"] != "WU"]
    busy = np.zeros(K, dtype=np.int64)
    per_step = work.groupby("superstep")["stage"].nunique()
    busy[per_step.index.to_numpy()] = per_step.to_numpy()
    update = np.zeros(K, dtype=bool)
    update[a.loc[a["pass"] == "WU", "superstep"].to_numpy()] = True
    update[schedule.allreduce_steps] = True
    main = (busy == num_stages) | ((schedule.name == "Sequential") & (busy > 0))
    label[main] = "main"
    label[update] = "update"
    nxt = ""  # scanning backwards: is the next labelled superstep a main one?
    for k in range(K - 1, -1, -1):
        if label[k]:
            nxt = label[k]
            continue
        label[k] = "ramp_up" if nxt == "main" else "ramp_down"
    return label.astype(str)


def _latency(a: pd.DataFrame, n: int, start: np.ndarray, end: np.ndarray,
             compute_len: np.ndarray, sync: np.ndarray) -> float:
    """Mean time from a micro-batch's host-in to the end of its last forward superstep
    (host-out included): the latency of one batch in inference."""
    f = a[a["pass"] == "F"]
    first = f[f["stage"] == 0].set_index("microbatch")["superstep"]
    last = f[f["stage"] == n - 1].set_index("microbatch")["superstep"]
    both = pd.concat([first.rename("a"), last.rename("b")], axis=1, join="inner")
    if both.empty:
        return 0.0
    k0 = both["a"].to_numpy() - 1
    t0 = start[k0] + compute_len[k0] + sync[k0]
    t1 = end[both["b"].to_numpy()]
    return float(np.mean(t1 - t0))
