"""How PopART holds BERT's memory (docs/cost-model.md, 'How PopART holds BERT's memory'):
per-layer recomputation checkpoints under pipeline recomputation, and the MLM / NSP heads
as the last pipeline stage on the embedding's IPU 0. Hand-worked figures from the
configuration of graphcore/examples nlp/bert/popart (commit 09b7c672)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from popviz.compiler import compile
from popviz.models.hf import checkpoint_layers
from popviz.options import Options


def test_checkpoint_layers_are_every_layer_but_each_ipus_last() -> None:
    # bert_model.py should_checkpoint: layers_per_ipu [3, 7, 7, 7] -> the last layer on
    # each IPU (2, 9, 16, 23) is copied to the next stage, every other one checkpointed
    ph1 = checkpoint_layers(24, (3, 7, 7, 7))
    assert len(ph1) == 20 and not {2, 9, 16, 23} & set(ph1)
    assert checkpoint_layers(12, (4, 4, 4)) == (0, 1, 2, 4, 5, 6, 8, 9, 10)
    assert checkpoint_layers(12, (4,)) == (0, 1, 2, 4, 5, 6, 8, 9, 10)  # one value: each IPU
    with pytest.raises(ValueError, match=r"layers_per_ipu \[3, 7\] does not split 24"):
        checkpoint_layers(24, (3, 7))


def test_the_heads_may_return_to_the_first_ipu_but_no_other_order() -> None:
    Options(stage_ipus=[0, 1, 2, 3, 0]).validate()  # PopART BERT: heads on IPU 0
    Options(stage_ipus=[0, 0, 1]).validate()
    with pytest.raises(ValueError, match="stages must be placed on IPUs in order"):
        Options(stage_ipus=[0, 2, 1]).validate()
    with pytest.raises(ValueError, match="stages must be placed on IPUs in order"):
        Options(stage_ipus=[0, 1, 2, 1]).validate()


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(*[nn.Linear(256, 256) for _ in range(6)])

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.body(x)
        return out, nn.functional.cross_entropy(out, y)


def test_offloaded_adam_state_comes_in_at_its_weights_update_not_at_its_creation() -> None:
    from popviz.models.training import train_step
    from popviz.recorder import record_program

    torch.manual_seed(0)
    model = _Mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    program = record_program(train_step, model, opt, torch.randn(4, 256),
                             torch.randint(0, 256, (4,)), model=model, progress=False)
    r = compile(program, Options(gradient_accumulation=4, optimiser_offload=True,
                                 precision="32.32"))
    v = r.tables["variables"]
    state = v[v["category"] == "optimiser_state"]
    # AdamW's first step makes every weight's exp_avg / exp_avg_sq before any update (its
    # _init_group); off chip they exist already, so each is on chip around its weight's
    # update only: at most two weights' state at once (one finishing, the next starting),
    # 2 weights x 2 states x 256 x 256 fp32 = 1 MiB and two biases' 4 KiB, of 3 MiB in all
    big = 256 * 256 * 4
    steps = np.arange(int(state["first_step"].min()), int(state["last_step"].max()) + 1)
    live = [int(state.loc[(state["first_step"] <= s) & (state["last_step"] >= s),
                          "bytes"].sum()) for s in steps]
    assert state["bytes"].sum() >= 12 * big
    assert max(live) <= 2 * 2 * big + 4 * 2 * 256 * 4
