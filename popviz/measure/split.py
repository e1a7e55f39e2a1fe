"""Split a popviz reference model into pipeline stages with torch's own frontend.

A split name (`B3`, `b1/2/relu`, `block4c`) is the first layer of the next stage, as in the
CNN application (docs/hardware.md). The models map module paths to these names
(`popviz_layer_names`); the first module of a name becomes a `SplitPoint.BEGINNING` for
`torch.distributed.pipelining.pipeline`, which traces the model and cuts it there.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

SCHEDULE_NAMES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZB", "ZBV")
# schedules that place several (virtual) stages on each rank (two here)
MULTI_STAGE = ("Interleaved1F1B", "LoopedBFS", "InterleavedZB", "ZBV")
ZERO_BUBBLE = ("InterleavedZB", "ZBV")  # the backward split into input and weight gradients


def rank_stages(schedule: str, rank: int, world: int, per_rank: int) -> list[int]:
    """The stages `rank` holds: looped (rank, rank + world, ...), or for ZBV a V (rank and
    2 world - 1 - rank, torch's `generate_stage_to_rank_mapping(style="v")`)."""
    if schedule == "ZBV":
        return [rank, 2 * world - 1 - rank]
    return [rank + k * world for k in range(per_rank)]


def canonical_schedule(name: str) -> str:
    """The canonical schedule name (case-insensitive); ValueError listing valid ones."""
    for known in SCHEDULE_NAMES:
        if str(name).lower() == known.lower():
            return known
    raise ValueError(f"unknown pipeline schedule {name!r}; valid: {', '.join(SCHEDULE_NAMES)}")


def schedule_class(name: str) -> type:
    from torch.distributed.pipelining import schedules

    return {
        "GPipe": schedules.ScheduleGPipe,
        "1F1B": schedules.Schedule1F1B,
        "Interleaved1F1B": schedules.ScheduleInterleaved1F1B,
        "LoopedBFS": schedules.ScheduleLoopedBFS,
        "InterleavedZB": schedules.ScheduleInterleavedZeroBubble,
        "ZBV": schedules.ScheduleZBVZeroBubble,
    }[canonical_schedule(name)]


def name_to_module(model: nn.Module) -> dict[str, str]:
    """split/layer name -> the first module path that carries it (forward order)."""
    first: dict[str, str] = {}
    for path, name in getattr(model, "popviz_layer_names", {}).items():
        first.setdefault(name, path)
    return first


def valid_splits(model: nn.Module) -> list[str]:
    return list(getattr(model, "popviz_split_names", []))


def default_splits(model: nn.Module, num_stages: int) -> list[str]:
    """`num_stages - 1` split names spread evenly over the model's split names."""
    names = valid_splits(model)
    if num_stages - 1 > len(names):
        raise ValueError(f"the model has {len(names) + 1} splittable parts, fewer than "
                         f"{num_stages} stages")
    count = len(names) + 1  # parts between split points
    return [names[round(count * k / num_stages) - 1] for k in range(1, num_stages)]


def check_splits(model: nn.Module, splits: list[str], num_stages: int) -> list[str]:
    """Validated split names (defaults when empty), in forward order."""
    if not splits:
        return default_splits(model, num_stages)
    names = valid_splits(model)
    unknown = [s for s in splits if s not in names]
    if unknown:
        shown = ", ".join(names[:40]) + (" ..." if len(names) > 40 else "")
        raise ValueError(f"unknown split name {unknown[0]!r}; valid names: {shown}")
    if len(set(splits)) != len(splits):
        raise ValueError(f"pipeline splits repeat a name: {splits}")
    if len(splits) != num_stages - 1:
        raise ValueError(f"{num_stages} stages need {num_stages - 1} split name(s), got "
                         f"{len(splits)}: {' '.join(splits)}")
    return sorted(splits, key=names.index)


def stage_layers(model: nn.Module, splits: list[str]) -> list[tuple[str, str]]:
    """(first layer, last layer) of each stage, from the model's layer names."""
    layers = list(dict.fromkeys(getattr(model, "popviz_layer_names", {}).values()))
    if not layers:
        return [("", "")] * (len(splits) + 1)
    bounds = [0, *[layers.index(s) for s in splits], len(layers)]
    return [(layers[a], layers[b - 1]) for a, b in itertools.pairwise(bounds)]


@dataclass
class SplitModel:
    """The traced pipeline and what each stage holds."""

    pipe: Any  # torch.distributed.pipelining.Pipe
    splits: list[str]
    layers: list[tuple[str, str]]  # per stage: first, last layer name

    @property
    def num_stages(self) -> int:
        return int(self.pipe.num_stages)


def split_model(model: nn.Module, example: torch.Tensor, splits: list[str]) -> SplitModel:
    """Trace `model(example)` and cut it before each split name's first module."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    paths = name_to_module(model)
    spec = {paths[s]: SplitPoint.BEGINNING for s in splits}
    with warnings.catch_warnings():  # torch's own tracer warns about its pytree internals
        warnings.simplefilter("ignore", FutureWarning)
        pipe = pipeline(model, mb_args=(example,), split_spec=spec)
    if pipe.num_stages != len(splits) + 1:
        raise ValueError(f"splitting at {' '.join(splits)} gave {pipe.num_stages} stages, "
                         f"expected {len(splits) + 1}")
    return SplitModel(pipe, list(splits), stage_layers(model, splits))


class OwnedOutputs(nn.Module):
    """A traced stage whose outputs are tensors of their own: an output that is a view
    (the flatten before a classifier) is copied. torch's split backward
    (`stage_backward_input`, which the zero-bubble schedules run) detaches each stage
    output in place, which a view refuses."""

    def __init__(self, stage: nn.Module) -> None:
        super().__init__()
        self.stage = stage

    def forward(self, *args: Any) -> Any:
        out = self.stage(*args)
        if isinstance(out, torch.Tensor):
            return out.clone() if out._is_view() else out
        return type(out)(o.clone() if isinstance(o, torch.Tensor) and o._is_view() else o
                         for o in out)


def build_stages(cut: SplitModel, schedule: str, mine: list[int],
                 device: torch.device) -> list[Any]:
    """This rank's stages of `cut`. The zero-bubble schedules get torch's manual
    PipelineStage around each traced stage (outputs of their own, `OwnedOutputs`): its
    set-up talks to each neighbour rank, where the traced stage's own would send to
    itself across ZBV's fold (stages r and 2p - 1 - r on one rank), which gloo refuses."""
    if schedule not in ZERO_BUBBLE:
        return [cut.pipe.build_stage(i, device) for i in mine]
    from torch.distributed.pipelining import PipelineStage

    return [PipelineStage(OwnedOutputs(cut.pipe.get_stage_module(i)), i, cut.pipe.num_stages,
                          device) for i in mine]


def loss_function(model: nn.Module) -> nn.Module:
    """The loss the model applies to its own output: NLL after the tutorial's log-softmax,
    cross-entropy on the CNNs' logits."""
    own = getattr(model, "loss", None)
    if isinstance(own, nn.Module):
        return own
    head_loss = getattr(getattr(model, "head", None), "loss", None)
    if isinstance(head_loss, nn.Module):
        return head_loss
    return nn.CrossEntropyLoss()
