"""Memory as PopART / PopTorch / TensorFlow account it, each mechanism against a hand
calculation: bytes by precision and sharding, offloaded optimiser state, the pipeline
stash, vertex code per vertex type, outlining, dropout masks and tied weights."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import popviz
from popviz.compiler import compile
from popviz.compiler.accounting import stored_bytes
from popviz.compiler.tilecode import tile_code
from popviz.options import Options
from popviz.target import get_target, register_target
from popviz.target.cost import Precision
from tooling.testing.programs import synthetic_program

WEIGHTS = ("parameter", "gradient", "optimiser_state")


def _tensors() -> pd.DataFrame:
    rows = [("w", 4000, "parameter"), ("w.grad", 4000, "gradient"),
            ("w.momentum", 4000, "optimiser_state"), ("act", 4000, "activation"),
            ("labels", 800, "input")]
    return pd.DataFrame({"name": [r[0] for r in rows], "bytes": [r[1] for r in rows],
                         "category": [r[2] for r in rows],
                         "dtype": ["float32"] * 4 + ["int64"]})


@pytest.mark.parametrize(("precision", "expected"), [
    # weight, accumulator, optimiser state, activation (fp32 recorded: 1,000 values), int64
    ("16.16", [2000, 2000, 2000, 2000, 800]),  # fp16 weights and fp16 accumulators
    ("16.32", [4000, 4000, 4000, 2000, 800]),  # fp32 master weights, fp16 compute
    ("32.32", [4000, 4000, 4000, 4000, 800]),
])
def test_bytes_by_precision(precision: str, expected: list[int]) -> None:
    got = stored_bytes(_tensors(), Precision.parse(precision, False), Options(precision=precision))
    assert got.tolist() == expected


def test_replicated_tensor_sharding_shards_only_the_optimiser_state() -> None:
    opts = Options(precision="16.16", replication_factor=4).set_replicated_tensor_sharding()
    got = stored_bytes(_tensors(), Precision.parse("16.16", False), opts)
    assert got.tolist() == [2000, 2000, 500, 2000, 800]  # 2,000 / 4 replicas
    one = Options(precision="16.16", replicated_tensor_sharding=True)  # one replica: no shard
    assert stored_bytes(_tensors(), Precision.parse("16.16", False), one)[2] == 2000


@pytest.fixture(scope="module")
def chain():
    return synthetic_program(layers=4, batch=2, channels=8, hw=8)


def _weights(program, categories: tuple[str, ...], factor: float) -> float:
    t = program.tensors
    return float(t.loc[t["category"].isin(categories), "bytes"].sum()) * factor


@pytest.mark.parametrize(("precision", "factor"), [("16.16", 0.5), ("16.32", 1.0)])
def test_always_live_is_weights_accumulators_and_state_as_stored(chain, precision, factor
                                                                 ) -> None:
    base = dict(precision=precision, gradient_accumulation=2)
    r = compile(chain, Options(**base))
    # always-live tensors: weights, accumulators and momentum (SGD) at the weight precision
    always = r.tables["tile_memory"]["always_live"].sum()
    assert always == pytest.approx(_weights(chain, WEIGHTS, factor), rel=2e-3, abs=2048)
    off = compile(chain, Options(**base, optimiser_offload=True))
    assert off.tables["tile_memory"]["always_live"].sum() == pytest.approx(
        _weights(chain, ("parameter", "gradient"), factor), rel=2e-3, abs=2048)
    rts = compile(chain, Options(**base, replication_factor=4,
                                 replicated_tensor_sharding=True))
    assert rts.tables["tile_memory"]["always_live"].sum() == pytest.approx(
        _weights(chain, ("parameter", "gradient"), factor)
        + _weights(chain, ("optimiser_state",), factor) / 4, rel=2e-3, abs=2048)


def test_offloaded_state_is_streamed_in_per_weight_not_all_at_once(chain) -> None:
    r = compile(chain, Options(gradient_accumulation=2, optimiser_offload=True))
    v = r.tables["variables"]
    state = v[v["category"] == "optimiser_state"]
    assert len(state) == (chain.tensors["category"] == "optimiser_state").sum() > 1
    ops = r.tables["ops"]
    wu = ops.loc[ops["pass"] == "WU", "step"]
    assert (state["first_step"] >= wu.min()).all() and (state["last_step"] <= wu.max()).all()
    # at no step is all of it on chip: each weight's state around its own update only
    steps = np.arange(wu.min(), wu.max() + 1)
    live = [state.loc[(state["first_step"] <= s) & (state["last_step"] >= s), "bytes"].sum()
            for s in steps]
    assert max(live) < state["bytes"].sum()


def test_stash_depth_by_position_and_only_stage_inputs_under_recomputation() -> None:
    prog = synthetic_program(layers=8, batch=2, channels=8, hw=8)
    opts = Options(splits=["l2", "l4", "l6"], recomputation=True, gradient_accumulation=16)
    st = compile(prog, opts).tables["stages"]
    # PopART: 2 x (IPUs after this one) + 1, none on the last IPU
    assert st["stash_depth"].tolist() == [7, 5, 3, 0]
    # under pipeline recomputation a stage stashes its input only: what crosses into it
    inner = st.iloc[1:3]
    assert (inner["stash_bytes_per_microbatch"] == inner["boundary_bytes"]).all()
    assert (st["stash_bytes"] == st["stash_depth"] * st["stash_bytes_per_microbatch"]).all()
    plain = compile(prog, Options(splits=["l2", "l4", "l6"], gradient_accumulation=16))
    assert (plain.tables["stages"]["stash_bytes_per_microbatch"].iloc[1:3]
            > inner["stash_bytes_per_microbatch"].to_numpy()).all()


def _ops(rows: list[tuple[str, str]], tiles: int) -> pd.DataFrame:
    return pd.DataFrame({
        "op_id": np.arange(len(rows)), "op": [r[0] for r in rows],
        "module": [r[1] for r in rows], "dtype": "float32", "shapes": "[8,8]",
        "pass": "F", "ipu": 0, "tiles_used": tiles, "source_op": -1, "plan": ""})


def test_vertex_code_once_per_type_per_tile_control_code_per_op() -> None:
    register_target({"name": "test16", "base": "mk2", "tiles_per_ipu": 16}, replace=True)
    target = get_target("test16")
    c = target.cost
    ops = _ops([("aten.add.Tensor", "layer.0.a"), ("aten.add.Tensor", "layer.0.b"),
                ("aten.mul.Tensor", "layer.0.c")], tiles=16)
    code, exch, state = tile_code(ops, target, Options(), 1)
    # 2 vertex types (add, mul), 3 compute sets, on every tile
    assert code[0].tolist() == [target.tile_overhead_bytes + 2 * c.vertex_code_bytes_per_type
                                + 3 * c.control_code_bytes_per_op_per_tile] * 16
    assert exch[0].tolist() == [3 * c.exchange_code_bytes_per_op_per_tile] * 16
    assert state[0].tolist() == [3 * c.vertex_state_bytes_per_op_per_tile] * 16


def test_outlining_shares_the_compute_sets_of_repeated_layers() -> None:
    register_target({"name": "test16", "base": "mk2", "tiles_per_ipu": 16}, replace=True)
    target = get_target("test16")
    c = target.cost
    ops = _ops([("aten.add.Tensor", "enc.layer.0.ffn"), ("aten.add.Tensor", "enc.layer.1.ffn"),
                ("aten.add.Tensor", "enc.layer.2.ffn"), ("aten.add.Tensor", "enc.head")],
               tiles=16)
    plain = tile_code(ops, target, Options(), 1)
    outlined = tile_code(ops, target, Options().set_outlining(), 1)
    # one vertex type either way; 4 compute sets, or 2 (layers 0-2 are one outlined call)
    assert plain[0][0, 0] - outlined[0][0, 0] == 2 * c.control_code_bytes_per_op_per_tile
    assert plain[2][0, 0] == 4 * c.vertex_state_bytes_per_op_per_tile
    assert outlined[2][0, 0] == 2 * c.vertex_state_bytes_per_op_per_tile
    assert outlined[1][0, 0] == 2 * c.exchange_code_bytes_per_op_per_tile


def test_a_dropout_mask_is_drawn_again_in_the_backward_not_kept() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.5),
                                torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with popviz.record(Options(), profile_dir=None, model=model, progress=False) as rec:
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
    r = compile(rec.program, rec.options)
    ops = r.tables["ops"].set_index("op_id")
    fill = ops.index[ops["op"].str.contains("bernoulli")][0]
    mask = int(ops.loc[fill, "inputs"])
    name = r.tables["tensors"].set_index("tensor_id").loc[mask, "name"]
    v = r.tables["variables"]
    kept, drawn = v[v["name"] == name], v[v["name"] == f"{name} (drawn again)"]
    first_b = ops.loc[ops["pass"] == "B", "step"].min()
    assert len(kept) == 1 and int(kept["last_step"].iloc[0]) < first_b
    assert len(drawn) == 1 and (drawn["first_step"] == drawn["last_step"]).all()
    assert int(drawn["first_step"].iloc[0]) >= first_b


def test_a_planned_conv_runs_its_plans_vertices_and_a_reduction() -> None:
    from popviz.compiler.tilecode import vertex_types

    ops = pd.DataFrame({"op": ["aten.convolution.default", "aten.relu.default"],
                        "dtype": ["float32", "float32"],
                        "plan": ["fwd: amp16: batch/1 height/2 width/1 groups/1 in/1 out/4 on "
                                 "8 tiles; bwd: slic: batch/1 height/1 width/1 groups/1 in/2 "
                                 "out/4 on 8 tiles; wu: amp16: batch/2 height/1 width/1 groups/1 "
                                 "in/1 out/4 on 8 tiles", ""]})
    assert vertex_types(ops) == [("conv:amp16", "conv:reduce", "conv:slic"),
                                 ("aten.relu.default:float32",)]
