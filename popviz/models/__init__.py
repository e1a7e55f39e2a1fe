"""Reference workloads for train.py: the PopTorch tutorial CNN, ResNet / ResNeXt and
EfficientNet, each exposing `popviz_layer_names` and `popviz_split_names` for the recorder.

    model = popviz.models.build("resnet", 50, num_classes=10)
    logits, loss = model(images, labels)
"""

from __future__ import annotations

from typing import Any

from torch import nn

from popviz.models.common import SyntheticImages, with_group_norm
from popviz.models.efficientnet import SIZES as EFFICIENTNET_SIZES
from popviz.models.efficientnet import EfficientNet
from popviz.models.mnist import TutorialNet
from popviz.models.resnet import RESNET_SIZES, RESNEXT_SIZES, ResNet, resnet, resnext

# model name -> valid sizes (the tutorial CNN has one size, None)
MODEL_SIZES: dict[str, tuple[Any, ...]] = {
    "tutorial": (None,),
    "resnet": tuple(RESNET_SIZES),
    "resnext": tuple(RESNEXT_SIZES),
    "efficientnet": tuple(EFFICIENTNET_SIZES),
}
# default size of each model (the one Graphcore's benchmarks use)
DEFAULT_SIZES: dict[str, Any] = {"tutorial": None, "resnet": 50, "resnext": 101,
                                 "efficientnet": 0}


def check(name: str, size: Any = None) -> Any:
    """The validated size for `name` (its default if None); ValueError naming valid values."""
    if name not in MODEL_SIZES:
        raise ValueError(f"unknown model {name!r}; valid models: {', '.join(MODEL_SIZES)}")
    if size is None:
        return DEFAULT_SIZES[name]
    valid = MODEL_SIZES[name]
    if name == "tutorial" or size not in valid:
        shown = "none (the tutorial CNN has one size)" if name == "tutorial" else \
            ", ".join(map(str, valid))
        raise ValueError(f"unknown {name} size {size!r}; valid sizes: {shown}")
    return size


def build(name: str, size: Any = None, num_classes: int | None = None,
          image_size: int | None = None, variant: dict[str, Any] | None = None) -> nn.Module:
    """A freshly initialised reference model. `num_classes` defaults to 10 for the tutorial
    and 1000 (ImageNet) otherwise; `image_size` only matters for the tutorial CNN (the CNNs
    pool globally and take any input of at least 32x32). `variant`: `group_norm` (a
    number of groups: every batch norm a group norm, as Graphcore's TensorFlow CNNs train
    by default) for the CNNs, and EfficientNet's `group_dim` / `expand_ratio` (Graphcore's
    G16 variant)."""
    size = check(name, size)
    variant = dict(variant or {})
    allowed = () if name == "tutorial" else ("group_norm", *(
        ("group_dim", "expand_ratio") if name == "efficientnet" else ()))
    unknown = sorted(set(variant) - set(allowed))
    if unknown:
        raise ValueError(f"model {name!r} has no variant {', '.join(unknown)} "
                         f"(valid: {', '.join(allowed) or 'none'})")
    groups = variant.pop("group_norm", None)
    if name == "tutorial":
        return TutorialNet(image_size or 28, num_classes or 10)
    classes = num_classes or 1000
    if name == "resnet":
        model: nn.Module = resnet(size, classes)
    elif name == "resnext":
        model = resnext(size, classes)
    else:
        model = EfficientNet(size, classes, **variant)
    return model if groups is None else with_group_norm(model, int(groups))


def native_resolution(name: str, size: Any = None) -> int:
    """The input height/width a model is published at (EfficientNet: 224 for B0 to 380)."""
    if name == "tutorial":
        return 28
    if name == "efficientnet":
        return EFFICIENTNET_SIZES[check(name, size)][2]
    return 224


def input_channels(name: str) -> int:
    return 1 if name == "tutorial" else 3


__all__ = ["DEFAULT_SIZES", "MODEL_SIZES", "EfficientNet", "ResNet", "SyntheticImages",
           "TutorialNet", "build", "check", "input_channels", "native_resolution"]
