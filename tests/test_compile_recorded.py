"""The compiler on programs the recorder really captured (tiny models, small batches)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from popviz.compiler import compile
from popviz.models import build
from popviz.models.training import train_step
from popviz.options import Options
from popviz.recorder import record_program
from popviz.recorder import train_step as step


def _record(name: str, size, batch: int, image: int, classes: int = 10):
    torch.manual_seed(0)
    model = build(name, size, num_classes=classes, image_size=image)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(batch, 1 if name == "tutorial" else 3, image, image)
    y = torch.randint(0, classes, (batch,))
    return record_program(train_step, model, opt, x, y, model=model, progress=False)


@pytest.fixture(scope="module")
def tutorial():
    return _record("tutorial", None, 4, 28)


@pytest.fixture(scope="module")
def resnet18():
    return _record("resnet", 18, 2, 32)


def test_tutorial_blocks_become_four_pipeline_stages(tutorial) -> None:
    r = compile(tutorial, Options(gradient_accumulation=8))
    s = r.summary
    assert s["stage_mode"] == "blocks" and s["num_ipus"] == 4 and s["fits"]
    stages = r.tables["stages"]
    assert stages["first_layer"].tolist() == ["B1", "B2", "B3", "B4"]
    assert stages["stash_depth"].tolist() == [7, 5, 3, 0]
    assert (stages[["forward_cycles", "backward_cycles", "optimiser_cycles"]] > 0).all().all()
    ops = r.tables["ops"]
    # backward and optimiser ops follow their forward block
    for phase in ("backward", "optimiser"):
        sub = ops[(ops["phase"] == phase) & (ops["block"] != "")]
        assert (sub["stage"] == sub["block"].str[1].astype(int) - 1).all(), phase
    json.dumps(s)
    sharded = compile(tutorial, Options(gradient_accumulation=8, strategy="sharded"))
    assert sharded.summary["step_cycles"] > s["step_cycles"]
    assert sharded.summary["idle_fraction"] > s["idle_fraction"]


def test_resnet_split_names_and_recomputation_on_a_recorded_step(resnet18) -> None:
    splits = ["b2/0", "b3/0", "b4/0"]
    with pytest.raises(ValueError, match=r"unknown pipeline split name.*valid: b1/0, b1/0/relu"):
        compile(resnet18, Options(splits=["b9/9"]))
    plain = compile(resnet18, Options(splits=splits, gradient_accumulation=4))
    recomp = compile(resnet18, Options(splits=splits, gradient_accumulation=4,
                                       recomputation=True))
    assert plain.tables["stages"]["first_layer"].tolist() == ["b0", *splits]
    p, r = plain.tables["stages"], recomp.tables["stages"]
    assert (r["recompute_cycles"].iloc[:3] > 0).all()
    assert (r["stash_bytes"].iloc[:3] < p["stash_bytes"].iloc[:3]).all()
    assert recomp.summary["step_cycles"] > plain.summary["step_cycles"]
    # stages 1..3 stash exactly what crosses into them
    assert (r["stash_bytes_per_microbatch"].iloc[1:3] == r["boundary_bytes"].iloc[1:3]).all()
    # a boundary's activation goes forward and its gradient comes back, per micro-batch
    ex = plain.tables["exchange"]
    assert len(ex[ex["kind"] == "activation"]) == 3 * 4 == len(ex[ex["kind"] == "gradient"])
    assert (ex.loc[ex["kind"] == "activation", "bytes"].to_numpy() > 0).all()


def test_recorded_compile_is_deterministic(resnet18) -> None:
    opts = Options(splits=["b3/0"], gradient_accumulation=2, recomputation=True,
                   precision="16.32", available_memory_proportion={"IPU0": 0.1, "IPU1": 0.3})
    a, b = compile(resnet18, opts), compile(resnet18, opts)
    for name in a.tables:
        pd.testing.assert_frame_equal(a.tables[name], b.tables[name])
    np.testing.assert_array_equal(a.arrays["tile_liveness"], b.arrays["tile_liveness"])
    assert a.summary == b.summary


def test_recorded_checkpoint_recompute_is_kept_and_other_sections_synthesized() -> None:
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
            self.b = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            x = self.a(x)
            x = checkpoint(self.b, x, use_reentrant=False)
            return self.fc(x.mean((2, 3)))

    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([0, 3])
    prog = record_program(step, net, opt, x, y, model=net, progress=False)
    recorded = prog.ops[prog.ops["phase"] == "recompute"]
    assert len(recorded) > 0
    r = compile(prog, Options(splits=["b", "fc"], gradient_accumulation=2, recomputation=True))
    ops = r.tables["ops"]
    rec = ops[ops["phase"] == "recompute"]
    # stage 1 ("b") keeps the recorded recompute; stage 0 ("a") gets synthesized copies
    assert set(rec.loc[rec["source_op"] < 0, "stage"]) == {1}
    assert set(rec.loc[rec["source_op"] >= 0, "stage"]) == {0}
    assert (r.tables["stages"]["recompute_cycles"].iloc[:2] > 0).all()
