"""Pipeline actions, typed once: a stage runs one pass of one micro-batch.

The compiler's schedules, the importer's `PP:` annotations and the trace analysis all speak
of the same actions; this module is where their pass codes and their string form live.
The string form is torch.distributed.pipelining's (`_Action.__repr__` / `from_str`): stage,
pass code, micro-batch, as in "2F0", "1B3", "0W2"; a weight update, which has no
micro-batch, is "0WU".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Pass(StrEnum):
    """What a stage runs. The profile contract's trace holds F, B, R and WU; a zero-bubble
    schedule's W (the weight-gradient part of the backward, run apart) is drawn as B with
    its part in the trace's `grad_part` column."""

    F = "F"  # forward
    R = "R"  # recompute: a checkpointed section's forward again, right before its B
    B = "B"  # backward (only the input gradient when the schedule runs W apart)
    W = "W"  # the weight gradients, deferred (Zero Bubble's ZB1P / ZB2P)
    WU = "WU"  # weight update: the optimiser step


# the order passes of one stage run in within one superstep
PASS_ORDER: tuple[Pass, ...] = (Pass.F, Pass.R, Pass.B, Pass.W, Pass.WU)
PASS_RANK: dict[str, int] = {p.value: i for i, p in enumerate(PASS_ORDER)}
# the passes a profile's trace and ops table carry (the public contract), in run order
CONTRACT_PASSES: tuple[str, ...] = ("F", "R", "B", "WU")
# the passes whose compute events hold ops, as the trace analysis lays them out
COMPUTE_PASSES: tuple[str, ...] = ("F", "B", "R", "WU")
PASS_NAMES: dict[str, str] = {"F": "forward", "R": "recompute", "B": "backward",
                              "W": "weight gradient", "WU": "optimiser"}

# torch.distributed.pipelining's computation types (the `PP:` record_function annotations
# of its runtime schedules) -> the contract pass their time belongs to; "" for the ones
# that move parameters and no activations (FSDP's unshard / reshard)
TORCH_TYPE_PASS: dict[str, str] = {
    "F": "F", "B": "B", "I": "B", "W": "B", "REDUCE_GRAD": "WU", "SEND_F": "F",
    "RECV_F": "F", "SEND_B": "B", "RECV_B": "B", "OVERLAP_F_B": "B", "UNSHARD": "",
    "RESHARD": ""}
TORCH_ACTION = re.compile(r"^(\d+)(" + "|".join(sorted(TORCH_TYPE_PASS, key=len,
                                                       reverse=True)) + r")(\d*)$")
_ACTION = re.compile(r"^(\d+)(WU|F|R|B|I|W)(\d*)$")


@dataclass(frozen=True, order=True)
class Action:
    """One stage running one pass of one micro-batch (-1: a weight update, which has
    none)."""

    stage: int
    pass_: Pass
    microbatch: int = -1

    def __str__(self) -> str:
        mb = "" if self.microbatch < 0 else str(self.microbatch)
        return f"{self.stage}{self.pass_.value}{mb}"

    @classmethod
    def from_str(cls, text: str) -> Action:
        """Parse "2F0", "1B3", "0W2", "3R1", "0WU"; torch's "1I3" (input gradient) is B.
        A ValueError names the text when it is none of these."""
        m = _ACTION.match(text.strip())
        if not m or (m[2] != "WU" and not m[3]):
            raise ValueError(f"not a pipeline action: {text!r} (expected stage, pass and "
                             f"micro-batch, e.g. '2F0', '1B3', '0W2', or '0WU')")
        code = "B" if m[2] == "I" else m[2]
        return cls(int(m[1]), Pass(code), int(m[3]) if m[3] else -1)


def parse_torch_action(text: str) -> tuple[int, str, int] | None:
    """A `PP:` annotation's action without its prefix ("2F0", "1I3", "0REDUCE_GRAD") as
    (stage, torch computation type, micro-batch or -1); None when it is not one."""
    m = TORCH_ACTION.match(text)
    if not m:
        return None
    return int(m[1]), m[2], int(m[3]) if m[3] else -1
