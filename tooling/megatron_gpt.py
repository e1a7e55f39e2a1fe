"""A GPT as Megatron-LM's `GPTModel` builds it by default, in plain PyTorch, for plans of the
published Megatron runs whose shape HuggingFace's GPT-2 cannot take (grouped-query
attention, untied embeddings):

    net, inputs = build_megatron_gpt(32, 4096, 32, 8, 131200, batch=1, sequence_length=8192)

Megatron's defaults (megatron/training/arguments.py): learned absolute positions, LayerNorm
before attention and before the MLP, linear layers with biases, a 4h MLP with GELU (one op
that keeps its input, as the fused bias-GELU does), dropout 0.1 on the embeddings, in the
attention and after each residual branch, untied word embeddings with
`--untie-embeddings-and-output-weights`. Attention is `F.scaled_dot_product_attention` with
`enable_gqa`: a plan records it as the fused kernel that keeps the unexpanded keys and
values (popviz/recorder/attention.py), as Transformer Engine's flash attention does.

What differs from Megatron: the tensors are [batch, sequence, hidden], not [sequence,
batch, hidden] (the same bytes); the loss is `F.cross_entropy` on fp32 logits (Megatron's
vocab-parallel cross entropy also computes in fp32, in place); Transformer Engine's fused
LayerNorm + linear modules are separate ops here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DROPOUT = 0.1  # Megatron's --attention-dropout and --hidden-dropout defaults


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, groups: int) -> None:
        super().__init__()
        if hidden % heads or heads % groups:
            raise ValueError(f"hidden {hidden}, heads {heads}, query groups {groups}: the "
                             "heads must divide the hidden size and the groups the heads")
        self.heads, self.groups, self.dim = heads, groups, hidden // heads
        self.qkv = nn.Linear(hidden, hidden + 2 * groups * self.dim)
        self.proj = nn.Linear(hidden, hidden)
        self.drop = nn.Dropout(DROPOUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        kv = self.groups * self.dim
        q, k, v = self.qkv(x).split([h, kv, kv], dim=-1)
        q = q.view(b, s, self.heads, self.dim).transpose(1, 2)
        k = k.view(b, s, self.groups, self.dim).transpose(1, 2)
        v = v.view(b, s, self.groups, self.dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=DROPOUT, is_causal=True,
                                           enable_gqa=self.groups != self.heads)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, s, h)))


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, groups: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, groups)
        self.ln_2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.drop = nn.Dropout(DROPOUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln_2(x)))))


class MegatronGpt(nn.Module):
    """Embeddings, `layers` transformer layers (`h.<i>`: a split before layer i is
    `h.<i>.ln_1`), the final norm (`ln_f`), the output layer and the loss."""

    def __init__(self, layers: int, hidden: int, heads: int, groups: int, vocab: int,
                 sequence_length: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(sequence_length, hidden)
        self.drop = nn.Dropout(DROPOUT)
        self.h = nn.ModuleList(Layer(hidden, heads, groups) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1])
        x = self.drop(self.wte(input_ids) + self.wpe(positions))
        for layer in self.h:
            x = layer(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def build_megatron_gpt(layers: int, hidden: int, heads: int, groups: int, vocab: int,
                       batch: int, *, sequence_length: int
                       ) -> tuple[MegatronGpt, dict[str, torch.Tensor]]:
    """The model and one batch of token ids (labels: the ids, as a mock dataset gives)."""
    net = MegatronGpt(layers, hidden, heads, groups, vocab, sequence_length)
    ids = torch.randint(0, vocab, (batch, sequence_length))
    return net, {"input_ids": ids, "labels": ids}
