"""Full recomputation on a GPU target checkpoints every repeated block, as Megatron-LM
(--recompute-method uniform, one layer) and torchtitan (full activation checkpointing) do;
an IPU target keeps PopART's rule. (Megatron's own small GPT: test_bench_gpu_mci.py.)"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from popviz.compiler import compile
from popviz.compiler.stages import repeated_block
from popviz.options import Options
from tooling.gpu_programs import gpu_program

BLOCK = r"^((?:[^.]*\.)*?[0-9]+)(?:\.|$)"


def test_repeated_block_is_the_path_to_the_first_numbered_part() -> None:
    paths = pd.Series(["lm.transformer.h.3.attn.c_attn", "lm.transformer.wte", "layer1.0",
                       "model.layers.12.mlp.up", "h3.attn", "a.1e3.b", "stem.0", ""])
    assert repeated_block(paths).tolist() == [
        "lm.transformer.h.3", "", "layer1.0", "model.layers.12", "", "", "stem.0", ""]


@pytest.fixture(scope="module")
def resnet() -> Any:
    return gpu_program("resnet", 18, 4, image=64)


def test_a_resnets_units_are_recomputed_each_before_its_own_backward(resnet: Any) -> None:
    report = compile(resnet, Options(target="h100", recomputation=True))
    ops = report.tables["ops"]
    step = report.tables["liveness"].set_index("op_id")["step"]
    rec = ops[ops["phase"] == "recompute"]
    units = rec["module"].astype(str).str.extract(BLOCK)[0]
    # the eight BasicBlocks; not the stem's numbered conv / norm / pool, not the head
    assert sorted(set(units)) == [f"layer{g}.{u}" for g in range(1, 5) for u in (0, 1)]
    back = ops[ops["phase"] == "backward"]
    back_units = back["module"].astype(str).str.extract(BLOCK)[0]
    order = []
    for unit in sorted(set(units)):
        last_recompute = step.reindex(rec.loc[units == unit, "op_id"]).max()
        first_backward = step.reindex(back.loc[back_units == unit, "op_id"]).min()
        assert last_recompute < first_backward, unit
        order.append(first_backward)
    assert order == sorted(order, reverse=True)  # the backward runs the units last-first


def test_an_ipu_target_keeps_poparts_sections(resnet: Any) -> None:
    """On an IPU each stage but the last is one section, recomputed before its first
    backward op; the last stage recomputes nothing."""
    options = Options(target="mk2", num_ipus=2, splits=["b3/0"], recomputation=True)
    ops = compile(resnet, options).tables["ops"]
    rec = ops[ops["phase"] == "recompute"]
    assert len(rec) and set(rec["stage"]) == {0}
