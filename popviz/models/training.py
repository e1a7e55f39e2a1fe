"""Real CPU training and evaluation loops for train.py, and the recorded step.

Each model step is a real PyTorch step (forward, loss.backward(), optimiser.step()). The
modelled IPU run (gradient accumulation, replicas, pipeline) comes from the Options given
to the recorder, not from repeating work on the CPU: see docs/train.md.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from popviz.models.common import SyntheticImages


@dataclass
class RunResult:
    """What a training or inference run did: losses per optimiser step, timings, outputs."""

    losses: list[float] = field(default_factory=list)
    samples: int = 0
    seconds: float = 0.0
    accuracy: float | None = None
    profiles: list[Path] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def model_info(model: nn.Module, name: str, image_size: int, **extra: Any) -> dict[str, Any]:
    """Facts for Program.model that the recorder cannot see from the ops."""
    return {"name": name, "image_size": image_size,
            "num_classes": int(getattr(model, "num_classes", 0)), **extra}


def _progress(total: int, desc: str, quiet: bool) -> tqdm:
    return tqdm(total=total, desc=desc, unit="step", file=sys.stderr, disable=quiet,
                leave=False, dynamic_ncols=True)


def settle_optimiser(optimiser: torch.optim.Optimizer) -> None:
    """One update with zero gradients, not recorded, so that the step recorded next is a
    steady-state one, as a real run records its second update (`train`'s record_at): an
    optimiser's first step builds its state (SGD's momentum is a copy of the gradient,
    AdamW's moments start as zeros) where every later step updates it (SGD: the momentum
    scaled and the gradient added). Used where one step is recorded on its own (plan
    mode); the gradients are dropped again, as `zero_grad` leaves them."""
    params = [p for group in optimiser.param_groups for p in group["params"]
              if p.requires_grad]
    with torch.no_grad():
        for p in params:
            p.grad = torch.zeros_like(p)
    optimiser.step()
    optimiser.zero_grad(set_to_none=True)


def train_step(model: nn.Module, optimiser: torch.optim.Optimizer, images: torch.Tensor,
               labels: torch.Tensor) -> torch.Tensor:
    """One real step on one micro-batch: zero grads, forward, backward, update. Returns
    the loss tensor: reading its value is left to the caller, outside any recording."""
    optimiser.zero_grad(set_to_none=True)
    _, loss = model(images, labels)
    loss.backward()
    optimiser.step()
    return loss


def accumulate_update(model: nn.Module, optimiser: torch.optim.Optimizer,
                      data: SyntheticImages, micro_batch: int, accumulation: int) -> float:
    """One weight update over `accumulation` micro-batches (as gradient accumulation does);
    returns the mean micro-batch loss."""
    optimiser.zero_grad(set_to_none=True)
    total = 0.0
    for _ in range(accumulation):
        images, labels = data.batch(micro_batch)
        _, loss = model(images, labels)
        (loss / accumulation).backward()
        total += float(loss.detach())
    optimiser.step()
    return total / accumulation


def train(model: nn.Module, optimiser: torch.optim.Optimizer, data: SyntheticImages, *,
          updates: int, micro_batch: int, accumulation: int = 1, desc: str = "training",
          quiet: bool = False, record_at: int | None = None,
          recorder: Any = None) -> RunResult:
    """`updates` real weight updates. With `recorder` (a callable returning a context
    manager), update number `record_at` is one micro-batch step run inside it: the step the
    profile models (its gradient accumulation is the recorder's Options')."""
    result = RunResult()
    model.train()
    start = time.perf_counter()
    with _progress(updates, desc, quiet) as bar:
        for step in range(updates):
            if recorder is not None and step == record_at:
                images, labels = data.batch(micro_batch)
                with recorder() as rec:
                    loss_tensor = train_step(model, optimiser, images, labels)
                loss = float(loss_tensor.detach())
                _collect(result, rec)
                result.samples += micro_batch
            else:
                loss = accumulate_update(model, optimiser, data, micro_batch, accumulation)
                result.samples += micro_batch * accumulation
            result.losses.append(loss)
            bar.set_postfix(loss=f"{loss:.4f}")
            bar.update()
    result.seconds = time.perf_counter() - start
    return result


def evaluate(model: nn.Module, data: SyntheticImages, *, batches: int, batch_size: int,
             desc: str = "inference", quiet: bool = False,
             recorder: Any = None) -> RunResult:
    """Forward-only passes; with `recorder`, the first batch runs inside it."""
    result = RunResult()
    model.eval()
    correct = 0
    start = time.perf_counter()
    with torch.no_grad(), _progress(batches, desc, quiet) as bar:
        for step in range(batches):
            images, labels = data.batch(batch_size)
            # forward only: the loss is not part of an inference program
            if recorder is not None and step == 0:
                with recorder() as rec:
                    logits = model(images)
                _collect(result, rec)
            else:
                logits = model(images)
            correct += int((logits.argmax(1) == labels).sum())
            # log_softmax is idempotent, so this is right for log-probabilities too
            result.losses.append(float(nn.functional.cross_entropy(logits, labels)))
            result.samples += batch_size
            bar.update()
    result.seconds = time.perf_counter() - start
    result.accuracy = correct / max(result.samples, 1)
    return result


def _collect(result: RunResult, rec: Any) -> None:
    path = getattr(rec, "profile_path", None)
    if path is not None:
        result.profiles.append(Path(path))
    report = getattr(rec, "report", None)
    if report is not None:
        result.summaries.append(dict(report.summary))


@contextlib.contextmanager
def no_op_recorder() -> Iterator[None]:
    yield None
