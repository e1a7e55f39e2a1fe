"""The PopTorch pipelining tutorial's MNIST CNN, in four blocks B1-B4 on IPUs 0-3.

Layers as in the tutorial (docs/hardware.md): conv 5x5 1->10, max-pool 2, ReLU;
conv 5x5 10->20, max-pool 2, ReLU; Linear 320->256 + ReLU; Linear 256->10; the loss
(log-softmax + NLL = cross-entropy) runs in the last block.
"""

from __future__ import annotations

import torch
from torch import nn

from popviz.models.common import block_scope

BLOCKS = ("B1", "B2", "B3", "B4")


class ConvLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int,
                 pool_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.pool = nn.MaxPool2d(pool_size)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.pool(self.conv(x)))


class TutorialNet(nn.Module):
    """`model(x)` -> log-probabilities; `model(x, labels)` -> (log-probabilities, loss)."""

    def __init__(self, image_size: int = 28, num_classes: int = 10) -> None:
        super().__init__()
        side = ((image_size - 4) // 2 - 4) // 2
        if side < 1:
            raise ValueError(f"image size {image_size} is too small for the tutorial CNN "
                             "(needs >= 16)")
        self.image_size = image_size
        self.num_classes = num_classes
        self.flat = 20 * side * side  # 320 at 28x28, as in the tutorial
        self.layer1 = ConvLayer(1, 10, 5, 2)
        self.layer2 = ConvLayer(10, 20, 5, 2)
        self.layer3 = nn.Linear(self.flat, 256)
        self.layer3_act = nn.ReLU()
        self.layer4 = nn.Linear(256, num_classes)
        self.softmax = nn.LogSoftmax(1)
        self.loss = nn.NLLLoss(reduction="mean")
        # the layer of an op is its block; the blocks are also the split points
        self.popviz_layer_names = {"layer1": "B1", "layer2": "B2", "layer3": "B3",
                                   "layer3_act": "B3", "layer4": "B4", "softmax": "B4",
                                   "loss": "B4"}
        self.popviz_split_names = list(BLOCKS[1:])

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None):
        with block_scope("B1", 0):
            x = self.layer1(x)
        with block_scope("B2", 1):
            x = self.layer2(x)
        with block_scope("B3", 2):
            x = x.reshape(-1, self.flat)
            x = self.layer3_act(self.layer3(x))
        with block_scope("B4", 3):
            x = self.softmax(self.layer4(x))
            if labels is not None:
                return x, self.loss(x, labels)
        return x
