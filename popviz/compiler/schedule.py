"""Pipeline schedules as an IR of actions, like torch.distributed.pipelining's.

An action is (superstep, stage, microbatch, pass) with pass F (forward), R (recompute,
right before the B of the same stage and micro-batch, in the same superstep), B
(backward), W (the weight-gradient part of the backward, run apart from B only by the
zero-bubble schedules: B is then the input-gradient part) or WU (weight update). A
schedule places the actions into BSP supersteps; `popviz.compiler.bsp` then times them.
Superstep 0 only streams the first micro-batch in from the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from popviz.actions import PASS_RANK, Action, Pass
from popviz.compiler.schedule_zb import (
    PAPER,
    TORCH,
    ZERO_BUBBLE,
    PassTimes,
    interleaved_zb_orders,
    paper_orders,
    torch_round,
    zbv_orders,
)


@dataclass
class Schedule:
    actions: pd.DataFrame  # superstep, stage, microbatch, pass (sorted)
    allreduce_steps: np.ndarray  # supersteps that only all-reduce gradients
    num_supersteps: int
    stash_depth: np.ndarray  # per stage, micro-batches held between F and B (0 = none)
    name: str
    split_backward: bool = False  # B is the input gradient and W the weight gradient

    def actions_of(self, stage: int) -> list[Action]:
        """The stage's actions in the order it runs them ("0F0", "0B0", "0W0", ...)."""
        mine = self.actions[self.actions["stage"] == stage]
        return [Action(int(s), Pass(p), int(m)) for s, p, m in
                zip(mine["stage"], mine["pass"], mine["microbatch"], strict=True)]


def _grouped(n: int, m: int, training: bool) -> list[tuple[int, int, int, str]]:
    """All stages run each clock: F of micro-batch c - s, then B of c - (2n - 2 - s)."""
    mb, s = (a.ravel() for a in np.meshgrid(np.arange(m), np.arange(n), indexing="ij"))
    rows = [(int(k), int(st), int(b), "F") for k, st, b in zip(mb + s, s, mb, strict=True)]
    if training:
        rows += [(int(k), int(st), int(b), "B")
                 for k, st, b in zip(mb + 2 * n - 2 - s, s, mb, strict=True)]
    return rows


def _interleaved(n: int, m: int, training: bool) -> list[tuple[int, int, int, str]]:
    """1F1B: each stage runs one pass per superstep and a backward as soon as it can;
    the last stage runs a micro-batch's F and B in the same superstep."""
    if not training:
        return _grouped(n, m, False)
    seqs: list[list[tuple[int, str]]] = []
    for s in range(n):
        if s == n - 1:
            seqs.append([(b, "FB") for b in range(m)])
            continue
        warm = min(n - 1 - s, m)
        seq = [(b, "F") for b in range(warm)]
        nf, nb = warm, 0
        while nb < m:
            if nf < m:
                seq.append((nf, "F"))
                nf += 1
            seq.append((nb, "B"))
            nb += 1
        seqs.append(seq)
    done_f = np.full((n, m), -1, dtype=np.int64)
    done_b = np.full((n, m), -1, dtype=np.int64)
    pos = [0] * n
    rows: list[tuple[int, int, int, str]] = []
    k = 0
    while any(pos[s] < len(seqs[s]) for s in range(n)):
        progressed = False
        for s in range(n):
            if pos[s] >= len(seqs[s]):
                continue
            b, kind = seqs[s][pos[s]]
            f_ready = s == 0 or 0 <= done_f[s - 1, b] < k
            if kind == "F" and f_ready:
                done_f[s, b] = k
            elif kind == "FB" and f_ready:
                done_f[s, b] = done_b[s, b] = k
                rows.append((k, s, b, "F"))
                kind = "B"
            elif kind == "B" and 0 <= done_b[s + 1, b] < k:
                done_b[s, b] = k
            else:
                continue
            rows.append((k, s, b, kind))
            pos[s] += 1
            progressed = True
        if not progressed and k > 4 * (m + n) + 8:
            raise RuntimeError("interleaved schedule made no progress")  # a bug, not input
        k += 1
    return rows


def _megatron_interleaved(n: int, m: int, ranks: int) -> list[tuple[int, int, int, str]]:
    """Interleaved 1F1B over `ranks` GPUs holding v = n / ranks stages each (stage c * p + r
    on rank r) in torch.distributed.pipelining's ScheduleInterleaved1F1B order, which is
    Megatron-LM's when m is a multiple of p (MLM `schedules.py`
    `forward_backward_pipelining_with_interleaving`, `get_schedule_table`; PT
    `_get_warmup_ops`): micro-batches in groups of g = m // max(1, m // p), each group
    through chunk 0, then chunk 1, ...; the backward mirrors the chunks. Rank r runs
    min((v - 1) * g + 2 * (p - 1 - r), m * v) warm-up forwards, then a forward and a
    backward in turn, then the rest of the backwards (docs/notes/gpu-plans-v2-research.md
    §6a, §6b). The ranks' lists are merged into supersteps: an action runs once the
    actions it needs ran in an earlier one."""
    p, v = ranks, n // ranks
    group = torch_round(p, m, "Interleaved1F1B")
    table = [(b, c) for g in range(0, m, group) for c in range(v)
             for b in range(g, g + group)]
    seqs: list[list[Action]] = []
    for r in range(p):
        fwd = [Action(c * p + r, Pass.F, b) for b, c in table]
        bwd = [Action((v - 1 - c) * p + r, Pass.B, b) for b, c in table]
        warm = min((v - 1) * group + 2 * (p - 1 - r), m * v)
        seq = fwd[:warm]
        for i in range(m * v - warm):
            seq += [fwd[warm + i], bwd[i]]
        seqs.append(seq + bwd[m * v - warm:])
    return _merge(seqs, n, m)


def _merge(seqs: list[list[Action]], n: int, m: int) -> list[tuple[int, int, int, str]]:
    """Per-rank action lists (F, B and W actions) merged into supersteps: each
    rank runs its next action once what it needs ran in an earlier superstep (F(s, b) after
    F(s - 1, b); B(s, b) after F(s, b) and B(s + 1, b); W(s, b) after B(s, b))."""
    done = {kind: np.full((n, m), -1, dtype=np.int64) for kind in "FBW"}
    pos = [0] * len(seqs)
    rows: list[tuple[int, int, int, str]] = []
    k = 0
    while any(pos[r] < len(seq) for r, seq in enumerate(seqs)):
        progressed = False
        for r, seq in enumerate(seqs):
            if pos[r] >= len(seq):
                continue
            action = seq[pos[r]]
            s, b, kind = action.stage, action.microbatch, action.pass_.value
            if kind == "F":
                ok = s == 0 or 0 <= done["F"][s - 1, b] < k
            elif kind == "B":
                ok = 0 <= done["F"][s, b] < k and (s == n - 1 or 0 <= done["B"][s + 1, b] < k)
            else:
                ok = 0 <= done["B"][s, b] < k
            if not ok:
                continue
            done[kind][s, b] = k
            rows.append((k, s, b, kind))
            pos[r] += 1
            progressed = True
        if not progressed:
            raise RuntimeError("schedule made no progress")  # a bug, not input
        k += 1
    return rows


def _gpipe(n: int, m: int, training: bool) -> list[tuple[int, int, int, str]]:
    """GPipe (torch.distributed.pipelining's ScheduleGPipe): every micro-batch's forward
    through the pipeline, then every backward, the last stage first: the most stash."""
    rows = [(b + s, s, b, "F") for b in range(m) for s in range(n)]
    if training:
        k0 = m + n - 1
        rows += [(k0 + b + (n - 1 - s), s, b, "B") for b in range(m) for s in range(n)]
    return rows


def _sequential(n: int, m: int, training: bool) -> list[tuple[int, int, int, str]]:
    """One stage at a time (sharded execution): F through the stages, then B back."""
    rows: list[tuple[int, int, int, str]] = []
    k = 0
    for b in range(m):
        for s in range(n):
            rows.append((k, s, b, "F"))
            if training and s == n - 1:
                rows.append((k, s, b, "B"))
            k += 1
        if training:
            for s in range(n - 2, -1, -1):
                rows.append((k, s, b, "B"))
                k += 1
    return rows


def _zero_bubble_orders(kind: str, n: int, m: int, ranks: int, pass_ns: PassTimes | None
                        ) -> list[list[Action]]:
    """Each device's actions in the zero-bubble schedule `kind` (a ValueError says what
    a stage count the schedule cannot run needs)."""
    if kind in PAPER:
        if ranks != n:
            raise ValueError(f"{kind} runs one pipeline stage per GPU: {n} stages on "
                             f"{ranks} GPUs (give as many splits as GPUs - 1)")
        return paper_orders(n, m, PAPER[kind], pass_ns)
    if TORCH[kind] == "v":
        if n != 2 * ranks:
            raise ValueError(f"{kind} runs exactly two stages per GPU in a V: {n} stages "
                             f"on {ranks} GPUs (give {2 * ranks - 1} splits)")
        return zbv_orders(ranks, m)
    if n % ranks:
        raise ValueError(f"{kind} loops the stages round the GPUs, the same number on "
                         f"each: {n} stages on {ranks} GPUs")
    return interleaved_zb_orders(ranks, n // ranks, m)


def stash_depth(actions: pd.DataFrame, num_stages: int) -> np.ndarray:
    """Max micro-batches a stage holds whose F has run and whose backward has not finished
    (its W, when the schedule runs the weight gradient apart), counting only micro-batches
    whose F and backward are in different supersteps."""
    depth = np.zeros(num_stages, dtype=np.int64)
    f = actions[actions["pass"] == "F"].set_index(["stage", "microbatch"])["superstep"]
    back = actions[actions["pass"].isin(["B", "W"])]
    b = back.groupby(["stage", "microbatch"])["superstep"].max()
    both = pd.concat([f.rename("f"), b.rename("b")], axis=1, join="inner")
    both = both[both["b"] > both["f"]]
    for s, grp in both.groupby(level="stage"):
        lo, hi = grp["f"].to_numpy(), grp["b"].to_numpy()
        span = int(hi.max()) + 2
        diff = np.zeros(span, dtype=np.int64)
        np.add.at(diff, lo, 1)
        np.add.at(diff, hi + 1, -1)
        depth[int(s)] = int(np.cumsum(diff).max())  # type: ignore[call-overload]  # pandas-stubs: a group key is Hashable
    return depth


def build_schedule(num_stages: int, microbatches: int, device_iterations: int,
                   training: bool, kind: str, replicas: int, has_wu: bool,
                   recompute: np.ndarray | None = None, ranks: int = 1,
                   pass_ns: PassTimes | None = None) -> Schedule:
    """kind: 'Grouped', 'Interleaved' or 'Sequential' (also used for sharded execution),
    or torch.distributed.pipelining's names: 'GPipe', '1F1B' (= Interleaved) and
    'Interleaved1F1B' (stages looped round `ranks` devices, placed by the compiler: stage
    s on s mod ranks; in Megatron-LM's interleaved order when each of several ranks holds
    several stages, else 1F1B over the stages), or the zero-bubble ones, which split the
    backward into B and W (`schedule_zb`): the paper's 'ZB1P' / 'ZB2P' (one stage per
    device, ordered with `pass_ns`), torch's 'InterleavedZB' (stages looped round the
    devices) and 'ZBV' (two stages per device in a V);
    `recompute[s]` says whether stage s recomputes before its backward."""
    makers = {"Grouped": _grouped, "Interleaved": _interleaved, "Sequential": _sequential,
              "GPipe": _gpipe, "1F1B": _interleaved, "Interleaved1F1B": _interleaved}
    split = kind in ZERO_BUBBLE and training
    if split:
        rows = _merge(_zero_bubble_orders(kind, num_stages, microbatches, ranks, pass_ns),
                      num_stages, microbatches)
    elif kind in ZERO_BUBBLE:
        rows = _interleaved(num_stages, microbatches, False)
    elif kind == "Interleaved1F1B" and training and 1 < ranks < num_stages and \
            num_stages % ranks == 0:
        rows = _megatron_interleaved(num_stages, microbatches, ranks)
    else:
        rows = makers[kind](num_stages, microbatches, training)
    one = pd.DataFrame(rows, columns=["superstep", "stage", "microbatch", "pass"])
    one["superstep"] += 1  # superstep 0 streams the first micro-batch in
    if recompute is not None and np.any(recompute):
        b = one[(one["pass"] == "B") & np.asarray(recompute, dtype=bool)[one["stage"]]]
        one = pd.concat([one, b.assign(**{"pass": "R"})], ignore_index=True)
    length = int(one["superstep"].max()) + 1
    allreduce: list[int] = []
    if training and has_wu:
        if replicas > 1:
            allreduce.append(length)
            length += 1
        # one IPU at a time also for the weight update when execution is sequential
        serial = kind == "Sequential"
        wu = pd.DataFrame({"superstep": length + (np.arange(num_stages) if serial else 0),
                           "stage": np.arange(num_stages), "microbatch": -1, "pass": "WU"})
        one = pd.concat([one, wu], ignore_index=True)
        length += num_stages if serial else 1
    period = length - 1  # later iterations need no separate host prelude
    parts, ar = [], []
    for it in range(device_iterations):
        part = one.copy()
        part["superstep"] += it * period
        part.loc[part["microbatch"] >= 0, "microbatch"] += it * microbatches
        parts.append(part)
        ar += [a + it * period for a in allreduce]
    actions = pd.concat(parts, ignore_index=True)
    actions["rank"] = actions["pass"].map(PASS_RANK)
    actions = actions.sort_values(["superstep", "stage", "rank"], kind="stable")
    actions = actions.drop(columns="rank").reset_index(drop=True)
    actions = actions.astype({"superstep": np.int64, "stage": np.int64,
                              "microbatch": np.int64})
    depth = stash_depth(actions[actions["microbatch"] < microbatches], num_stages)
    return Schedule(actions, np.asarray(ar, dtype=np.int64),
                    period * device_iterations + 1, depth, kind, split)
