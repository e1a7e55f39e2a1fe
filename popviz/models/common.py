"""Pieces the reference models share: popviz block scopes and learnable synthetic data."""

from __future__ import annotations

import contextlib
import math
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


def with_group_norm(model: nn.Module, groups: int) -> nn.Module:
    """`model` with every BatchNorm2d replaced by a GroupNorm of min(`groups`, channels)
    groups, as Graphcore's TensorFlow CNN application normalises by default (Models/
    resnet.py, resnext.py, efficientnet.py at graphcore/examples b30108f: `group_norm`
    unless `--batch-norm`; `groups` 32 for ResNet / ResNeXt, 4 in the EfficientNet-B4
    configurations). Each norm keeps its epsilon and its affine parameters' values (a
    zero-initialised gamma stays zero)."""
    if groups < 1:
        raise ValueError(f"group_norm must be a positive number of groups, got {groups}")
    for name, child in list(model.named_children()):
        if isinstance(child, nn.BatchNorm2d):
            channels = child.num_features
            norm = nn.GroupNorm(math.gcd(min(groups, channels), channels), channels,
                                eps=child.eps)
            with torch.no_grad():
                norm.weight.copy_(child.weight)
                norm.bias.copy_(child.bias)
            setattr(model, name, norm)
        else:
            with_group_norm(child, groups)
    return model
