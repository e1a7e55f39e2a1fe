"""PopTorch-like annotations: blocks, stages, executions, recomputation checkpoints.

None of these change what the model computes. Blocks and checkpoints only leave marks that
the recorder (popviz.recorder) reads while a step is being recorded; outside a recording
they cost a context switch and nothing else. This module knows nothing of the recorder:
the recorder installs callbacks in `STATE` while it runs (layers only import leftwards).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from popviz.vocab import ipu_label

_T = TypeVar("_T")


class _State(threading.local):
    """Per-thread annotation state read by the recorder."""

    def __init__(self) -> None:
        self.block_stack: list[str] = []  # innermost `Block` scope last
        self.begin_block: str = ""  # last block started by a `BeginBlock` module
        self.block_ipus: dict[str, int | None] = {}  # every block entered -> its ipu_id
        self.host_io_depth: int = 0
        # set by an active recorder; called with the tensor given to recomputation_checkpoint
        self.on_checkpoint: Callable[[Any], None] | None = None

    def current_block(self) -> str:
        return self.block_stack[-1] if self.block_stack else self.begin_block

    def reset(self) -> None:
        """Forget blocks from earlier steps (called when a recording starts)."""
        self.block_stack.clear()
        self.begin_block = ""
        self.block_ipus.clear()
        self.host_io_depth = 0


STATE = _State()


def _check_ipu(ipu_id: Any, what: str) -> int | None:
    if ipu_id is None:
        return None
    if isinstance(ipu_id, bool) or not isinstance(ipu_id, int) or ipu_id < 0:
        raise ValueError(f"ipu_id {ipu_id!r} of {what} is not a whole number >= 0")
    return ipu_id


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{what} name {name!r} must be a non-empty string")
    return name


class Block(contextlib.ContextDecorator):
    """Ops run inside `with popviz.Block("B1", ipu_id=0):` (or a function decorated with
    `@popviz.Block("B1")`) belong to block B1, placed on `ipu_id` when auto-staging."""

    def __init__(self, name: str, ipu_id: int | None = None) -> None:
        self.name = _check_name(name, "Block")
        self.ipu_id = _check_ipu(ipu_id, f"Block {name!r}")

    def __enter__(self) -> Block:
        _note_block(self.name, self.ipu_id)
        STATE.block_stack.append(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        # pop our own entry even if an inner scope misbehaved
        if self.name in STATE.block_stack:
            idx = len(STATE.block_stack) - 1 - STATE.block_stack[::-1].index(self.name)
            del STATE.block_stack[idx:]


def _note_block(name: str, ipu_id: int | None) -> None:
    known = STATE.block_ipus.get(name)
    if name not in STATE.block_ipus or (known is None and ipu_id is not None):
        STATE.block_ipus[name] = ipu_id
    elif ipu_id is not None and known != ipu_id:
        raise ValueError(f"Block {name!r} is placed on {ipu_label(known)} and on "
                         f"{ipu_label(ipu_id)}")


def BeginBlock(module: _T, name: str, ipu_id: int | None = None) -> _T:
    """Mark `module` as the start of block `name`: it and every module after it (until the
    next BeginBlock) belong to that block. Adds a forward pre-hook; returns the module."""
    import torch.nn as nn  # lazy: `import popviz` must not import torch

    if not isinstance(module, nn.Module):
        raise ValueError(f"BeginBlock needs an nn.Module, got {type(module).__name__}")
    name = _check_name(name, "BeginBlock")
    ipu_id = _check_ipu(ipu_id, f"BeginBlock {name!r}")

    def enter_block(_mod: nn.Module, _args: Any) -> None:
        _note_block(name, ipu_id)
        STATE.begin_block = name

    old = getattr(module, "_popviz_begin_block", None)
    if old is not None:
        old[2].remove()  # re-annotating a module replaces its block
    handle = module.register_forward_pre_hook(enter_block)
    module._popviz_begin_block = (name, ipu_id, handle)  # type: ignore[assignment]  # torch stubs: any attribute is a Tensor | Module
    return module


def recomputation_checkpoint(tensor: _T) -> _T:
    """Keep `tensor` from the forward pass as a recomputation checkpoint. Returns it
    unchanged; while recording, marks the op that produced it (`checkpoint=True`)."""
    hook = STATE.on_checkpoint
    if hook is not None:
        for item in tensor if isinstance(tensor, (list, tuple)) else (tensor,):
            hook(item)
    return tensor


@contextlib.contextmanager
def host_io() -> Iterator[None]:
    """Ops inside this scope are host I/O (copies of the step's inputs onto the device)."""
    STATE.host_io_depth += 1
    try:
        yield
    finally:
        STATE.host_io_depth -= 1


class Stage:
    """A pipeline stage: consecutive blocks placed on one IPU (`Stage("B1", "B2").ipu(0)`)."""

    def __init__(self, *block_names: str) -> None:
        if not block_names:
            raise ValueError("Stage needs at least one block name")
        self.blocks = [_check_name(b, "Stage block") for b in block_names]
        if len(set(self.blocks)) != len(self.blocks):
            raise ValueError(f"Stage repeats a block name: {self.blocks}")
        self.ipu_id: int | None = None

    def ipu(self, ipu_id: int) -> Stage:
        self.ipu_id = _check_ipu(ipu_id, f"Stage{tuple(self.blocks)}")
        return self

    def __repr__(self) -> str:
        return f"Stage({', '.join(map(repr, self.blocks))}).ipu({self.ipu_id})"


class _Execution:
    strategy = ""

    def __init__(self, *stages: Stage | str) -> None:
        # PopTorch also accepts bare block names, one stage each
        self.stages = [s if isinstance(s, Stage) else Stage(s) for s in stages]
        if not self.stages:
            raise ValueError(f"{type(self).__name__} needs at least one stage")
        seen: dict[str, int] = {}
        for i, stage in enumerate(self.stages):
            for block in stage.blocks:
                if block in seen:
                    raise ValueError(f"block {block!r} is in stage {seen[block]} and stage {i}")
                seen[block] = i

    def stage_ipus(self) -> list[int]:
        """IPU of each stage: explicit, else stage i on IPU i."""
        return [i if s.ipu_id is None else s.ipu_id for i, s in enumerate(self.stages)]

    def apply_to(self, options: Any) -> None:
        ipus = self.stage_ipus()
        for i, (a, b) in enumerate(itertools.pairwise(ipus)):
            if b < a:
                raise ValueError(
                    f"stage {i + 1} is on {ipu_label(b)} after stage {i} on {ipu_label(a)}: "
                    "stage ids are "
                    f"out of order (IPUs {ipus})"
                )
        self._check_ipu_count(ipus, getattr(options, "num_ipus", None))
        options.strategy = self.strategy
        options.stages = [list(s.blocks) for s in self.stages]
        options.stage_ipus = ipus

    def _check_ipu_count(self, ipus: list[int], num_ipus: int | None) -> None:
        if num_ipus is not None and max(ipus) >= num_ipus:
            raise ValueError(
                f"stage on {ipu_label(max(ipus))} but only {num_ipus} IPU(s) are available"
            )


class PipelinedExecution(_Execution):
    """Stages run in parallel on different micro-batches; each stage needs its own IPU."""

    strategy = "pipelined"

    def _check_ipu_count(self, ipus: list[int], num_ipus: int | None) -> None:
        super()._check_ipu_count(ipus, num_ipus)
        if len(set(ipus)) != len(ipus):
            raise ValueError(
                f"{len(ipus)} pipelined stages on {len(set(ipus))} IPU(s) {ipus}: "
                "a pipelined stage needs an IPU of its own (use ShardedExecution)"
            )


class ShardedExecution(_Execution):
    """Stages run one at a time (one IPU busy at a time); stages may share an IPU."""

    strategy = "sharded"


def check_stages(options: Any, blocks: Sequence[str]) -> None:
    """At record time: every block named in `options.stages` must have been seen."""
    known = set(blocks)
    for i, stage in enumerate(options.stages):
        for name in stage:
            if name not in known:
                seen = ", ".join(repr(b) for b in blocks) or "none"
                raise ValueError(f"stage {i} names unknown block {name!r} (blocks seen: {seen})")


def auto_stages(options: Any, blocks: Sequence[str], block_ipus: dict[str, int | None]) -> None:
    """No explicit stages: one stage per block, on the block's ipu_id (else its index);
    pipelined, consecutive blocks on the same IPU form one stage."""
    if options.stages or not blocks:
        return
    ipus = [i if (ipu := block_ipus.get(b)) is None else int(ipu) for i, b in enumerate(blocks)]
    for i, (a, b) in enumerate(itertools.pairwise(ipus)):
        if b < a:
            raise ValueError(
                f"block {blocks[i + 1]!r} is on {ipu_label(b)} after block {blocks[i]!r} on "
                f"{ipu_label(a)}: "
                "blocks must be placed on IPUs in order"
            )
    if options.num_ipus is not None and max(ipus) >= options.num_ipus:
        raise ValueError(
            f"block on {ipu_label(max(ipus))} but only {options.num_ipus} IPU(s) are available"
        )
    stages: list[list[str]] = []
    stage_ipus: list[int] = []
    for block, ipu in zip(blocks, ipus):
        # like PopTorch's AutoStage.SameAsIpu: a pipelined stage owns its IPU, so
        # consecutive blocks on one IPU share a stage
        if options.strategy == "pipelined" and stage_ipus and stage_ipus[-1] == ipu:
            stages[-1].append(block)
        else:
            stages.append([block])
            stage_ipus.append(ipu)
    options.stages = stages
    options.stage_ipus = stage_ipus
