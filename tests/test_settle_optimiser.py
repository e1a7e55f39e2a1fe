"""Plan mode records a steady-state update (models.training.settle_optimiser), as a real
run records its second one: an optimiser's first step builds its state instead."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from popviz.models.training import settle_optimiser
from popviz.recorder import record_program


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(torch.relu(self.fc1(x)))
        return out, nn.functional.cross_entropy(out, y)


def _update_ops(make_optimiser, settle: bool) -> list[str]:
    torch.manual_seed(0)
    model = Tiny()
    opt = make_optimiser(model.parameters())
    if settle:
        settle_optimiser(opt)
    assert all(p.grad is None for p in model.parameters())  # as zero_grad leaves them

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        _, loss = model(x, y)
        loss.backward()
        opt.step()

    program = record_program(step, torch.randn(2, 8), torch.tensor([0, 3]), model=model,
                             mode="plan")
    ops = program.ops
    return ops.loc[ops["phase"] == "optimiser", "op"].astype(str).tolist()


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-3)


def test_sgd_with_momentum_scales_its_momentum_and_adds_the_gradient() -> None:
    first = _update_ops(_sgd, settle=False)
    steady = _update_ops(_sgd, settle=True)
    # the first step copies the gradient into a new momentum buffer
    assert any("clone" in op for op in first)
    assert not any("mul" in op for op in first)
    # every later one scales the momentum (mul_) and adds the gradient to it
    assert not any("clone" in op for op in steady)
    assert any("mul" in op for op in steady)


def test_adamw_builds_no_moments_in_the_recorded_step() -> None:
    first = _update_ops(_adamw, settle=False)
    steady = _update_ops(_adamw, settle=True)
    made = ("zeros_like", "zeros", "empty", "fill")
    assert any(any(m in op for m in made) for op in first)
    assert len(steady) < len(first)
    assert not any("zeros_like" in op for op in steady)


@pytest.mark.parametrize("make", [_sgd, _adamw])
def test_settling_leaves_the_weights_for_zero_gradients(make) -> None:
    torch.manual_seed(0)
    model = Tiny()
    before = [p.detach().clone() for p in model.parameters()]
    opt = make(model.parameters())
    settle_optimiser(opt)
    for b, p in zip(before, model.parameters(), strict=True):
        # SGD leaves them; AdamW's decoupled weight decay shrinks them by lr x decay
        assert torch.allclose(b * (1 - 1e-3 * 0.01) if isinstance(opt, torch.optim.AdamW)
                              else b, p)
