"""Pieces the reference models share: popviz block scopes and learnable synthetic data."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def block_scope(name: str, ipu_id: int | None = None) -> Iterator[None]:
    """`popviz.Block(name, ipu_id)`: outside recording it changes nothing, so the models
    compute the same numbers with or without popviz annotations."""
    from popviz.annotate import Block  # annotate sits below models in the layering

    with Block(name, ipu_id=ipu_id):
        yield


class HeadWithLoss(nn.Module):
    """Global average pool, flatten, classifier and (given labels) cross-entropy, so the loss
    ops belong to the last layer and so to the last pipeline stage."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_features, num_classes)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None):
        logits = self.fc(torch.flatten(self.pool(x), 1))
        if labels is None:
            return logits
        return logits, self.loss(logits, labels)


class SyntheticImages:
    """Learnable synthetic classification data: each class has a fixed random template
    image; a sample is its class template plus noise (`stream` picks the samples). A model
    learns it in a few steps, unlike pure noise, and it needs no download. Deterministic
    for a given seed."""

    def __init__(self, num_classes: int, channels: int, image_size: int, seed: int = 0,
                 noise: float = 0.5, stream: int = 1) -> None:
        self.num_classes = num_classes
        self.shape = (channels, image_size, image_size)
        self.noise = noise
        gen = torch.Generator().manual_seed(seed)
        self.templates = torch.randn((num_classes, *self.shape), generator=gen)
        # same templates, another sample stream: a held-out set of the same task
        self._gen = torch.Generator().manual_seed(seed * 1000 + stream)

    def batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, self.num_classes, (batch_size,), generator=self._gen)
        noise = torch.randn((batch_size, *self.shape), generator=self._gen)
        return self.templates[labels] + self.noise * noise, labels
