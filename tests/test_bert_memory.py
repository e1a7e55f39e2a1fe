"""How PopART holds BERT's memory (docs/cost-model.md, 'How PopART holds BERT's memory'):
per-layer recomputation checkpoints under pipeline recomputation, and the MLM / NSP heads
as the last pipeline stage on the embedding's IPU 0. Hand-worked figures from the
configuration of graphcore/examples nlp/bert/popart (commit 09b7c672)."""

from __future__ import annotations

import pytest

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
