"""Timing a schedule on GPUs: each GPU runs its actions in schedule order on one compute
stream; NCCL transfers run on their own stream (asynchronous: the sender goes on), or,
under Megatron-LM's recipes, block the sender until they are done (`blocking_sends`).

Unlike the IPUs' BSP there is no global sync: an action starts when its GPU is free and
its inputs have arrived: F(s, m) after F(s-1, m) plus the activation's P2P transfer, B(s, m)
after B(s+1, m) plus the gradient's, R(s, m) right before B(s, m), W(s, m) (a zero-bubble
schedule's weight gradient, split from B) after B(s, m), WU(s) after the stage's
data-parallel all-reduce (a ring over the replicas, after its last backward: no overlap
with the backward is modelled, an upper bound). Transfers are alpha-beta
(`GpuTarget.p2p_ns` / `allreduce_ns`) over the link `gpu_fabric.Fabric` says each crosses:
NVLink, PCIe or the network between servers. Times in ns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.compiler.bsp import PHASES, StageCosts, schedule_phases
from popviz.compiler.gpu_fabric import Fabric
from popviz.compiler.schedule import Schedule
from popviz.target.gpu import GpuTarget

TRACE_COLUMNS = ("ipu", "start", "end", "kind", "stage", "microbatch", "pass", "op",
                 "superstep", "schedule_phase", "grad_part")


@dataclass
class GpuTiming:
    trace: pd.DataFrame
    exchange: pd.DataFrame
    actions: pd.DataFrame  # superstep, stage, microbatch, pass, gpu, start, end (executed)
    total_ns: int
    latency_ns: float  # mean first-stage start to last-stage F end of a micro-batch
    phase_ns: dict[str, int]


def time_gpu_schedule(schedule: Schedule, costs: StageCosts, target: GpuTarget,
                      num_gpus: int, replicas: int, fabric: Fabric | None = None,
                      blocking_sends: bool = False) -> GpuTiming:
    """`fabric` says which link each transfer crosses (gpu_fabric.py; default: the ranks
    laid out on `target`'s servers). `blocking_sends`: the sender's compute waits for its
    send to finish before its next action, as Megatron-LM's batched p2p does
    (`_communicate`: `req.wait()` on every request, then `torch.cuda.synchronize()`)."""
    fabric = fabric or Fabric(target, num_gpus, replicas)
    a = schedule.actions.reset_index(drop=True)
    n = len(costs.ipu)
    weight = costs.weight_grad if costs.weight_grad is not None and \
        schedule.split_backward else np.zeros_like(costs.backward)
    per_pass = {"F": costs.forward, "R": costs.recompute, "B": costs.backward - weight,
                "W": weight, "WU": costs.optimiser}
    gpu = costs.ipu[a["stage"].to_numpy()]
    dur = np.array([int(per_pass[p][s]) for p, s in zip(a["pass"], a["stage"], strict=True)],
                   dtype=np.int64)
    free_at = np.zeros(max(num_gpus, 1), dtype=np.float64)
    done: dict[tuple[int, int, str], float] = {}
    start = np.zeros(len(a))
    end = np.zeros(len(a))
    events: list[tuple] = []  # (gpu, start, end, kind, stage, mb, pass, op, superstep, part)
    xfers: list[tuple] = []  # (src, dst, bytes, start, end, kind, stage, mb)
    last_b: dict[int, float] = {}
    for i, (k, s, m, p) in enumerate(zip(a["superstep"].to_numpy(), a["stage"].to_numpy(),
                                         a["microbatch"].to_numpy(), a["pass"], strict=True)):
        s, m, g = int(s), int(m), int(gpu[i])
        ready = free_at[g]
        if p == "F":
            if s == 0:  # the micro-batch's input, host -> device, before it is read
                copy = target.host_ns(costs.input_bytes)
                t0 = free_at[g]
                events.append((g, t0, t0 + copy, "host_io", s, m, "", "input copy", k, ""))
                xfers.append(("host", g, costs.input_bytes, t0, t0 + copy, "host_in", s, m))
                ready = t0 + copy
            else:
                ready = max(ready, _arrive(done[(s - 1, m, "F")], costs.ipu[s - 1], g,
                                           costs.boundary_bytes[s], target, fabric, xfers,
                                           events, "activation", s - 1, m, k))
        elif p in ("B", "R"):
            if s < n - 1 and (s + 1, m, "B") in done:
                ready = max(ready, _arrive(done[(s + 1, m, "B")], costs.ipu[s + 1], g,
                                           costs.boundary_bytes[s + 1], target, fabric,
                                           xfers, events, "gradient", s + 1, m, k,
                                           once=p == "R" or (s, m, "R") not in done))
            if p == "B" and (s, m, "R") in done:
                ready = max(ready, done[(s, m, "R")])
        elif p == "W":
            ready = max(ready, done[(s, m, "B")])
        elif p == "WU":
            t0 = max(ready, last_b.get(s, ready))
            ar = target.allreduce_ns(costs.grad_bytes[s], replicas, fabric.allreduce_link(g))
            if ar > 0:
                events.append((g, t0, t0 + ar, "exchange", s, -1, "", "all-reduce", k, ""))
                xfers.append((g, g, int(costs.grad_bytes[s] * 2 * (replicas - 1) / replicas),
                              t0, t0 + ar, "allreduce", s, -1))
            ready = t0 + ar
        start[i], end[i] = ready, ready + dur[i]
        free_at[g] = end[i]
        if blocking_sends:  # F sends its activation on, B its gradient back
            to, nbytes = (s + 1, costs.boundary_bytes[s + 1]) if p == "F" and s < n - 1 \
                else (s - 1, costs.boundary_bytes[s]) if p == "B" and s > 0 else (s, 0)
            if nbytes > 0 and int(costs.ipu[to]) != g:
                free_at[g] = end[i] + target.p2p_ns(int(nbytes), fabric.p2p_link(
                    g, int(costs.ipu[to])))
        done[(s, m, p)] = end[i]
        if p in ("B", "W"):
            last_b[s] = max(last_b.get(s, 0.0), end[i])
        if dur[i] > 0:  # W is a part of the backward: pass B, its part in `grad_part`
            part = {"W": "weight", "B": "input"}.get(p, "") if schedule.split_backward else ""
            events.append((g, start[i], end[i], "compute", s, m, "B" if p == "W" else p,
                           f"{p}{s} mb{m}", k, part))
    total = float(max(end.max() if len(end) else 0.0,
                      max((e[2] for e in events), default=0.0)))
    executed = a.assign(gpu=gpu, start=np.round(start).astype(np.int64),
                        end=np.round(end).astype(np.int64))
    trace = _trace(events, num_gpus, total, schedule, n, costs.ipu)
    exchange = pd.DataFrame(xfers, columns=["src", "dst", "bytes", "start", "end", "kind",
                                            "stage", "microbatch"])
    exchange = exchange.astype({"bytes": np.int64, "stage": np.int64, "microbatch": np.int64})
    for c in ("start", "end"):
        exchange[c] = np.round(exchange[c].to_numpy(np.float64)).astype(np.int64)
    for c in ("src", "dst"):
        exchange[c] = exchange[c].astype(object)
    exchange["kind"] = exchange["kind"].astype(str)
    return GpuTiming(trace, exchange, executed, round(total),
                     _latency(executed, n), _phases(trace))


def _arrive(sent: float, src: int, dst: int, nbytes: int, target: GpuTarget, fabric: Fabric,
            xfers: list, events: list, kind: str, stage: int, m: int, k: int,
            once: bool = True) -> float:
    """When data made at `sent` on `src` is on `dst` (a NCCL send / recv)."""
    if src == dst or nbytes <= 0:
        return sent
    arrive = sent + target.p2p_ns(nbytes, fabric.p2p_link(src, dst))
    if once:
        xfers.append((src, dst, int(nbytes), sent, arrive, kind, stage, m))
        for g in (src, dst):
            events.append((g, sent, arrive, "exchange", stage, m, "", f"{kind} p2p", k, ""))
    return arrive


def _trace(events: list, num_gpus: int, total: float, schedule: Schedule, n: int,
           stage_gpu: np.ndarray) -> pd.DataFrame:
    ev = pd.DataFrame(events, columns=["ipu", "start", "end", "kind", "stage", "microbatch",
                                       "pass", "op", "superstep", "grad_part"])
    ev["start"] = np.round(ev["start"].to_numpy(np.float64)).astype(np.int64)
    ev["end"] = np.round(ev["end"].to_numpy(np.float64)).astype(np.int64)
    idle = []
    first_stage = {int(g): s for s, g in reversed(list(enumerate(stage_gpu.tolist())))}
    for g in range(num_gpus):  # gaps where the GPU runs nothing: idle (its first stage's)
        st = first_stage.get(g, -1)
        mine = ev[ev["ipu"] == g].sort_values("start")
        t = 0
        k = 0
        for s0, e0, kk in zip(mine["start"], mine["end"], mine["superstep"], strict=True):
            if s0 > t:
                idle.append((g, t, int(s0), "idle", st, -1, "", "idle", int(kk), ""))
            t, k = max(t, int(e0)), int(kk)
        if total > t:
            idle.append((g, t, round(total), "idle", st, -1, "", "idle", k, ""))
    trace = pd.concat([ev, pd.DataFrame(idle, columns=ev.columns)], ignore_index=True)
    trace = trace[trace["end"] > trace["start"]]
    phase = schedule_phases(schedule, n)
    trace["schedule_phase"] = phase[np.clip(trace["superstep"].to_numpy(np.int64), 0,
                                            len(phase) - 1)] if len(phase) else ""
    trace = trace.astype({"ipu": np.int64, "start": np.int64, "end": np.int64,
                          "stage": np.int64, "microbatch": np.int64, "superstep": np.int64})
    for c in ("kind", "pass", "op", "schedule_phase", "grad_part"):
        trace[c] = trace[c].astype(str)
    return trace[list(TRACE_COLUMNS)].sort_values(["ipu", "start", "end"], kind="stable") \
        .reset_index(drop=True)


def _latency(executed: pd.DataFrame, n: int) -> float:
    f = executed[executed["pass"] == "F"]
    first = f[f["stage"] == 0].set_index("microbatch")["start"]
    last = f[f["stage"] == n - 1].set_index("microbatch")["end"]
    both = pd.concat([first.rename("a"), last.rename("b")], axis=1, join="inner")
    return float((both["b"] - both["a"]).mean()) if len(both) else 0.0


def _phases(trace: pd.DataFrame) -> dict[str, int]:
    """Wall time per schedule phase (each instant once, over all GPUs)."""
    out = {}
    for p in PHASES:
        t = trace[trace["schedule_phase"] == p]
        out[p] = int(t["end"].max() - t["start"].min()) if len(t) else 0
    return out
