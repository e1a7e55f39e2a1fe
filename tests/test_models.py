"""Reference models: build, run forward + backward at tiny sizes, expose ordered split names."""

from __future__ import annotations

import pytest
import torch

import popviz.models as models
from popviz.models.efficientnet import SIZES, round_filters, round_repeats
from popviz.models.resnet import RESNET_SIZES, RESNEXT_SIZES

# every model and size, at a tiny input
CASES = [("tutorial", None, 28)] + [("resnet", s, 32) for s in RESNET_SIZES] + \
    [("resnext", s, 32) for s in RESNEXT_SIZES] + [("efficientnet", s, 32) for s in SIZES]


def _forward_backward(model: torch.nn.Module, channels: int, size: int, classes: int) -> None:
    x = torch.randn(2, channels, size, size)
    y = torch.randint(0, classes, (2,))
    logits, loss = model(x, y)
    assert logits.shape == (2, classes)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert all(torch.isfinite(g).all() for g in grads)
    model.eval()
    with torch.no_grad():
        assert model(x).shape == (2, classes)


@pytest.mark.parametrize(("name", "size", "image"), CASES)
def test_builds_and_trains_at_tiny_size(name: str, size: int | None, image: int) -> None:
    model = models.build(name, size, num_classes=5, image_size=image)
    _forward_backward(model, models.input_channels(name), image, 5)


@pytest.mark.parametrize(("name", "size"), [("resnet", 18), ("resnet", 50), ("resnext", 101),
                                            ("efficientnet", 4), ("tutorial", None)])
def test_split_names_name_modules_in_forward_order(name: str, size: int | None) -> None:
    model = models.build(name, size, num_classes=3)
    paths = [p for p, _ in model.named_modules()]
    layer_names = model.popviz_layer_names
    # every declared prefix is a real module, in forward (registration) order
    assert all(prefix in paths for prefix in layer_names)
    order = [paths.index(prefix) for prefix in layer_names]
    assert order == sorted(order)
    splits = model.popviz_split_names
    assert len(set(splits)) == len(splits)
    assert set(splits) <= set(layer_names.values())
    forward_layers = list(dict.fromkeys(layer_names.values()))
    positions = [forward_layers.index(s) for s in splits]
    assert positions == sorted(positions)
    # the first layer cannot start a second stage
    assert forward_layers[0] not in splits


@pytest.mark.parametrize(("size", "units"), [(s, u) for s, (_, u) in RESNET_SIZES.items()])
def test_resnet_units_per_group(size: int, units: tuple[int, ...]) -> None:
    model = models.build("resnet", size, num_classes=2)
    for g, count in enumerate(units, start=1):
        assert len(getattr(model, f"layer{g}")) == count
        names = [n for n in model.popviz_split_names if n.startswith(f"b{g}/")]
        assert names == [x for u in range(count) for x in (f"b{g}/{u}", f"b{g}/{u}/relu")]


def test_resnet50_has_3_4_6_3_units_and_published_splits() -> None:
    model = models.build("resnet", 50)
    assert tuple(len(getattr(model, f"layer{g}")) for g in range(1, 5)) == (3, 4, 6, 3)
    for split in ("b1/2/relu", "b2/3/relu", "b3/3/relu", "b1/0/relu", "b3/0/relu"):
        assert split in model.popviz_split_names
    assert model.popviz_layer_names["layer1.2.relu_out"] == "b1/2/relu"
    assert model.popviz_layer_names["layer1.2"] == "b1/2"
    # each unit's final ReLU is its own module, distinct from the inner one
    unit = model.layer1[2]
    assert unit.relu_out is not unit.relu


def test_parameter_counts_match_published() -> None:
    # He et al. / Xie et al. / Tan & Le: 25.6 M, 44.2 M, 5.3 M (1000 classes)
    counts = {(n, s): sum(p.numel() for p in models.build(n, s).parameters())
              for n, s in (("resnet", 50), ("resnext", 101), ("efficientnet", 0))}
    assert abs(counts[("resnet", 50)] - 25.56e6) < 0.05e6
    assert abs(counts[("resnext", 101)] - 44.18e6) < 0.05e6
    assert abs(counts[("efficientnet", 0)] - 5.29e6) < 0.05e6


def test_resnext_uses_grouped_convs_and_efficientnet_depthwise() -> None:
    rx = models.build("resnext", 50, num_classes=2)
    assert rx.layer1[0].conv2.groups == 32
    assert rx.layer1[0].conv2.in_channels == 128  # 32 groups x 4 channels
    ef = models.build("efficientnet", 0, num_classes=2)
    conv = ef.blocks[1].depthwise[0]
    assert conv.groups == conv.in_channels == conv.out_channels


def test_efficientnet_g16_variant_groups_16_channels_and_expands_4x() -> None:
    g16 = models.build("efficientnet", 4, num_classes=2,
                       variant={"group_dim": 16, "expand_ratio": 4})
    conv = g16.blocks[2].depthwise[0]  # block2a (B4 repeats block1 twice)
    assert conv.in_channels // conv.groups == 16
    assert conv.in_channels == 4 * g16.blocks[2].expand[0].in_channels
    assert g16.blocks[0].depthwise[0].in_channels == 48  # block1a keeps expand ratio 1
    assert "block4a" in g16.popviz_split_names  # the published 2-stage split
    with pytest.raises(ValueError, match="no variant group_dim"):
        models.build("resnet", 50, variant={"group_dim": 16})


def test_the_group_norm_variant_normalises_as_graphcores_tensorflow_cnns() -> None:
    import torch
    from torch import nn

    rx = models.build("resnext", 50, num_classes=2, variant={"group_norm": 32})
    norms = [m for m in rx.modules() if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm))]
    assert norms and all(isinstance(m, nn.GroupNorm) for m in norms)
    assert {m.num_groups for m in norms} == {32}
    # the last norm of each residual branch keeps its zero gamma (every unit the identity)
    assert float(rx.layer1[0].bn3.weight.detach().abs().sum()) == 0.0
    # EfficientNet's 4 groups (its configurations' `groups: 4`); 48 channels split 4 ways
    ef = models.build("efficientnet", 0, num_classes=2, variant={"group_norm": 4})
    assert {m.num_groups for m in ef.modules() if isinstance(m, nn.GroupNorm)} == {4}
    # a model of it trains: the step runs and the loss is finite
    _logits, loss = rx(torch.randn(2, 3, 32, 32), torch.tensor([0, 1]))
    loss.backward()
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match="positive number of groups"):
        models.build("resnet", 18, variant={"group_norm": 0})
    with pytest.raises(ValueError, match="no variant group_norm"):
        models.build("tutorial", variant={"group_norm": 4})


def test_efficientnet_scaling_and_block_names() -> None:
    b4 = models.build("efficientnet", 4, num_classes=2)
    width, depth, _ = SIZES[4]
    assert round_repeats(2, depth) == 4
    assert b4.stem[0].out_channels == round_filters(32, width) == 48
    # the published B4 pipeline splits exist
    for split in ("block2c", "block4c", "block6a"):
        assert split in b4.popviz_split_names
    b0 = models.build("efficientnet", 0, num_classes=2)
    assert b0.popviz_split_names[:3] == ["block1a", "block2a", "block2b"]
    assert b0.popviz_split_names[-1] == "block7a"
    assert len(b4.blocks) > len(b0.blocks)


def test_unknown_model_and_size_raise_value_error() -> None:
    with pytest.raises(ValueError, match="valid models"):
        models.build("vgg", 16)
    with pytest.raises(ValueError, match=r"valid sizes: 18, 34, 50, 101, 152"):
        models.build("resnet", 51)
    with pytest.raises(ValueError, match="valid sizes"):
        models.build("resnext", 152)
    assert set(RESNEXT_SIZES) == {50, 101}
    with pytest.raises(ValueError, match="valid sizes: 0, 1, 2, 3, 4"):
        models.build("efficientnet", 7)


def test_synthetic_data_is_deterministic_and_class_dependent() -> None:
    a = models.SyntheticImages(4, 3, 8, seed=1)
    b = models.SyntheticImages(4, 3, 8, seed=1)
    xa, ya = a.batch(16)
    xb, yb = b.batch(16)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    held_out = models.SyntheticImages(4, 3, 8, seed=1, stream=2)
    assert torch.equal(held_out.templates, a.templates)
    assert not torch.equal(held_out.batch(16)[0], xa)
    # a sample is nearer its own class template than any other
    dist = ((xa[:, None] - a.templates[None]) ** 2).flatten(2).sum(-1)
    assert torch.equal(dist.argmin(1), ya)


def test_recorded_ops_carry_the_cnn_layer_names() -> None:
    from popviz.recorder import record_program

    model = models.build("resnet", 18, num_classes=4)
    x, y = models.SyntheticImages(4, 3, 32).batch(2)
    program = record_program(lambda: model(x, y)[1].backward(), model=model)
    fwd = program.ops[program.ops["phase"] == "forward"]
    by_module = fwd.groupby("module")["layer"].first().to_dict()
    assert by_module["layer2.1.relu_out"] == "b2/1/relu"
    assert by_module["layer2.1.conv1"] == "b2/1"
    assert by_module["stem.0"] == "b0"
    # every layer the model declares is executed, in the declared order
    declared = list(dict.fromkeys(model.popviz_layer_names.values()))
    seen = [layer for layer in dict.fromkeys(fwd["layer"]) if layer in declared]
    assert seen == declared
    assert program.model["split_names"] == model.popviz_split_names
