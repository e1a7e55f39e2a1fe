"""ResNet-18/34/50/101/152 and ResNeXt-50/101 (32x4d), written here (no torchvision).

Layer names follow Graphcore's TensorFlow CNN application, so its published pipeline
splits work unchanged (docs/hardware.md): `b0` is the stem; unit u (0-based) of
group g = 1..4 is `b{g}/{u}` and its final ReLU, a module of its own, is `b{g}/{u}/relu`;
`fc` is the pooled classifier (and the loss).
"""

from __future__ import annotations

import torch
from torch import nn

# model size -> (unit type, units per group); He et al. 2016, Xie et al. 2017
RESNET_SIZES: dict[int, tuple[str, tuple[int, int, int, int]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}
RESNEXT_SIZES: dict[int, tuple[int, int, int, int]] = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels)


class BasicUnit(nn.Module):
    """Two 3x3 convs (ResNet-18/34); relu_out is the unit's last layer, `b{g}/{u}/relu`."""

    expansion = 1

    def __init__(self, in_ch: int, width: int, stride: int, groups: int = 1,
                 base_width: int = 64) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 3, stride, 1, bias=False)
        self.bn1 = _bn(width)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(width, out_ch, 3, 1, 1, bias=False)
        self.bn2 = _bn(out_ch)
        self.downsample = _shortcut(in_ch, out_ch, stride)
        self.relu_out = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu_out(y + identity)


class BottleneckUnit(nn.Module):
    """1x1, 3x3 (grouped for ResNeXt), 1x1 with 4x expansion; stride on the 3x3."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int, groups: int = 1,
                 base_width: int = 64) -> None:
        super().__init__()
        inner = int(width * (base_width / 64.0)) * groups
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, inner, 1, bias=False)
        self.bn1 = _bn(inner)
        self.conv2 = nn.Conv2d(inner, inner, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = _bn(inner)
        self.conv3 = nn.Conv2d(inner, out_ch, 1, bias=False)
        self.bn3 = _bn(out_ch)
        self.relu = nn.ReLU()
        self.downsample = _shortcut(in_ch, out_ch, stride)
        self.relu_out = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu_out(y + identity)


def _shortcut(in_ch: int, out_ch: int, stride: int) -> nn.Module | None:
    if stride == 1 and in_ch == out_ch:
        return None
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), _bn(out_ch))


class ResNet(nn.Module):
    """`model(x)` -> logits; `model(x, labels)` -> (logits, cross-entropy loss)."""

    layer1: nn.Sequential  # set by name in __init__
    layer2: nn.Sequential
    layer3: nn.Sequential
    layer4: nn.Sequential

    def __init__(self, unit: str, units: tuple[int, ...], num_classes: int = 1000,
                 groups: int = 1, base_width: int = 64, name: str = "resnet") -> None:
        super().__init__()
        from popviz.models.common import HeadWithLoss

        block = BasicUnit if unit == "basic" else BottleneckUnit
        self.name = name
        self.units = tuple(units)
        self.num_classes = num_classes
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), _bn(64), nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        layer_names: dict[str, str] = {"stem": "b0"}
        in_ch = 64
        for g, count in enumerate(self.units, start=1):
            width = 64 * 2 ** (g - 1)
            layers = []
            for u in range(count):
                stride = 2 if (u == 0 and g > 1) else 1
                layers.append(block(in_ch, width, stride, groups, base_width))
                in_ch = width * block.expansion
                layer_names[f"layer{g}.{u}"] = f"b{g}/{u}"
                layer_names[f"layer{g}.{u}.relu_out"] = f"b{g}/{u}/relu"
            setattr(self, f"layer{g}", nn.Sequential(*layers))
        self.head = HeadWithLoss(in_ch, num_classes)
        layer_names["head"] = "fc"
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            # zero-init the last BN of each residual branch (Goyal et al. 2017): every unit
            # starts as the identity, so a few steps train stably at small batch sizes
            if isinstance(m, (BasicUnit, BottleneckUnit)):
                last_bn = m.bn3 if isinstance(m, BottleneckUnit) else m.bn2
                nn.init.zeros_(last_bn.weight)
        self.popviz_layer_names = layer_names
        # a split name is the first layer of the next stage; splitting before b0 would
        # leave the first stage empty
        self.popviz_split_names = [n for n in layer_names.values() if n != "b0"]

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None):
        x = self.stem(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        return self.head(x, labels)


def resnet(size: int, num_classes: int = 1000) -> ResNet:
    if size not in RESNET_SIZES:
        raise ValueError(f"unknown ResNet size {size}; valid sizes: "
                         f"{', '.join(map(str, RESNET_SIZES))}")
    unit, units = RESNET_SIZES[size]
    return ResNet(unit, units, num_classes, name=f"resnet{size}")


def resnext(size: int, num_classes: int = 1000) -> ResNet:
    """ResNeXt-{50,101} 32x4d: cardinality 32, 4 channels per group in the first group."""
    if size not in RESNEXT_SIZES:
        raise ValueError(f"unknown ResNeXt size {size}; valid sizes: "
                         f"{', '.join(map(str, RESNEXT_SIZES))}")
    return ResNet("bottleneck", RESNEXT_SIZES[size], num_classes, groups=32, base_width=4,
                  name=f"resnext{size}")
