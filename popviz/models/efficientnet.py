"""EfficientNet-B0..B4 (Tan & Le 2019), written here: MBConv blocks with depthwise convs,
squeeze-excite and swish, scaled by width and depth multipliers. `group_dim` and
`expand_ratio` give Graphcore's G16 variant (grouped 16-channel convs instead of depthwise,
expand ratio 4: `group_dim: 16, expand_ratio: 4` in their CNN application's configs.yml).

Block names follow Keras / Graphcore's CNN application (`block1a`, `block2a`, `block2b`,
..., `block7a`); they are the split points (`--pipeline-split block2c block4c block6a`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

# (kernel, repeats, in, out, expand ratio, stride) per stage of B0; SE ratio 0.25
BASE_STAGES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (3, 1, 32, 16, 1, 1),
    (3, 2, 16, 24, 6, 2),
    (5, 2, 24, 40, 6, 2),
    (3, 3, 40, 80, 6, 2),
    (5, 3, 80, 112, 6, 1),
    (5, 4, 112, 192, 6, 2),
    (3, 1, 192, 320, 6, 1),
)
# size -> (width multiplier, depth multiplier, native resolution)
SIZES: dict[int, tuple[float, float, int]] = {
    0: (1.0, 1.0, 224),
    1: (1.0, 1.1, 240),
    2: (1.1, 1.2, 260),
    3: (1.2, 1.4, 300),
    4: (1.4, 1.8, 380),
}


def _bn(channels: int) -> nn.BatchNorm2d:
    # the reference implementation's epsilon (1e-3, not torch's 1e-5): it also bounds the
    # gradient through BN where tiny test inputs leave one pixel per channel
    return nn.BatchNorm2d(channels, eps=1e-3)


def round_filters(filters: int, width: float, divisor: int = 8) -> int:
    """Scale channels by `width`, to a multiple of 8, never below 90% (as in the paper's code)."""
    scaled = filters * width
    new = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    if new < 0.9 * scaled:
        new += divisor
    return int(new)


def round_repeats(repeats: int, depth: float) -> int:
    return math.ceil(depth * repeats)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.act = nn.SiLU()
        self.expand = nn.Conv2d(squeezed, channels, 1)
        self.gate = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.expand(self.act(self.reduce(self.pool(x)))))


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand, depthwise kxk, squeeze-excite, 1x1 project."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int, expand: int,
                 group_dim: int = 1) -> None:
        super().__init__()
        mid = in_ch * expand
        self.expand = None
        if expand != 1:
            self.expand = nn.Sequential(nn.Conv2d(in_ch, mid, 1, bias=False),
                                        _bn(mid), nn.SiLU())
        self.depthwise = nn.Sequential(
            nn.Conv2d(mid, mid, kernel, stride, kernel // 2, groups=mid // group_dim,
                      bias=False),
            _bn(mid), nn.SiLU())
        self.se = SqueezeExcite(mid, max(1, int(in_ch * 0.25)))
        self.project = nn.Sequential(nn.Conv2d(mid, out_ch, 1, bias=False),
                                     _bn(out_ch))
        self.residual = stride == 1 and in_ch == out_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x if self.expand is None else self.expand(x)
        y = self.project(self.se(self.depthwise(y)))
        return x + y if self.residual else y


class EfficientNet(nn.Module):
    """`model(x)` -> logits; `model(x, labels)` -> (logits, cross-entropy loss)."""

    def __init__(self, size: int = 0, num_classes: int = 1000, group_dim: int = 1,
                 expand_ratio: int | None = None) -> None:
        super().__init__()
        from popviz.models.common import HeadWithLoss

        if size not in SIZES:
            raise ValueError(f"unknown EfficientNet size {size}; valid sizes: "
                             f"{', '.join(map(str, SIZES))}")
        width, depth, self.native_resolution = SIZES[size]
        self.name = f"efficientnet-b{size}" + (f"-g{group_dim}" if group_dim > 1 else "")
        self.num_classes = num_classes
        stem_ch = round_filters(32, width)
        self.stem = nn.Sequential(nn.Conv2d(3, stem_ch, 3, 2, 1, bias=False),
                                  _bn(stem_ch), nn.SiLU())
        layer_names: dict[str, str] = {"stem": "stem"}
        blocks: list[nn.Module] = []
        in_ch = stem_ch
        for s, (kernel, repeats, _, out, expand, stride) in enumerate(BASE_STAGES, start=1):
            out_ch = round_filters(out, width)
            for r in range(round_repeats(repeats, depth)):
                layer_names[f"blocks.{len(blocks)}"] = f"block{s}{chr(ord('a') + r)}"
                ratio = expand if expand == 1 or expand_ratio is None else expand_ratio
                blocks.append(MBConv(in_ch, out_ch, kernel, stride if r == 0 else 1, ratio,
                                     group_dim))
                in_ch = out_ch
        self.blocks = nn.Sequential(*blocks)
        top_ch = round_filters(1280, width)
        self.top = nn.Sequential(nn.Conv2d(in_ch, top_ch, 1, bias=False),
                                 _bn(top_ch), nn.SiLU())
        self.head = HeadWithLoss(top_ch, num_classes)
        layer_names["top"] = "top"
        layer_names["head"] = "top"
        self.popviz_layer_names = layer_names
        self.popviz_split_names = [n for n in layer_names.values() if n.startswith("block")]

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None):
        return self.head(self.top(self.blocks(self.stem(x))), labels)


def efficientnet(size: int, num_classes: int = 1000, group_dim: int = 1,
                 expand_ratio: int | None = None) -> EfficientNet:
    return EfficientNet(size, num_classes, group_dim, expand_ratio)
