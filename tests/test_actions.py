"""The typed pipeline action (popviz.actions): its string form is
torch.distributed.pipelining's, checked against torch's own `_Action`; the compiler's
schedules, the importer's annotations and the trace analysis take their pass codes from
it."""

from __future__ import annotations

import pytest

from popviz.actions import (
    COMPUTE_PASSES,
    PASS_ORDER,
    PASS_RANK,
    TORCH_TYPE_PASS,
    Action,
    Pass,
    parse_torch_action,
)
from popviz.compiler.schedule import build_schedule


@pytest.mark.parametrize("text", ["2F0", "1B3", "0W2", "3R1", "0WU", "12F345"])
def test_string_form_round_trips(text: str) -> None:
    assert str(Action.from_str(text)) == text


def test_torch_input_gradient_is_b_and_bad_text_is_refused() -> None:
    assert Action.from_str("1I3") == Action(1, Pass.B, 3)
    for bad in ("F0", "2X0", "2F", "", "2 F 0", "-1F0"):
        with pytest.raises(ValueError, match="not a pipeline action"):
            Action.from_str(bad)


def test_torch_actions_parse_as_torch_writes_them() -> None:
    """Every computation type torch.distributed.pipelining prints (`_Action.__str__`) is
    read back with torch's stage, type and micro-batch."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    seen = set()
    for kind in schedules._ComputationType:
        for stage, mb in ((0, 0), (3, 17), (11, None)):
            text = str(schedules._Action(stage, kind, mb))
            parsed = parse_torch_action(text)
            if kind.name == "OVERLAP_F_B":  # a composite torch prints with its sub-actions
                continue
            assert parsed is not None, text
            assert parsed[0] == stage and parsed[2] == (-1 if mb is None else mb), text
            assert parsed[1] in TORCH_TYPE_PASS
            seen.add(parsed[1])
    assert {"F", "I", "W", "B", "SEND_F", "RECV_B"} <= seen


def test_pass_codes_defined_once() -> None:
    from popviz.analysis import trace_detail
    from popviz.compiler import schedule
    from popviz.ingest import kineto_events
    from tooling import calibration

    assert trace_detail.COMPUTE_PASSES is COMPUTE_PASSES
    assert schedule.PASS_RANK is PASS_RANK
    assert kineto_events.ACTION_PASS is TORCH_TYPE_PASS
    assert set(calibration.PASSES) <= {p.value for p in PASS_ORDER}
    assert kineto_events.PP_ACTION.match("PP:2I15")[2] == "I"


@pytest.mark.parametrize("kind", ["1F1B", "GPipe", "ZB1P"])
def test_a_schedule_lists_typed_actions_in_run_order(kind: str) -> None:
    s = build_schedule(3, 4, 1, True, kind, 1, True, ranks=3)
    first = s.actions_of(0)
    assert str(first[0]) == "0F0" and str(first[-1]) == "0WU"
    assert all(isinstance(a, Action) for a in first)
    passes = {a.pass_ for a in first}
    assert (Pass.W in passes) == (kind == "ZB1P")
