"""Zero Bubble's schedules (Qi et al., ICLR 2024): the backward split into the input
gradient (B) and the weight gradient (W), W deferred into what would be bubbles.

Checked against hand calculations, not against the scheduler's own output: with unit
F, B, W times the last stage cannot finish before p - 1 + 3m (its first forward waits
p - 1 units, then it has 3m units of work), 1F1B takes (m + p - 1)(F + B + W); which
recorded op computes an input and which a weight gradient follows from a Linear layer's
algebra (dX = dY W and dW = dY^T X: equal FLOPs)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from popviz.compiler import compile
from popviz.compiler.grad_parts import grad_parts
from popviz.compiler.schedule import PassTimes, build_schedule
from popviz.compiler.schedule_zb import PAPER, ZERO_BUBBLE
from popviz.options import Options
from tooling.gpu_programs import gpu_program


def _makespan(actions: pd.DataFrame, p: int, split: bool, f: float = 1.0, b: float = 1.0,
              w: float = 1.0) -> float:
    """Each stage runs its actions in the schedule's order as soon as their inputs are
    there (no transfer time): the finishing time of the last action."""
    free = np.zeros(p)
    done: dict[tuple[int, int, str], float] = {}
    for st, mb, ps in zip(actions["stage"], actions["microbatch"], actions["pass"],
                          strict=True):
        if ps == "WU":
            continue
        ready = free[st]
        if ps == "F" and st > 0:
            ready = max(ready, done[(st - 1, mb, "F")])
        if ps == "B":
            ready = max(ready, done[(st, mb, "F")])
            if st < p - 1:
                ready = max(ready, done[(st + 1, mb, "B")])
        if ps == "W":
            ready = max(ready, done[(st, mb, "B")])
        dur = {"F": f, "B": b if split else b + w, "W": w}[ps]
        done[(st, mb, ps)] = free[st] = ready + dur
    return float(free.max())


def check_dependencies(actions: pd.DataFrame, n: int, m: int) -> None:
    """Every micro-batch's F before its input gradient B before its W on each of the `n`
    stages; a forward after the previous stage's, an input gradient after the next's."""
    k = actions.set_index(["pass", "stage", "microbatch"])["superstep"]
    for st in range(n):
        for mb in range(m):
            assert k[("F", st, mb)] < k[("B", st, mb)] < k[("W", st, mb)]
            if st:
                assert k[("F", st - 1, mb)] < k[("F", st, mb)]
                assert k[("B", st, mb)] < k[("B", st - 1, mb)]


@pytest.mark.parametrize("kind", sorted(PAPER))
@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 5), (4, 8), (8, 3), (8, 24)])
def test_every_action_once_and_after_what_it_needs(kind: str, p: int, m: int) -> None:
    s = build_schedule(p, m, 1, True, kind, 1, True, ranks=p)
    a = s.actions[s.actions["pass"] != "WU"]
    assert s.split_backward
    for ps in "FBW":
        mine = a[a["pass"] == ps]
        assert len(mine) == p * m and not mine.duplicated(["stage", "microbatch"]).any()
    check_dependencies(a, p, m)
    # one action per stage per superstep, and the weight update after every W
    assert not a.duplicated(["superstep", "stage"]).any()
    wu = s.actions[s.actions["pass"] == "WU"]
    assert (wu["superstep"] > a["superstep"].max()).all()


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 24), (8, 64)])
def test_unit_times_against_the_hand_calculated_bounds(p: int, m: int) -> None:
    bound = p - 1 + 3 * m  # the last stage: waits p - 1, then 3m units of work
    one_f_one_b = _makespan(build_schedule(p, m, 1, True, "1F1B", 1, False).actions, p,
                            False)
    assert one_f_one_b == (m + p - 1) * 3  # 1F1B's bubble, (p - 1)(F + B + W)
    zb1 = _makespan(build_schedule(p, m, 1, True, "ZB1P", 1, False, ranks=p).actions, p, True)
    zb2 = _makespan(build_schedule(p, m, 1, True, "ZB2P", 1, False, ranks=p).actions, p, True)
    assert zb2 == bound  # twice the memory buys every bubble but the unavoidable ramp
    assert bound < zb1 <= bound + (p - 1)  # ZB-H1's (p - 1)(F + B - W) at most
    assert zb1 < one_f_one_b


def test_memory_limit_holds_in_forwards_worth() -> None:
    """ZB-1p holds at most p forwards' activations on a stage and ZB-2p 2p, counting a
    micro-batch from its F until its W (unit shares: B frees nothing)."""
    p, m = 4, 16
    for kind, depth in PAPER.items():
        a = build_schedule(p, m, 1, True, kind, 1, False, ranks=p).actions
        for st in range(p):
            held = most = 0
            for ps in a[a["stage"] == st].sort_values("superstep", kind="stable")["pass"]:
                held += {"F": 1, "W": -1}.get(ps, 0)
                most = max(most, held)
            assert most <= depth * p
        assert most >= 1


def test_a_share_freed_by_b_lets_more_forwards_in() -> None:
    """When B frees most of a forward's bytes (eager attention's scores), the same limit
    admits more forwards in flight than when W holds them all."""
    p, m = 4, 16
    one = np.ones(p)

    def times(share: float) -> PassTimes:
        return PassTimes(one, one, one, np.zeros(p), np.full(p, share))

    def most_forwards(share: float) -> int:
        a = build_schedule(p, m, 1, True, "ZB1P", 1, False, ranks=p,
                           pass_ns=times(share)).actions
        s0 = a[a["stage"] == 0].sort_values("superstep", kind="stable")["pass"].tolist()
        return s0.index("B") if "B" in s0 else 0  # forwards before the first B

    assert most_forwards(0.2) >= most_forwards(1.0)


def test_zero_bubble_needs_one_stage_per_gpu_and_a_gpu() -> None:
    with pytest.raises(ValueError, match="one pipeline stage per GPU"):
        build_schedule(4, 8, 1, True, "ZB1P", 1, False, ranks=2)
    program = gpu_program("mlp", 64, 8)
    for kind in ZERO_BUBBLE:  # the paper's and torch's: PopART splits no backward
        with pytest.raises(ValueError, match="GPU targets only"):
            compile(program, Options(target="mk2", schedule=kind))


@pytest.fixture(scope="module")
def mlp_two_stages() -> tuple:
    program = gpu_program("mlp", 64, 8)
    options = Options(target="h100", splits=["body.2"], num_ipus=2, gradient_accumulation=6)
    return program, options


def test_input_and_weight_gradients_of_a_linear_layer(mlp_two_stages: tuple) -> None:
    """In the second stage each Linear's backward is one matmul for dX (input) and one
    for dW plus a sum for the bias (weight), of equal FLOPs; the first stage sends no
    gradient back, so all of its backward is weight gradient."""
    program, options = mlp_two_stages
    from popviz.compiler.gpu_compile import costed_gpu_plan
    from popviz.target import get_target

    _, _, _, ops = costed_gpu_plan(program, options, get_target("h100"))
    part = pd.Series(grad_parts(ops), index=ops.index)
    back = ops[ops["pass"] == "B"].assign(part=part)
    mm = back[back["op"].astype(str).str.startswith("aten.mm")]
    second = mm[mm["stage"] == 1]
    # head + body.3.0 + body.2.0: one input and one weight matmul each
    assert sorted(second.groupby("module")["part"].agg(sorted).map(tuple).tolist()) == \
        [("input", "weight")] * 3
    flops = second.groupby("part")["flops"].sum()
    assert flops["input"] == flops["weight"]
    sums = back[back["op"].astype(str).str.startswith("aten.sum")]
    assert (sums["part"] == "weight").all()  # bias gradients
    costly = back[(back["stage"] == 0) & (back["cycles"] > 0)]
    assert len(costly) and (costly["part"] == "weight").all()
    assert (ops.loc[ops["pass"] != "B"].pipe(lambda o: part[o.index]) == "").all()


def test_a_zero_bubble_plan_runs_w_apart_and_sooner(mlp_two_stages: tuple) -> None:
    program, options = mlp_two_stages
    plans = {k: compile(program, options.copy(schedule=k)) for k in ("1F1B", "ZB1P", "ZB2P")}
    assert plans["ZB1P"].summary["step_ms"] < plans["1F1B"].summary["step_ms"]
    assert plans["ZB2P"].summary["step_ms"] <= plans["ZB1P"].summary["step_ms"] * 1.001
    for kind in ("ZB1P", "ZB2P"):
        report = plans[kind]
        trace = report.tables["trace"]
        comp = trace[trace["kind"] == "compute"]
        assert set(comp["pass"]) <= {"F", "B", "WU"}  # the contract's passes
        weight = comp[comp["grad_part"] == "weight"]
        assert len(weight) == 2 * 6
        # a stage's B and W ns add up to its backward, as 1F1B runs it whole
        stages = report.tables["stages"]
        back = comp[comp["pass"] == "B"]
        per = (back["end"] - back["start"]).groupby(back["stage"]).sum()
        assert per.tolist() == pytest.approx(stages["backward_cycles"].tolist(), abs=2 * 12)
        # W after the B of its micro-batch on the same GPU
        b = back[back["grad_part"] == "input"].set_index(["stage", "microbatch"])["end"]
        w = weight.set_index(["stage", "microbatch"])["start"]
        common = b.index.intersection(w.index)
        assert len(common) and (w[common] >= b[common]).all()
    one = plans["1F1B"].summary["max_memory_allocated"]
    two = plans["ZB2P"].summary["max_memory_allocated"]
    assert max(two.values()) >= max(one.values())  # more forwards in flight
