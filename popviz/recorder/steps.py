"""Record a step function once into a Program (no compile, no file), and the usual step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from popviz.recorder.program import Program
from popviz.recorder.recorder import Recorder


def record_program(step: Callable[..., Any], *args: Any, model: torch.nn.Module | None = None,
                   name: str | None = None, model_info: dict[str, Any] | None = None,
                   mode: str = "measured", progress: bool | None = False) -> Program:
    """Run `step(*args)` once under a Recorder and return its Program (no compile, no file)."""
    recorder = Recorder(model, name=name, model_info=model_info, mode=mode, progress=progress)
    with recorder:
        step(*args)
    assert recorder.program is not None
    return recorder.program


def train_step(model: torch.nn.Module, optimiser: torch.optim.Optimizer,
               inputs: torch.Tensor | Sequence[torch.Tensor], target: torch.Tensor,
               loss_fn: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """The usual step: zero grads, forward, loss, backward, optimiser step. Returns the loss."""
    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    optimiser.zero_grad(set_to_none=True)
    args = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    loss = loss_fn(model(*args), target)
    loss.backward()
    optimiser.step()
    return loss
