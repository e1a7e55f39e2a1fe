"""GPT-2 (small / medium) as a causal language-model training step, built with HuggingFace
`transformers` from a configuration (no download, random weights; optional package, as
popviz.models.hf). Eager attention by default, PyTorch's fused SDPA with `attn="sdpa"`.

    model, inputs = build_gpt2("small", batch=8, sequence_length=1024)
    loss = model(**inputs)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from popviz.models.hf import _no_init_weights, _transformers, tie_weights

# size -> (hidden, layers, heads)
GPT2_SIZES: dict[str, tuple[int, int, int]] = {"small": (768, 12, 12), "medium": (1024, 24, 16),
                                               "tiny": (64, 2, 2)}


class Gpt2LM(nn.Module):
    """GPT2LMHeadModel returning only the loss (the step's scalar)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.lm = _transformers().GPT2LMHeadModel(config)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, labels=labels).loss


def build_gpt2(size: str, batch: int, *, sequence_length: int = 1024, vocab_size: int = 50257,
               attn: str = "eager", init_weights: bool = True, activation: str = "gelu_new"
               ) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A GPT-2 of `size` (small, medium, tiny) and one batch of token ids for it."""
    if size not in GPT2_SIZES:
        raise ValueError(f"unknown GPT-2 size {size!r}; valid: {', '.join(GPT2_SIZES)}")
    hidden, layers, heads = GPT2_SIZES[size]
    return build_gpt2_shape(layers, hidden, heads, vocab_size, batch,
                            sequence_length=sequence_length, attn=attn,
                            init_weights=init_weights, activation=activation)


# MLP activations: HF GPT-2's own (the tanh approximation as five ops, each output kept
# for the backward) or exact GELU, one op that keeps only its input, as Megatron-LM's fused
# bias-GELU runs it
ACTIVATIONS = ("gelu_new", "gelu")


def build_gpt2_shape(layers: int, hidden: int, heads: int, vocab_size: int, batch: int, *,
                     sequence_length: int = 1024, attn: str = "eager",
                     init_weights: bool = True, activation: str = "gelu_new",
                     tied: bool = True) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A GPT-2 of any shape (a published model's layers, hidden size, heads and
    vocabulary) and one batch of token ids for it; `tied=False`: the output layer its own
    matrix (Megatron's --untie-embeddings-and-output-weights)."""
    if attn not in ("eager", "sdpa"):
        raise ValueError(f"unknown attention {attn!r}; valid: eager, sdpa")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")
    tf = _transformers()
    config = tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, vocab_size=vocab_size,
                           n_positions=max(1024, sequence_length), attn_implementation=attn,
                           activation_function=activation, tie_word_embeddings=tied)
    import contextlib

    with contextlib.nullcontext() if init_weights else _no_init_weights():
        model = Gpt2LM(config)
    if not init_weights:
        tie_weights(model)
    ids = torch.randint(0, vocab_size, (batch, sequence_length))
    return model, {"input_ids": ids, "labels": ids}
