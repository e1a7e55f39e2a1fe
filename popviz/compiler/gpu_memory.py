"""GPU memory: the recorded tensors' lifetimes replayed, in the order the schedule runs the
actions on each GPU, through the caching allocator model (`gpu_alloc.py`).

Steady state of a training step, as PyTorch runs it: parameters, buffers and optimiser
state exist before the step (a 0-dim state such as Adam's `step` lives on the host);
gradients are made by the backward (`zero_grad(set_to_none=True)` freed them) and held to
the end; everything else lives from the op that makes it to the last op that touches it on
that GPU (the recorder's `last_use` and the dataflow), one copy per micro-batch. A tensor
another stage reads is received there before its first reader and freed after its last.
With recomputation, a tensor of a recomputed section is freed after its last forward
reader and made again by its recompute op (checkpoints and section outputs are kept).
Recompute ops run inside the backward action, in program order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.compiler.gpu_alloc import CachingAllocator, round_size
from popviz.compiler.memory import consumers

PERSISTENT = ("parameter", "optimiser_state")
# recompute runs inside backward; W (a zero-bubble schedule's weight gradient) apart
PASS_KEY = {"F": "F", "R": "B", "B": "B", "W": "W", "WU": "WU"}
KEY_RANK = {"F": 0, "B": 1, "W": 2, "WU": 3}
PHASE_OF = {"F": "forward", "B": "backward", "W": "backward", "WU": "optimiser"}


@dataclass
class GpuMemory:
    liveness: pd.DataFrame
    variables: pd.DataFrame
    peak_allocated: np.ndarray  # per GPU, bytes (max_memory_allocated)
    peak_reserved: np.ndarray  # per GPU (max_memory_reserved)
    persistent: np.ndarray  # per GPU: parameters and optimiser state (rounded blocks)
    stash_per_microbatch: np.ndarray  # per stage: forward bytes held for the backward


def replay_memory(ops: pd.DataFrame, tensors: pd.DataFrame, tensor_stage: np.ndarray,
                  executed: pd.DataFrame, stage_gpu: np.ndarray, num_gpus: int,
                  persistent_grads: bool = False, step_bytes: np.ndarray | None = None,
                  split_weight: bool = False, copies: dict[int, list[int]] | None = None
                  ) -> GpuMemory:
    """`ops` in program order with stage, pass, step, source_op, checkpoint, section;
    `executed`: the schedule's actions with `gpu` and `start` as timed; `split_weight`:
    the schedule runs the ops of `grad_part` "weight" in W actions, apart from B; `copies`:
    per tensor row, the other GPUs that hold a copy of it for the whole step (a tied
    weight's parameter, gradient and optimiser state: `gpu_compile.tied_copies`). The precision
    recipe (`gpu_recipe.py`) may keep the gradients from before the step (a grad buffer,
    `persistent_grads`) and add `step_bytes[stage]` for the length of each optimiser step
    (fp32 copies of fp16 grads)."""
    t = tensors.reset_index(drop=True)
    n_stages = len(stage_gpu)
    cat = t["category"].to_numpy(str)
    nbytes = t["bytes"].to_numpy(np.int64)
    host_scalar = (cat == "optimiser_state") & (t["shape"].astype(str).isin(["[]", "()", ""])
                                                .to_numpy())
    persistent = np.isin(cat, PERSISTENT + (("gradient",) if persistent_grads else ())) \
        & ~host_scalar

    ops = ops.reset_index(drop=True)
    real = ops["source_op"].to_numpy() < 0
    row_of = pd.Series(np.flatnonzero(real), index=ops["op_id"].to_numpy()[real])
    o_stage = ops["stage"].to_numpy(np.int64)
    o_key = np.array([PASS_KEY.get(p, "F") for p in ops["pass"].astype(str)])
    if split_weight and "grad_part" in ops:
        o_key[(ops["grad_part"].astype(str) == "weight").to_numpy()] = "W"
    o_step = ops["step"].to_numpy(np.int64)
    # position of each row in its (stage, pass key) list: the order an action runs them
    order = np.lexsort((o_step, o_key, o_stage))
    pos = np.zeros(len(ops), dtype=np.int64)
    lists: dict[tuple[int, str], list[int]] = defaultdict(list)
    for r in order.tolist():
        key = (int(o_stage[r]), str(o_key[r]))
        pos[r] = len(lists[key])
        lists[key].append(r)

    pairs = consumers(ops, t, row_of)
    tix = pd.Series(np.arange(len(t)), index=t["tensor_id"].to_numpy())
    touch_t = tix.reindex(pairs["tensor_id"].to_numpy()).to_numpy(np.int64)
    touch_r = pairs["row"].to_numpy(np.int64)
    prod = row_of.reindex(t["producer"].to_numpy()).to_numpy()
    has_p = ~np.isnan(prod)
    last = row_of.reindex(t["last_use"].to_numpy()).to_numpy()
    extra = np.flatnonzero(has_p | ~np.isnan(last))
    rows_p = np.where(has_p, prod, last)[extra].astype(np.int64)
    touch_t = np.concatenate([touch_t, extra, np.flatnonzero(~np.isnan(last))])
    touch_r = np.concatenate([touch_r, rows_p, last[~np.isnan(last)].astype(np.int64)])
    # recompute copies: the R row that remakes each forward op
    rec = ops[~real]
    copy_of = dict(zip(rec["source_op"].astype(int), rec.index.astype(int), strict=True))
    checkpoint = ops["checkpoint"].to_numpy(bool)
    op_id = ops["op_id"].to_numpy(np.int64)
    section = ops["section"].to_numpy(np.int64) if "section" in ops else np.zeros(len(ops))

    allocs: dict[tuple[int, str, int], list[tuple[int, bool]]] = defaultdict(list)
    frees: dict[tuple[int, str, int], list[int]] = defaultdict(list)

    def at(r: int) -> tuple[int, str, int]:
        return (int(o_stage[r]), str(o_key[r]), int(pos[r]))

    def later(r1: int, r2: int) -> bool:
        return (KEY_RANK[o_key[r1]], pos[r1]) > (KEY_RANK[o_key[r2]], pos[r2])

    by_tensor: dict[int, list[int]] = defaultdict(list)
    for ti, r in zip(touch_t.tolist(), touch_r.tolist(), strict=True):
        by_tensor[ti].append(r)
    stash = np.zeros(n_stages)
    for ti, rows in by_tensor.items():
        if persistent[ti] or host_scalar[ti]:
            continue
        shared = cat[ti] == "gradient"
        home = int(o_stage[int(prod[ti])]) if has_p[ti] else int(tensor_stage[ti])
        per_stage: dict[int, list[int]] = defaultdict(list)
        for r in rows:
            per_stage[int(o_stage[r])].append(r)
        for st, rs in per_stage.items():
            first = min(rs, key=lambda r: (KEY_RANK[str(o_key[r])], pos[r]))
            last_r = max(rs, key=lambda r: (KEY_RANK[str(o_key[r])], pos[r]))
            born = int(prod[ti]) if (has_p[ti] and st == home) else first
            if shared and not (has_p[ti] and st == home):
                continue  # a gradient lives where it is made
            copy = copy_of.get(int(op_id[born])) if has_p[ti] else None
            kept = copy is None or checkpoint[born] or any(
                o_key[r] == "F" and section[r] != section[born] for r in rs)
            mine = shared or o_key[born] == "WU"
            allocs[at(born)].append((ti, mine))
            if not kept:  # freed after its last forward touch, remade by its recompute op
                assert copy is not None  # not kept: it has a recompute copy
                fwd = [r for r in rs if o_key[r] == "F"] or [born]
                frees[at(max(fwd, key=lambda r: pos[r]))].append(ti)
                allocs[at(copy)].append((ti, False))
                last_r = max([r for r in rs if o_key[r] in ("B", "W")] or [copy],
                             key=lambda r: (KEY_RANK[str(o_key[r])], pos[r]))
                if later(copy, last_r):
                    last_r = copy
            if not shared:
                frees[at(last_r)].append(ti)
            if o_key[born] == "F" and o_key[last_r] in ("B", "W") and kept:
                stash[st] += nbytes[ti]

    step = np.zeros(n_stages, dtype=np.int64) if step_bytes is None else step_bytes
    return _replay(ops, t, allocs, frees, lists, executed, stage_gpu, num_gpus, persistent,
                   tensor_stage, nbytes, stash, step, copies or {})


def _replay(ops: pd.DataFrame, t: pd.DataFrame, allocs: dict, frees: dict, lists: dict,
            executed: pd.DataFrame, stage_gpu: np.ndarray, num_gpus: int,
            persistent: np.ndarray, tensor_stage: np.ndarray, nbytes: np.ndarray,
            stash: np.ndarray, step_bytes: np.ndarray, copies: dict[int, list[int]]
            ) -> GpuMemory:
    names = t["name"].astype(str).to_numpy()
    cats = t["category"].astype(str).to_numpy()
    op_names = ops["op"].astype(str).to_numpy()
    op_ids = ops["op_id"].to_numpy(np.int64)
    allocators = [CachingAllocator() for _ in range(num_gpus)]
    always = np.zeros(num_gpus, dtype=np.int64)
    for ti in np.flatnonzero(persistent).tolist():  # before the step, in tensor order
        g = int(stage_gpu[min(int(tensor_stage[ti]), len(stage_gpu) - 1)])
        always[g] += allocators[g].malloc(_handle(ti, -1, -1), int(nbytes[ti]))
    for ti, gpus in sorted(copies.items()):  # a tied weight's copies, whole step
        for g in gpus:
            if 0 <= g < num_gpus and (persistent[ti] or cats[ti] == "gradient"):
                always[g] += allocators[g].malloc(_handle(ti, -2 - g, -1), int(nbytes[ti]))
    for a in allocators:
        a.reset_peaks()
    # (gpu, stage, tensor) -> {micro-batch: step made}: a stage's own copy of a tensor
    live: dict[tuple[int, int, int], dict[int, int]] = defaultdict(dict)
    sizes: dict[tuple[int, int, int, int], int] = {}  # (gpu, stage, tensor, mb) -> block
    steps = np.zeros(num_gpus, dtype=np.int64)
    rows: list[tuple] = []
    var_rows: list[tuple] = []
    acts = executed.sort_values(["start", "gpu"], kind="stable")
    for s, m, p, g in zip(acts["stage"].to_numpy(), acts["microbatch"].to_numpy(),
                          acts["pass"].astype(str), acts["gpu"].to_numpy(), strict=True):
        if p == "R":
            continue  # recompute ops run within the backward action, in program order
        s, m, g = int(s), int(m), int(g)
        key = PASS_KEY[p]
        alloc = allocators[g]
        transient = int(step_bytes[s]) if key == "WU" else 0
        if transient:  # for the whole step, after the pipeline freed its activations
            transient = alloc.malloc(_handle(-1, s, -1), transient)
            made = int(steps[g])
        for k, r in enumerate(lists.get((s, key), ())):
            step = int(steps[g])
            for ti, mine in allocs.get((s, key, k), ()):
                mb = -1 if mine else m
                held = live[(g, s, ti)]
                if mb in held:
                    continue  # a gradient accumulates into the one it has
                # the block it is given: a block the allocator does not split holds more
                # than the request, and `allocated` (the liveness) counts all of it
                sizes[(g, s, ti, mb)] = alloc.malloc(_handle(ti, s, mb), int(nbytes[ti]))
                held[mb] = step
            peak = alloc.allocated
            for ti in frees.get((s, key, k), ()):
                held = live[(g, s, ti)]
                for mb in ([m] if m >= 0 and key != "WU" else list(held)):
                    if mb in held:
                        alloc.free(_handle(ti, s, mb))
                        var_rows.append((g, names[ti], cats[ti], sizes.pop((g, s, ti, mb)),
                                         held.pop(mb), step, s))
            rows.append((g, step, PHASE_OF[key], int(always[g]), int(peak - always[g]),
                         int(alloc.reserved), op_names[r], int(op_ids[r]), m, s,
                         "B" if p == "W" else p))
            steps[g] += 1
        if transient:
            alloc.free(_handle(-1, s, -1))
            var_rows.append((g, "optimiser step: fp32 copies of the grads", "temporary",
                             transient, made, max(int(steps[g]) - 1, made), s))
    for ti, gpus in sorted(copies.items()):
        for g in gpus:
            if 0 <= g < num_gpus and (persistent[ti] or cats[ti] == "gradient"):
                var_rows.append((g, f"{names[ti]} (copy on GPU {g})", cats[ti],
                                 round_size(int(nbytes[ti])), 0, max(int(steps[g]) - 1, 0),
                                 int(tensor_stage[ti])))
    for (g, s, ti), held in live.items():  # still held at the end (gradients, outputs)
        for mb, first in held.items():
            var_rows.append((g, names[ti], cats[ti], sizes.pop((g, s, ti, mb)), first,
                             max(int(steps[g]) - 1, first), s))
    liveness = pd.DataFrame(rows, columns=["ipu", "step", "phase", "always_live_bytes",
                                           "not_always_live_bytes", "reserved_bytes", "label",
                                           "op_id", "microbatch", "stage", "pass"])
    liveness = liveness.astype({"ipu": np.int64, "step": np.int64, "always_live_bytes": np.int64,
                                "not_always_live_bytes": np.int64, "reserved_bytes": np.int64,
                                "op_id": np.int64, "microbatch": np.int64, "stage": np.int64})
    variables = pd.DataFrame(var_rows, columns=["ipu", "name", "category", "bytes",
                                                "first_step", "last_step", "stage"])
    variables = variables.astype({"ipu": np.int64, "bytes": np.int64, "first_step": np.int64,
                                  "last_step": np.int64, "stage": np.int64})
    return GpuMemory(liveness, variables,
                     np.array([a.peak_allocated for a in allocators], dtype=np.int64),
                     np.array([a.peak_reserved for a in allocators], dtype=np.int64),
                     always, stash.astype(np.int64))


def _handle(tensor: int, stage: int, microbatch: int) -> int:
    """One allocation's key: a tensor's copy on a stage for one micro-batch (-1: shared)."""
    return (tensor * 4099 + stage + 1) * 1_000_003 + microbatch + 1
