"""How PopART holds BERT's memory (docs/cost-model.md, 'How PopART holds BERT's memory'):
per-layer recomputation checkpoints under pipeline recomputation, and the MLM / NSP heads
as the last pipeline stage on the embedding's IPU 0. Hand-worked figures from the
configuration of graphcore/examples nlp/bert/popart (commit 09b7c672)."""

from __future__ import annotations

import math
from dataclasses import replace

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
    from popviz.models.hf import build_transformer

    with pytest.raises(ValueError, match="modelled for bert only, not vit"):
        build_transformer("vit", "base-16", 1, recompute_checkpoint_every_layer=True)


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


@pytest.fixture(scope="module")
def ph1() -> dict:
    pytest.importorskip("transformers")
    from tooling.calibration import load_points, point_options, point_program

    point = next(p for p in load_points()
                 if p["id"] == "bow-bertlarge-ph1-train-pod16-mb8-fits")
    report = compile(point_program(point), point_options(point))
    return {"report": report, "point": point}


def test_bert_large_stashes_one_checkpoint_per_layer_and_heads_sit_on_ipu0(ph1) -> None:
    r = ph1["report"]
    st = r.tables["stages"]
    # 5 stages: embeddings + 3 layers, 7, 7, 7 layers, then the heads back on IPU 0
    assert st["ipu"].tolist() == [0, 1, 2, 3, 0]
    assert st["stash_depth"].tolist() == [9, 7, 5, 3, 0]  # 2 x (stages after) + 1
    # stage 1 (layers 3-9) per micro-batch, micro-batch 8 x 128 tokens x 1024 in fp16:
    # its input and 6 checkpoints (layers 3-8's outputs; layer 9's goes to IPU2), the
    # extended attention mask 8 x 128 x 128 and each checkpoint LayerNorm's mean and
    # reciprocal std (8 x 128 each)
    b, s, h = 8, 128, 1024
    expected = 7 * b * s * h * 2 + b * s * s * 2 + 6 * 2 * b * s * 2
    assert st["stash_bytes_per_microbatch"].iloc[1:4].tolist() == [expected] * 3 == [14_966_784] * 3
    assert not r.summary.get("shared_parameters")  # the tied decoder sits with its embedding
    assert r.summary["fits"]


def test_bert_large_recomputes_one_layer_at_a_time(ph1) -> None:
    r = ph1["report"]
    v, ops = r.tables["variables"], r.tables["ops"]
    module = dict(zip(ops["op_id"].tolist(), ops["module"].astype(str).tolist(), strict=True))
    rec = v[(v["ipu"] == 1) & v["name"].str.endswith("(recomputed)")].copy()
    op = rec["name"].str.extract(r"#(\d+)")[0].astype(int)
    rec["layer"] = op.map(module).str.extract(r"layer\.(\d+)\.")[0]
    assert set(rec["layer"]) == {str(i) for i in range(3, 10)}  # IPU1's seven layers
    steps = range(int(rec["first_step"].min()), int(rec["last_step"].max()) + 1)
    most = max(rec.loc[(rec["first_step"] <= t) & (rec["last_step"] >= t), "layer"].nunique()
               for t in steps)
    assert most == 1  # "max liveness of activations ... at most one Encoder layer"


def test_bert_large_ffn_matmul_plan_by_hand() -> None:
    """The encoder's widest forward matmul, [1024 tokens x 1024] x [1024 x 4096] (micro-
    batch 8 x sequence 128), on a Bow tile at AMP 0.25 with half partials: the plan's
    temporary bytes per tile worked from its partition (docs/cost-model.md section 2)."""
    from popviz.target import get_target
    from popviz.target.convparams import matmul_passes
    from popviz.target.convplan import plan_conv
    from popviz.target.cost import Precision, tile_arch

    arch = tile_arch(get_target("bow"), Precision.parse("16.16", half_partials=True))
    (p,) = matmul_passes("aten.addmm.default", "[4096];[1024,1024];[1024,4096]", 0)
    assert (p.batch, p.in_chans, p.out_chans) == (1024, 1024, 4096)
    plan = plan_conv(p, arch, 0.25)
    pb, ph, pw, pg, pi, po = plan.partition
    assert (ph, pw, pg) == (1, 1, 1) and pb * pi * po == plan.tiles <= 1472
    assert not plan.ignored and plan.serial == ("", 1)
    # a tile's share: ceil(1024 / pb) rows, its input channels in blocks of 16 (the AMP
    # vertex's), its output channels in blocks of 16 (the AMP units)
    rows = math.ceil(1024 / pb)
    cin = math.ceil(math.ceil(1024 / 16) / pi) * 16
    cout = math.ceil(math.ceil(4096 / 16) / po) * 16
    inputs, weights = rows * cin * 2, cin * cout * 2  # fp16
    partials = rows * cout * 2  # half partials
    # what comes over the exchange: the input slice unless this tile holds it (shared by
    # the po output-channel slices), the weights unless held (shared by the pb row slices)
    temp = inputs * (1 - 1 / po) + weights * (1 - 1 / pb) + partials
    assert plan.temp_bytes == pytest.approx(temp, rel=1e-12)
    assert plan.temp_bytes <= 0.25 * 638_976  # within AMP x the Bow's 624 KiB
    # PopLibs' own estimate counts every input and weight byte: still within the cap
    assert inputs + weights + partials <= 0.25 * 638_976
    # the busiest tile cannot beat 64 fp16 MACs a cycle on a tile with AMP over its share
    assert plan.cycles >= 1024 * 1024 * 4096 / (plan.tiles * 64)


def test_the_vocabulary_projection_is_serialised_as_popart_does() -> None:
    """embedding_serialization_vocab_steps N (bert_model.py `projection`:
    setSerializeMatMul(..., 'output_channels', N)): N matmuls over 1/N of the vocabulary
    each, the weight still the word embedding's, the same loss; each slice's plan holds
    about 1/N of the temporaries of the whole projection at AMP 1."""
    from popviz.models.hf import build_transformer, loss_step
    from popviz.recorder import record_program
    from popviz.target import get_target
    from popviz.target.convparams import op_passes
    from popviz.target.convplan import plan_conv
    from popviz.target.cost import Precision, tile_arch

    # 1,280 words: each of 4 slices a whole number of 16-channel blocks (no padding copy)
    kw = dict(sequence_length=16, mask_tokens=4, vocab_size=1280)
    torch.manual_seed(0)
    whole, inputs = build_transformer("bert", "base", 2, **kw)
    torch.manual_seed(0)
    serial, _ = build_transformer("bert", "base", 2, embedding_serialization_vocab_steps=4,
                                  **kw)
    decoder = serial.cls.predictions.decoder
    assert decoder.decoder.weight is serial.bert.embeddings.word_embeddings.weight
    whole.eval(), serial.eval()  # no dropout: the same weights give the same loss
    assert torch.allclose(whole(**inputs), serial(**inputs))
    whole.train(), serial.train()
    with pytest.raises(ValueError, match="does not divide the vocabulary"):
        build_transformer("bert", "base", 1, embedding_serialization_vocab_steps=7, **kw)

    def vocab_matmuls(model: nn.Module) -> list:
        opt = torch.optim.AdamW(model.parameters())
        ops = record_program(loss_step, model, opt, inputs, model=model, mode="measured",
                             progress=False).ops
        ops = ops[(ops["op_class"] == "matmul") & (ops["phase"] == "forward")
                  & ops["module"].str.startswith("cls.predictions.decoder")]
        return [op_passes(r.op, r.op_class, r.shapes, r.out_shape, r.flops)[0]
                for r in ops.itertuples()]

    one, four = vocab_matmuls(whole), vocab_matmuls(serial)
    assert len(one) == 1 and len(four) == 4
    assert one[0].batch == 8 and all(p.batch == 8 for p in four)  # 2 x 4 masked tokens
    assert sum(p.out_chans for p in four) == one[0].out_chans == 1280
    # planned at the rows a real micro-batch gives (2 sequences x 76 masked tokens, the
    # MLPerf configuration's mask_tokens), as a compile rescales the recorded shapes: the
    # test's 8 rows are all fixed cost once each compute set pays its start-up
    arch = tile_arch(get_target("bow"), Precision.parse("16.16", half_partials=True))
    t_one = plan_conv(replace(one[0], batch=152), arch, 1.0).temp_bytes
    t_four = max(plan_conv(replace(p, batch=152), arch, 1.0).temp_bytes for p in four)
    assert t_four < 0.5 * t_one
