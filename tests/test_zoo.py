"""A zoo of models popviz did not write, each called the way its users call it.

HuggingFace models come from tiny configs (random weights, no downloads: HF_HUB_OFFLINE=1);
the own models cover custom autograd Functions, in-place ops, checkpointing, autocast,
channels_last, clipping, torch.compile and two micro-batches in one step. For each: record
and plan work, recording changes no number, matmul / conv FLOPs equal
torch.utils.flop_counter (and fused attention the eager maths within 1%), the micro-batch
is right, and every op has a module, a stage and a phase.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

import popviz
from popviz.compiler import compile
from popviz.options import Options
from popviz.recorder import record_program
from popviz.recorder.program import PHASES
from tests.custom_function import Square

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

Step = Callable[[], torch.Tensor]


@dataclass
class Built:
    model: nn.Module
    step: Step  # zero grads, forward (keyword arguments), backward, optimiser step -> loss
    batch: int


# ------------------------------------------------------------------ HuggingFace, tiny
def _hf_step(model: nn.Module, batch: dict[str, torch.Tensor], clip: bool = False) -> Step:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    return step


def _ids(vocab: int, batch: int = 2, length: int = 8) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length))


def gpt2(attn: str) -> Built:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64,
                                  n_positions=16, attn_implementation=attn)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = _ids(64, 3)
    return Built(model, _hf_step(model, {"input_ids": ids, "labels": ids}), 3)


def bert(attn: str) -> Built:
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                  intermediate_size=64, vocab_size=64,
                                  max_position_embeddings=16, attn_implementation=attn)
    model = transformers.BertForMaskedLM(cfg)
    ids = _ids(64)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    return Built(model, _hf_step(model, batch), 2)


def llama(attn: str) -> Built:
    # grouped-query attention (2 key/value heads for 4 query heads), RoPE, SwiGLU
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=48, vocab_size=64,
                                   max_position_embeddings=16, attn_implementation=attn)
    model = transformers.LlamaForCausalLM(cfg)
    ids = _ids(64)
    return Built(model, _hf_step(model, {"input_ids": ids, "labels": ids}, clip=True), 2)


def vit(attn: str) -> Built:
    cfg = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=64, num_labels=5, attn_implementation=attn)
    model = transformers.ViTForImageClassification(cfg)
    batch = {"pixel_values": torch.randn(2, 3, 16, 16), "labels": torch.tensor([1, 4])}
    return Built(model, _hf_step(model, batch), 2)


def t5(attn: str) -> Built:
    cfg = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                num_decoder_layers=2, num_heads=4, decoder_start_token_id=0,
                                attn_implementation=attn)
    model = transformers.T5ForConditionalGeneration(cfg)
    batch = {"input_ids": _ids(64), "labels": _ids(64, length=6)}
    return Built(model, _hf_step(model, batch), 2)


# ------------------------------------------------------------------ own models


class Mlp(nn.Module):
    """Linear layers with a custom Function, in-place ops and optional checkpointing."""

    def __init__(self, checkpointing: str = "") -> None:
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16))
                                    for _ in range(2))
        self.out = nn.Linear(16, 4)
        self.checkpointing = checkpointing

    def block(self, i: int, h: torch.Tensor) -> torch.Tensor:
        y = self.blocks[i](h)
        y = Square.apply(y)
        y.mul_(0.5).add_(h)  # in place
        return torch.relu_(y)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for i in range(len(self.blocks)):
            if self.checkpointing:
                h = checkpoint(self.block, i, h, use_reentrant=self.checkpointing == "reentrant")
            else:
                h = self.block(i, h)
        return F.cross_entropy(self.out(h), labels)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                      nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3, stride=2))
        self.head = nn.Linear(8, 5)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.features(images).mean((2, 3))), labels)


def _own(model: nn.Module, batch: dict[str, torch.Tensor], *, autocast: bool = False,
         clip: bool = False, micro_batches: int = 1, compiled: bool = False) -> Built:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    call = torch.compile(model, backend="aot_eager") if compiled else model
    size = len(next(iter(batch.values())))
    parts = [{k: v.chunk(micro_batches)[i] for k, v in batch.items()}
             for i in range(micro_batches)]

    def step() -> torch.Tensor:
        opt.zero_grad()
        total = torch.zeros(())
        for part in parts:  # gradient accumulation over micro-batches
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = call(**part) / micro_batches
            loss.backward()
            total = total + loss.detach()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        return total

    # the step's micro-batch is every sample its forward and backward passes see
    return Built(model, step, size)


class TwoLayer(nn.Module):
    """Small enough that torch.compile traces it quickly."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.fc2(F.gelu(self.fc1(x))), labels)


def _mlp_batch() -> dict[str, torch.Tensor]:
    return {"x": torch.randn(4, 6), "labels": torch.tensor([0, 3, 1, 2])}


def _conv_batch() -> dict[str, torch.Tensor]:
    return {"images": torch.randn(4, 3, 10, 10), "labels": torch.tensor([0, 4, 1, 2])}


def mlp(checkpointing: str = "", **kw: bool | int) -> Built:
    return _own(Mlp(checkpointing), _mlp_batch(), **kw)


def convnet(channels_last: bool = False, **kw: bool | int) -> Built:
    model, batch = ConvNet(), _conv_batch()
    if channels_last and torch._guards.detect_fake_mode() is not None:
        # popviz.plan: torch cannot swap a fake parameter (module.to fails); set .data
        for p in model.parameters():
            if p.dim() == 4:
                p.data = p.data.contiguous(memory_format=torch.channels_last)
    elif channels_last:
        model = model.to(memory_format=torch.channels_last)
        batch["images"] = batch["images"].contiguous(memory_format=torch.channels_last)
    return _own(model, batch, **kw)


# name -> (builder, attention implementation or "")
ZOO: dict[str, Callable[[], Built]] = {
    "gpt2": lambda: gpt2("eager"), "gpt2-sdpa": lambda: gpt2("sdpa"),
    "bert": lambda: bert("eager"), "bert-sdpa": lambda: bert("sdpa"),
    "llama": lambda: llama("eager"), "llama-sdpa": lambda: llama("sdpa"),
    "vit": lambda: vit("eager"), "vit-sdpa": lambda: vit("sdpa"),
    "t5": lambda: t5("eager"), "t5-sdpa": lambda: t5("sdpa"),
    "custom-function-inplace": mlp,
    "checkpoint-reentrant": lambda: mlp("reentrant"),
    "checkpoint-nonreentrant": lambda: mlp("nonreentrant"),
    "bf16-autocast": lambda: mlp(autocast=True),
    "channels-last": lambda: convnet(channels_last=True),
    "gradient-clipping": lambda: convnet(clip=True),
    "torch-compile": lambda: _own(TwoLayer(), _mlp_batch(), compiled=True),
    "two-micro-batches": lambda: convnet(micro_batches=2),
}
SDPA = [name for name in ZOO if name.endswith("-sdpa")]


def _build(name: str) -> Built:
    torch.manual_seed(0)
    return ZOO[name]()


def _run(built: Built, recorded: bool, mode: str = "measured"):
    torch.manual_seed(1)  # dropout draws the same masks with and without recording
    program = None
    if recorded:
        box: list[torch.Tensor] = []
        program = record_program(lambda: box.append(built.step()), model=built.model,
                                 mode=mode)
        loss = box[0]
    else:
        loss = built.step()
    return loss, program


def _matmul_flops(ops) -> int:
    return int(ops.loc[ops.op_class.isin(["matmul", "conv"]), "flops"].sum())


def _flop_counter(name: str) -> int:
    built = _build(name)
    torch.manual_seed(1)
    with FlopCounterMode(display=False) as counter:
        built.step()
    return counter.get_total_flops()


@pytest.fixture(scope="module")
def recorded() -> dict[str, tuple[Built, object]]:
    return {}


def _recorded(cache: dict, name: str):
    if name not in cache:
        built = _build(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.compile on global module hooks
            cache[name] = (built, *_run(built, True))
    return cache[name]


@pytest.mark.parametrize("name", list(ZOO))
def test_recording_changes_no_number(name: str, recorded: dict) -> None:
    plain = _build(name)
    loss, _ = _run(plain, False)
    built, rec_loss, _ = _recorded(recorded, name)
    assert torch.equal(loss, rec_loss)
    for (pname, a), b in zip(plain.model.named_parameters(), built.model.parameters(),
                             strict=True):
        assert torch.equal(a, b), pname
        assert (a.grad is None) == (b.grad is None) and \
            (a.grad is None or torch.equal(a.grad, b.grad)), pname


@pytest.mark.parametrize("name", list(ZOO))
def test_program_facts(name: str, recorded: dict) -> None:
    built, _, program = _recorded(recorded, name)
    ops = program.ops
    assert program.model["batch_size"] == built.batch
    assert set(ops.phase) <= set(PHASES)
    expected = {"forward", "backward", "optimiser"}
    assert expected <= set(ops.phase)
    assert ("recompute" in set(ops.phase)) == name.startswith("checkpoint")
    # host copies come before the model; an optimiser op over every parameter (foreach,
    # the total gradient norm of clipping) has no one module: the compiler spreads it
    total_norm = {"aten.stack.default", "aten.linalg_vector_norm.default",
                  "aten.reciprocal.default", "aten.mul.Tensor", "aten.clamp.default",
                  "aten.add.Tensor", "aten.div.Tensor"}
    shared = ops.op.str.startswith("aten._foreach_") | \
        (ops.op.isin(total_norm) & (ops.phase == "optimiser") & ("clip" in name or
                                                                 name.startswith("llama")))
    owned = ops[(ops.phase != "host_io") & ~shared]
    assert (owned.module != "").all(), owned.loc[owned.module == "", ["op", "phase"]]
    report = compile(program, Options())
    assert (report.tables["ops"]["stage"] >= 0).all()


@pytest.mark.parametrize("name", [n for n in ZOO if n not in SDPA])
def test_matmul_flops_equal_flop_counter(name: str, recorded: dict) -> None:
    _, _, program = _recorded(recorded, name)
    assert _matmul_flops(program.ops) == _flop_counter(name)


@pytest.mark.parametrize("name", SDPA)
def test_sdpa_attention_flops_equal_the_eager_maths(name: str, recorded: dict) -> None:
    _, _, program = _recorded(recorded, name)
    eager = _flop_counter(name.removesuffix("-sdpa"))
    assert _matmul_flops(program.ops) == pytest.approx(eager, rel=0.01)


@pytest.mark.parametrize("name", list(ZOO))
def test_plan_mode_records_the_same_step(name: str, recorded: dict) -> None:
    _, _, program = _recorded(recorded, name)
    with popviz.plan(Options(), profile_dir=None, progress=False) as session, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        built = ZOO[name]()
        with session.step(model=built.model):
            built.step()
    planned = session.program
    assert planned.mode == "plan" and (planned.ops.host_ns == 0).all()
    assert planned.model["batch_size"] == program.model["batch_size"]
    # the same maths; op counts may differ where the step branches on data (.item())
    assert _matmul_flops(planned.ops) == _matmul_flops(program.ops)
    assert set(planned.ops.phase) == set(program.ops.phase)
