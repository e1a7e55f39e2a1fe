"""The zero-bubble schedules' orders: each GPU's list of actions, which
`schedule._merge` places into supersteps. The backward is split into the input gradient
(B; torch's "I") and the weight gradient (W), and W is deferred into what would be bubbles.

- `paper_orders`: ZB1P / ZB2P, the paper's heuristic (Qi et al., ICLR 2024, §3.1), one
  stage per GPU, ordered with the stages' modelled times.
- `interleaved_zb_orders`: torch.distributed.pipelining's ScheduleInterleavedZeroBubble
  (`_get_1f1b_rank_ops` with zero bubble on): v stages per GPU looped round it (stage
  c * p + r on GPU r), Interleaved1F1B's order with each I's W run `r` actions later.
- `zbv_orders`: torch's ScheduleZBVZeroBubble (the paper's §6 ZB-V): two stages per GPU in
  a V (GPU r holds stages r and 2p - 1 - r), a fixed order that is bubble-free when F, I
  and W take equal time.

The two torch orders are torch's own, action for action (`tests/test_zero_bubble_torch.py`
runs torch's order code on the same sizes); they do not look at the stages' times.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from popviz.actions import Action, Pass

# name -> in-flight limit in pipeline depths (the paper's heuristic)
PAPER = {"ZB1P": 1, "ZB2P": 2}
# torch's zero-bubble schedules, by the name popviz gives them -> how stages sit on GPUs
TORCH = {"InterleavedZB": "loop", "ZBV": "v"}
# every schedule that runs the weight gradient apart from the input gradient
ZERO_BUBBLE = (*PAPER, *TORCH)


@dataclass(frozen=True)
class PassTimes:
    """Per stage, the modelled time of one micro-batch's forward, input gradient, weight
    gradient, and of the p2p transfer into the stage (any unit, one for all); and the share
    of a forward's activation bytes that its input gradient leaves for the weight gradient
    (Zero Bubble's M_W / M_F: 32h of 34h + 5as per token and layer with eager attention)."""

    forward: np.ndarray
    input_grad: np.ndarray
    weight_grad: np.ndarray
    p2p: np.ndarray
    weight_share: np.ndarray


def torch_round(p: int, m: int, kind: str) -> int:
    """Micro-batches per round of torch's interleaved schedules (`_get_warmup_ops`'s
    microbatches_per_round: m // max(1, m // p)); a ValueError when m does not split into
    whole rounds, which torch refuses too."""
    rounds = max(1, m // p)
    if m % rounds:
        raise ValueError(f"{kind} over {p} GPUs needs micro-batches divisible by {rounds} "
                         f"(torch.distributed.pipelining groups them m // max(1, m // "
                         f"GPUs) at a time), got {m}")
    return m // rounds


def stage_gpus(kind: str, stages: int, gpus: int) -> np.ndarray:
    """The GPU each stage runs on: looped (stage s on s mod gpus) for the interleaved
    schedules, a V for ZBV (stages r and 2 gpus - 1 - r on GPU r, so the last stage sits
    with the first and the loss's gradient needs no transfer). A ValueError says what ZBV
    needs when the stage count is not twice the GPUs."""
    s = np.arange(stages)
    if TORCH.get(kind) == "v":
        if stages != 2 * gpus:
            raise ValueError(f"{kind} runs exactly two stages per GPU in a V: {stages} "
                             f"stages on {gpus} GPUs (give {2 * gpus - 1} splits)")
        return np.where(s < gpus, s, 2 * gpus - 1 - s)
    return s % max(1, gpus)


def paper_orders(n: int, m: int, depths: int, pass_ns: PassTimes | None
                 ) -> list[list[Action]]:
    """Each GPU's actions in Zero Bubble's heuristic (Qi et al., ICLR 2024, §3.1; ZB-1p /
    ZB-2p), one stage per GPU. Each GPU, whenever it is free, runs an input-gradient B if
    one is ready; else a forward if one is ready and its activations fit under `depths` x
    n forwards' worth (the paper's memory limit, the same on every stage: a forward adds
    one, its B frees all but the weight gradient's share, its W the rest); else a
    deferred weight gradient W, which fills what would be a bubble (or frees memory for
    the next forward); else it waits. Decided in time order with the stages' modelled
    times (`pass_ns`; unit times and shares without them), as the paper's scheduler uses
    its profiled F, B, W and p2p."""
    one = np.ones(n)
    f, b, w, comm, share = ((one, one, one, np.zeros(n), one) if pass_ns is None else
                            (pass_ns.forward, pass_ns.input_grad, pass_ns.weight_grad,
                             pass_ns.p2p, pass_ns.weight_share))
    limit = depths * n + 1e-9
    free = np.zeros(n)
    held = np.zeros(n)  # forwards' worth of activations on each stage
    nf, nb, nw = [0] * n, [0] * n, [0] * n
    f_end = np.full((n, m), np.inf)
    b_end = np.full((n, m), np.inf)
    seqs: list[list[Action]] = [[] for _ in range(n)]

    def ready(s: int) -> tuple[float, float]:
        rb = rf = np.inf
        if nb[s] < nf[s]:
            rb = f_end[s, nb[s]] if s == n - 1 else b_end[s + 1, nb[s]] + comm[s + 1]
        if nf[s] < m and held[s] + 1 <= limit:
            rf = 0.0 if s == 0 else f_end[s - 1, nf[s]] + comm[s]
        return float(rb), float(rf)

    while any(nw[s] < m for s in range(n)):
        best: tuple[float, int] | None = None
        for s in range(n):
            if nw[s] >= m:
                continue
            rb, rf = ready(s)
            at = free[s] if nw[s] < nb[s] else max(free[s], min(rb, rf))
            if np.isfinite(at) and (best is None or at < best[0]):
                best = (float(at), s)
        if best is None:
            raise RuntimeError("zero-bubble schedule made no progress")  # a bug, not input
        t, s = best
        rb, rf = ready(s)
        if rb <= t:
            kind, mb, dur = Pass.B, nb[s], b[s]
            b_end[s, mb] = t + dur
            nb[s] += 1
            held[s] -= 1 - share[s]
        elif rf <= t:
            kind, mb, dur = Pass.F, nf[s], f[s]
            f_end[s, mb] = t + dur
            nf[s] += 1
            held[s] += 1
        else:
            kind, mb, dur = Pass.W, nw[s], w[s]
            nw[s] += 1
            held[s] -= share[s]
        seqs[s].append(Action(s, kind, mb))
        free[s] = t + dur
    return seqs


def _counter() -> Callable[[int], int]:
    """Each stage's next micro-batch: the first call for a stage gives 0, then 1, ..."""
    seen: defaultdict[int, int] = defaultdict(int)

    def take(stage: int) -> int:
        seen[stage] += 1
        return seen[stage] - 1
    return take


def interleaved_zb_orders(p: int, v: int, m: int) -> list[list[Action]]:
    """Each of `p` GPUs' actions in torch's ScheduleInterleavedZeroBubble with `v` stages
    per GPU and `m` micro-batches: micro-batches go in rounds of m // max(1, m // p)
    through stage chunk 0, 1, ...; GPU r runs (v - 1) x round + p - 1 - r warm-up
    forwards, then a forward and an input gradient in turn, then the remaining input
    gradients; from its (r + 1)-th input gradient on, each is followed by the weight
    gradient of the oldest one not yet run, and the rest of the W close the step."""
    per_round = torch_round(p, m, "InterleavedZB")
    total = v * m
    orders = []
    for r in range(p):
        warm = min((v - 1) * per_round + (p - 1 - r), total)

        def forward_stage(i: int, r: int = r) -> int:
            return (i // per_round) % v * p + r

        def backward_stage(i: int, r: int = r, warm: int = warm) -> int:
            return (v - 1 - (i - warm) // per_round % v) * p + r

        f_mb, b_mb, w_mb = _counter(), _counter(), _counter()
        order: list[Action] = []
        backs: list[int] = []  # the op index of each input gradient, in order
        for i in range(total + warm):
            if i < total:
                order.append(Action(forward_stage(i), Pass.F, f_mb(forward_stage(i))))
            if i < warm:
                continue
            order.append(Action(backward_stage(i), Pass.B, b_mb(backward_stage(i))))
            backs.append(i)
            if i - warm >= r:  # the first r input gradients run without their W
                stage = backward_stage(backs[len(backs) - 1 - r])
                order.append(Action(stage, Pass.W, w_mb(stage)))
        for i in backs[len(backs) - min(r, len(backs)):]:
            order.append(Action(backward_stage(i), Pass.W, w_mb(backward_stage(i))))
        orders.append(order)
    return orders


def zbv_orders(p: int, m: int) -> list[list[Action]]:
    """Each of `p` GPUs' actions in torch's ScheduleZBVZeroBubble (two stages per GPU in a
    V: chunk 0 is stage r, chunk 1 stage 2p - 1 - r). GPU r: 2(p - r) - 1 forwards of
    chunk 0; r pairs (F1, F0); p - r triples (F1, I1, W1); then, while chunk 1 has
    forwards to catch up or chunk 0 micro-batches to start, (F0, I0, W0, F1, I1, W1);
    cool-down r pairs (I0, I1), p - r pairs (I0, W0), the remaining W1, then W0. The
    order is written for max(2p - 1, m) micro-batches; actions of the ones past m are
    dropped, as torch turns them into no-ops."""
    n = 2 * p
    count = max(2 * p - 1, m)
    orders = []
    for r in range(p):
        c0, c1 = r, n - 1 - r
        nxt = {(c, ps): 0 for c in (c0, c1) for ps in (Pass.F, Pass.B, Pass.W)}
        order: list[Action] = []

        def run(stage: int, ps: Pass, order: list[Action] = order,
                nxt: dict[tuple[int, Pass], int] = nxt) -> None:
            order.append(Action(stage, ps, nxt[(stage, ps)]))
            nxt[(stage, ps)] += 1

        for _ in range(2 * (p - r) - 1):
            run(c0, Pass.F)
        for _ in range(r):
            run(c1, Pass.F)
            run(c0, Pass.F)
        for _ in range(p - r):
            for ps in (Pass.F, Pass.B, Pass.W):
                run(c1, ps)
        while nxt[(c1, Pass.F)] < nxt[(c0, Pass.F)] or nxt[(c0, Pass.F)] < count:
            if nxt[(c0, Pass.F)] < count:
                run(c0, Pass.F)
            run(c0, Pass.B)
            run(c0, Pass.W)
            for ps in (Pass.F, Pass.B, Pass.W):
                run(c1, ps)
        for _ in range(r):
            run(c0, Pass.B)
            run(c1, Pass.B)
        for _ in range(p - r):
            run(c0, Pass.B)
            run(c0, Pass.W)
        for stage in (c1, c0):
            while nxt[(stage, Pass.W)] < nxt[(stage, Pass.B)]:
                run(stage, Pass.W)
        orders.append([a for a in order if a.microbatch < m])
    return orders
