"""Programs a GPU plan is checked with: full-size models' training steps recorded in plan
mode (fake tensors: nothing computed) with the optimiser PyTorch users run on CUDA (AdamW
or SGD with momentum, `foreach=True` as PyTorch picks on CUDA), cached per process.

    program = gpu_program("resnet", 50, batch=64)           # as the H100 fixture ran
    program = gpu_program("gpt2", "small", batch=8, sequence_length=1024)
    program = gpu_program("megatron-gpt", (32, 4096, 32, 8, 131200), 1,
                          sequence_length=8192)                 # Megatron CI's 7B
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from popviz.recorder.program import Program

MODELS = ("resnet", "gpt2", "megatron-gpt", "bert", "vit", "mlp", "pipe")


def _optimiser(params: Any, name: str) -> Any:
    import torch

    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True)
    raise ValueError(f"unknown optimiser {name!r}; valid: adamw, sgd")


@lru_cache(maxsize=16)
def gpu_program(model: str, size: Any, batch: int, optimiser: str = "adamw",
                sequence_length: int = 128, image: int = 224, dtype: str = "float32",
                attn: str = "eager", activation: str = "gelu_new", tied: bool = True
                ) -> Program:
    """One training step of `model` at `batch`, recorded in plan mode. `size`: ResNet depth
    (50), GPT-2 small / medium / tiny or a GPT-2 shape (layers, hidden, heads, vocabulary),
    a Megatron GPT's shape (layers, hidden, heads, query groups, vocabulary: megatron_gpt.py),
    BERT base, ViT base-16, or the MLP's width. `dtype` bfloat16 / float16: weights and
    float inputs in that dtype (pure half training). `attn`: GPT-2's attention, eager (the
    matmuls and softmax) or sdpa (PyTorch's fused scaled_dot_product_attention);
    `activation`: GPT-2's MLP activation, gelu_new (HF's) or gelu (Megatron-LM's); `tied`:
    GPT-2's output layer shares the word embedding (False: its own)."""
    import torch

    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; valid: {', '.join(MODELS)}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if (activation != "gelu_new" or not tied) and model != "gpt2":
        raise ValueError(f"activation and tied are GPT-2's; {model} has its own")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # weights and float inputs made in it
    try:
        return _record(model, size, batch, optimiser, sequence_length, image, attn, activation,
                       tied)
    finally:
        torch.set_default_dtype(default)


def _record(model: str, size: Any, batch: int, optimiser: str, sequence_length: int,
            image: int, attn: str = "eager", activation: str = "gelu_new", tied: bool = True
            ) -> Program:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from popviz.recorder import record_program

    with FakeTensorMode():
        torch.manual_seed(0)
        if model == "resnet":
            from popviz.models import build
            from popviz.models.training import train_step

            net = build("resnet", size)
            opt = _optimiser(net.parameters(), optimiser)
            x = torch.randn(batch, 3, image, image)
            y = torch.randint(0, 1000, (batch,))
            return record_program(train_step, net, opt, x, y, model=net, mode="plan",
                                  progress=False)
        from popviz.models.hf import loss_step

        if model == "gpt2":
            from popviz.models.gpt2 import build_gpt2, build_gpt2_shape

            if isinstance(size, tuple):
                layers, hidden, heads, vocab = (int(x) for x in size)
                net, inputs = build_gpt2_shape(layers, hidden, heads, vocab, batch,
                                               sequence_length=sequence_length, attn=attn,
                                               init_weights=False, activation=activation,
                                               tied=tied)
            else:
                net, inputs = build_gpt2(str(size), batch, sequence_length=sequence_length,
                                         attn=attn, init_weights=False,
                                         activation=activation)
        elif model == "megatron-gpt":
            from tooling.megatron_gpt import build_megatron_gpt

            layers, hidden, heads, groups, vocab = (int(x) for x in size)
            net, inputs = build_megatron_gpt(layers, hidden, heads, groups, vocab, batch,
                                             sequence_length=sequence_length)
        elif model in ("mlp", "pipe"):
            net, inputs = _mlp(int(size), batch, pipe=model == "pipe")
        else:
            from popviz.models.hf import build_transformer

            net, inputs = build_transformer(model, str(size), batch, init_weights=False,
                                            sequence_length=sequence_length)
        opt = _optimiser(net.parameters(), optimiser)
        return record_program(loss_step, net, opt, inputs, model=net, mode="plan",
                              progress=False)


def _mlp(width: int, batch: int, pipe: bool = False) -> tuple[Any, dict[str, Any]]:
    """A small MLP (4 Linear + ReLU blocks and a classifier): the tiny model tests plan in
    a second. `pipe`: the pipelining fixture's model instead, two stages `stage0` and
    `stage1` of 4 Linear layers and a ReLU each, mean squared error."""
    import torch
    from torch import nn

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU())
                                        for _ in range(4)])
            self.head = nn.Linear(width, 10)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(self.head(self.body(x)), y)

    class Pipe(nn.Module):
        stage0: nn.Sequential  # added by name below
        stage1: nn.Sequential

        def __init__(self) -> None:
            super().__init__()
            for i in range(2):
                self.add_module(f"stage{i}", nn.Sequential(
                    *[nn.Linear(width, width) for _ in range(4)], nn.ReLU()))

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return ((self.stage1(self.stage0(x)) - y) ** 2).mean()

    if pipe:
        return Pipe(), {"x": torch.randn(batch, width), "y": torch.randn(batch, width)}
    return Mlp(), {"x": torch.randn(batch, width), "y": torch.randint(0, 10, (batch,))}
