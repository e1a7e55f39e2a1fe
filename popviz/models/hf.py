"""Transformer workloads built with HuggingFace `transformers`, as Graphcore's published
BERT (pre-training, SQuAD fine-tuning) and ViT pre-training runs use them (calibration
points; see docs/cost-model.md).

`transformers` is NOT a runtime dependency of popviz (it is in the `test` and `bench`
extras): it is imported only when one of these models is built, and a missing package is
one clear error. Models are built from configurations (no download, random weights), so
they also build under FakeTensorMode (plan mode: no weights are materialised).

    model, inputs = build_transformer("bert", "large", batch=8, sequence_length=128)
    loss = model(**inputs)
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# name -> size -> (hidden, layers, heads, intermediate)
SIZES: dict[str, dict[str, tuple[int, int, int, int]]] = {
    "bert": {"base": (768, 12, 12, 3072), "large": (1024, 24, 16, 4096)},
    "vit": {"base-16": (768, 12, 12, 3072), "large-16": (1024, 24, 16, 4096)},
}

TASKS: dict[str, tuple[str, ...]] = {"bert": ("pretraining", "squad")}


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs only: never reach the network
    try:
        import transformers
    except ImportError:
        raise ImportError("this model needs the optional package 'transformers' "
                          "(pip install 'popviz[bench]' or 'popviz[test]')") from None
    transformers.logging.set_verbosity_error()
    return transformers


class BertPretraining(nn.Module):
    """BERT pre-training as Graphcore's PopART application runs it: the masked-LM head only
    on the `mask_tokens` masked positions (gathered), the next-sentence head on the pooled
    output, the decoder tied to the word embedding."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers.models.bert.modeling_bert import BertModel, BertPreTrainingHeads

        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor, masked_positions: torch.Tensor,
                masked_labels: torch.Tensor, next_sentence_label: torch.Tensor
                ) -> torch.Tensor:
        sequence, pooled = self.bert(input_ids=input_ids, token_type_ids=token_type_ids,
                                     attention_mask=attention_mask)[:2]
        index = masked_positions.unsqueeze(-1).expand(-1, -1, sequence.size(-1))
        scores, relationship = self.cls(torch.gather(sequence, 1, index), pooled)
        return (F.cross_entropy(scores.flatten(0, 1), masked_labels.flatten())
                + F.cross_entropy(relationship, next_sentence_label))


class SerialisedProjection(nn.Module):
    """The MLM projection onto the vocabulary as PopART BERT runs it with
    `embedding_serialization_vocab_steps` N > 1: `builder.setSerializeMatMul({x},
    'output_channels', N)` (graphcore/examples nlp/bert/popart/bert_model.py @09b7c672,
    `projection`) plans the matmul as N matmuls over a 1/N slice of the vocabulary each, one
    after the other, so each holds 1/N of the temporaries. Recorded as N matmuls over views
    of the tied weight; their outputs are joined (a copy PopART avoids by writing slices in
    place: one micro-batch's logits)."""

    def __init__(self, decoder: nn.Linear, steps: int) -> None:
        super().__init__()
        if decoder.out_features % steps:
            raise ValueError(f"embedding_serialization_vocab_steps {steps} does not divide "
                             f"the vocabulary ({decoder.out_features})")
        self.decoder = decoder  # keeps the weight tied to the word embedding
        self.steps = steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.decoder.weight.chunk(self.steps, 0)
        biases = self.decoder.bias.chunk(self.steps, 0) if self.decoder.bias is not None \
            else [None] * self.steps
        return torch.cat([F.linear(x, w, b) for w, b in zip(weights, biases, strict=True)], -1)


class BertSquad(nn.Module):
    """BERT fine-tuned on SQuAD as Graphcore's PopART application runs it: the encoder
    without its pooler and a 2-way span head on every token (start and end logits), the
    loss the mean of the start and end cross-entropies."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers.models.bert.modeling_bert import BertModel

        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor, start_positions: torch.Tensor,
                end_positions: torch.Tensor) -> torch.Tensor:
        sequence = self.bert(input_ids=input_ids, token_type_ids=token_type_ids,
                             attention_mask=attention_mask)[0]
        start, end = self.qa_outputs(sequence).unbind(-1)
        return (F.cross_entropy(start, start_positions)
                + F.cross_entropy(end, end_positions)) / 2


class VitClassifier(nn.Module):
    """ViT image classification (`ViTForImageClassification`); the loss is the output."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.vit = _transformers().ViTForImageClassification(config)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.vit(pixel_values=pixel_values, labels=labels).loss


def build_transformer(name: str, size: str, batch: int, *, sequence_length: int = 128,
                      mask_tokens: int = 20, vocab_size: int = 30522, image_size: int = 224,
                      num_classes: int = 1000, hidden_dropout: float = 0.1,
                      attention_dropout: float = 0.0, task: str = "pretraining",
                      recompute_checkpoint_every_layer: bool = False,
                      layers_per_ipu: tuple[int, ...] = (),
                      embedding_serialization_vocab_steps: int = 1,
                      init_weights: bool = True) -> tuple[nn.Module, dict[str, Any]]:
    """A freshly initialised model and one micro-batch of inputs for it (keyword arguments
    of its forward, which returns the loss). Eager attention: the matmuls and softmax the
    IPU applications run, not a fused kernel. `init_weights=False` skips HF's weight
    initialisation (plan mode: fake tensors have no values, and ViT's truncated normal
    init reads them). BERT's `task` is "pretraining" (masked LM + next sentence) or
    "squad" (span fine-tuning). `recompute_checkpoint_every_layer` with `layers_per_ipu`
    marks encoder layers' outputs as recomputation checkpoints as Graphcore's PopART BERT
    does (see `checkpoint_layers`); `embedding_serialization_vocab_steps` > 1 serialises
    the pre-training MLM projection as PopART does (`SerialisedProjection`)."""
    if name not in SIZES or size not in SIZES[name]:
        valid = ", ".join(f"{n} {s}" for n, sizes in SIZES.items() for s in sizes)
        raise ValueError(f"unknown transformer {name!r} size {size!r}; valid: {valid}")
    if task not in TASKS.get(name, ("pretraining",)):
        raise ValueError(f"unknown {name} task {task!r}; valid: "
                         f"{', '.join(TASKS.get(name, ('pretraining',)))}")
    if recompute_checkpoint_every_layer and name != "bert":
        raise ValueError(f"recompute_checkpoint_every_layer is modelled for bert only, "
                         f"not {name}")
    marked = checkpoint_layers(SIZES[name][size][1], tuple(layers_per_ipu)) \
        if recompute_checkpoint_every_layer else ()
    with contextlib.nullcontext() if init_weights else _no_init_weights():
        model, inputs = _build(name, size, batch, sequence_length, mask_tokens, vocab_size,
                               image_size, num_classes, hidden_dropout, attention_dropout,
                               task)
    if not init_weights:
        tie_weights(model)
    for i in marked:  # BertPretraining / BertSquad: model.bert is HF's BertModel
        cast(Any, model).bert.encoder.layer[i].register_forward_hook(_checkpoint_output)
    if embedding_serialization_vocab_steps > 1:
        if not isinstance(model, BertPretraining):
            raise ValueError("embedding_serialization_vocab_steps is modelled for BERT "
                             "pre-training only")
        predictions = model.cls.predictions
        predictions.decoder = SerialisedProjection(  # type: ignore[assignment]  # same call
            predictions.decoder, embedding_serialization_vocab_steps)
    return model, inputs


def checkpoint_layers(num_layers: int, layers_per_ipu: tuple[int, ...]) -> tuple[int, ...]:
    """The encoder layers whose output is a recomputation checkpoint with PopART BERT's
    `recompute_checkpoint_every_layer` (on by default): every layer but the last on each
    IPU, whose output is copied to the next pipeline stage instead of stashed here
    (graphcore/examples nlp/bert/popart/bert_model.py, commit 09b7c672, `should_checkpoint`
    and `build_graph`: `x = self.builder.checkpointOutput([x])[0]`). With pipeline
    recomputation (RecomputationType.Pipeline) each checkpoint is stashed and each layer is
    recomputed from the previous one's, so at most one layer's activations are live on an
    IPU in the backward ("keeping the max liveness of activations to be at most one
    Encoder layer on each IPU", BertConfig's comment)."""
    per = list(layers_per_ipu) or [num_layers]
    if len(per) == 1:
        per = per * max(num_layers // max(per[0], 1), 1)
    if sum(per) != num_layers or min(per) < 1:
        raise ValueError(f"layers_per_ipu {list(layers_per_ipu)} does not split "
                         f"{num_layers} layers")
    ends = set(np.cumsum(per) - 1)
    return tuple(i for i in range(num_layers) if i not in ends)


def _checkpoint_output(module: nn.Module, args: Any, output: Any) -> None:
    from popviz.annotate import recomputation_checkpoint

    recomputation_checkpoint(output[0] if isinstance(output, (tuple, list)) else output)


def tie_weights(model: nn.Module) -> None:
    """Tie the HF model's embeddings to its output layer as its config says. HF ties them
    while it initialises the weights, which `_no_init_weights` skips: without this a
    GPT-2 or BERT built for a plan holds its vocabulary matrix twice (38.6 M extra
    parameters in GPT-2 small)."""
    pretrained = _transformers().PreTrainedModel
    for module in model.modules():
        if isinstance(module, pretrained):
            module.tie_weights()
            return


def _no_init_weights() -> Any:
    _transformers()
    try:  # transformers >= 5
        from transformers.initialization import no_init_weights
    except ImportError:
        from transformers.modeling_utils import (  # type: ignore[attr-defined, no-redef, unused-ignore]  # < 5
            no_init_weights,
        )
    return no_init_weights()


def _build(name: str, size: str, batch: int, sequence_length: int, mask_tokens: int,
           vocab_size: int, image_size: int, num_classes: int, hidden_dropout: float,
           attention_dropout: float, task: str) -> tuple[nn.Module, dict[str, Any]]:
    hidden, layers, heads, inner = SIZES[name][size]
    tf = _transformers()
    common = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  intermediate_size=inner, hidden_dropout_prob=hidden_dropout,
                  attention_probs_dropout_prob=attention_dropout, attn_implementation="eager")
    if name == "bert" and task == "squad":
        squad = BertSquad(tf.BertConfig(vocab_size=vocab_size, **common))
        ids = torch.randint(0, vocab_size, (batch, sequence_length))
        return squad, {"input_ids": ids, "token_type_ids": torch.zeros_like(ids),
                       "attention_mask": torch.ones_like(ids),
                       "start_positions": torch.randint(0, sequence_length, (batch,)),
                       "end_positions": torch.randint(0, sequence_length, (batch,))}
    if name == "bert":
        model: nn.Module = BertPretraining(tf.BertConfig(vocab_size=vocab_size, **common))
        ids = torch.randint(0, vocab_size, (batch, sequence_length))
        return model, {"input_ids": ids, "token_type_ids": torch.zeros_like(ids),
                       "attention_mask": torch.ones_like(ids),
                       "masked_positions": torch.randint(0, sequence_length,
                                                         (batch, mask_tokens)),
                       "masked_labels": torch.randint(0, vocab_size, (batch, mask_tokens)),
                       "next_sentence_label": torch.randint(0, 2, (batch,))}
    patch = int(size.rsplit("-", 1)[1])
    model = VitClassifier(tf.ViTConfig(image_size=image_size, patch_size=patch,
                                       num_labels=num_classes, layer_norm_eps=1e-6,
                                       **common))
    return model, {"pixel_values": torch.randn(batch, 3, image_size, image_size),
                   "labels": torch.randint(0, num_classes, (batch,))}


def loss_step(model: nn.Module, optimiser: torch.optim.Optimizer,
              inputs: dict[str, Any]) -> torch.Tensor:
    """One training step on one micro-batch: zero grads, forward (the loss), backward,
    update."""
    optimiser.zero_grad(set_to_none=True)
    loss = model(**inputs)
    loss.backward()
    optimiser.step()
    return loss
