"""GPU precision recipes (popviz/compiler/gpu_recipe.py): bytes per parameter as Megatron-LM
and torch.autocast hold them (docs/notes/gpu-plans-v2-research.md §1), half activations,
GEMMs at the half-precision tensor-core rate, the step's transient, and as-recorded
unchanged as the default."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from popviz.compiler import compile
from popviz.compiler.gpu_alloc import round_size
from popviz.compiler.gpu_lowering import cuda_dropout
from popviz.compiler.gpu_recipe import RECIPES, apply_recipe, recipe_named
from popviz.options import Options
from popviz.target.gpu import A100_80GB
from tooling.gpu_programs import gpu_program

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]
STATE = ("parameter", "gradient", "optimiser_state")


@pytest.fixture(scope="module")
def gpt() -> Any:
    """A tiny GPT-2 (2 layers, hidden 64, tied embedding) recorded in fp32 with AdamW."""
    return gpu_program("gpt2", "tiny", 2, "adamw", sequence_length=64)


def _state_bytes(program: Any) -> int:
    t = program.tensors
    scalar = t["shape"].astype(str).isin(["[]", "()", ""])
    return int(t[t["category"].isin(STATE) & ~scalar]["bytes"].sum())


def test_bytes_per_param_as_the_notes_give_them() -> None:
    # Megatron dist_optimizer.md / theoretical_memory_usage.py; ZB's fp16 runs hold 16
    assert recipe_named("megatron-fp16").bytes_per_param() == 16
    assert recipe_named("megatron-fp16").step_bytes_per_param() == 4
    assert recipe_named("megatron-bf16").bytes_per_param() == 18
    assert recipe_named("megatron-bf16-distopt").bytes_per_param(2) == 6 + 12 / 2
    assert recipe_named("megatron-fp16-distopt").bytes_per_param(8) == 4 + 12 / 8
    assert recipe_named("megatron-fp16-distopt").step_bytes_per_param(8) == 4 / 8
    assert recipe_named("amp").bytes_per_param() == 16


@pytest.mark.parametrize("name", [n for n in RECIPES if n != "as-recorded"])
def test_state_is_params_times_bytes_per_param_exactly(gpt: Any, name: str) -> None:
    params = int(gpt.model["parameters"])
    assert _state_bytes(gpt) == 16 * params  # the fp32 recording: 4 + 4 + 8
    replicas = 4
    held = apply_recipe(gpt, recipe_named(name), replicas)
    per = recipe_named(name).bytes_per_param(replicas)
    # sharded state rounds up per tensor (ceil of numel * 4 / d): within a byte per tensor
    assert _state_bytes(held) == pytest.approx(params * per, abs=len(held.tensors))
    if not recipe_named(name).sharded:
        assert _state_bytes(held) == params * per
    assert held.model["gpu_precision"] == name
    assert apply_recipe(held, recipe_named(name), replicas) is held  # tune re-plans: once
    with pytest.raises(ValueError, match=f"already held as GPU precision '{name}'"):
        apply_recipe(held, recipe_named("as-recorded"))


def test_activations_halve_under_half_recipes(gpt: Any) -> None:
    t = gpt.tensors
    acts = t[t["category"].isin(["activation", "temporary"]) & (t["dtype"] == "float32")]
    made = set(gpt.ops.query("phase in ['forward', 'backward']")["op_id"])
    fwd_bwd = acts[acts["producer"].isin(made)]
    # dropout masks (bernoulli_ into an empty_like): bool on CUDA, 1 B of the 4 recorded
    drawn = gpt.ops[gpt.ops["op"].str.startswith("aten.bernoulli_")]["inputs"].astype(int)
    masks = fwd_bwd[fwd_bwd["tensor_id"].isin(drawn)]
    rest = fwd_bwd[~fwd_bwd["tensor_id"].isin(drawn)]
    assert len(masks) == 7  # embedding, then per layer attention, attn and MLP residuals
    held = apply_recipe(gpt, recipe_named("megatron-bf16")).tensors.set_index("tensor_id")
    assert int(held.loc[rest["tensor_id"], "bytes"].sum()) * 2 == int(rest["bytes"].sum())
    assert set(held.loc[rest["tensor_id"], "dtype"]) == {"bfloat16"}
    assert int(held.loc[masks["tensor_id"], "bytes"].sum()) * 2 == int(masks["bytes"].sum())
    # on CUDA every recipe holds them as native_dropout does: bool, 1 B of the 4 recorded
    for name in ("as-recorded", "megatron-bf16"):
        lowered = cuda_dropout(apply_recipe(gpt, recipe_named(name)))
        held = lowered.tensors.set_index("tensor_id")
        assert int(held.loc[masks["tensor_id"], "bytes"].sum()) * 4 == \
            int(masks["bytes"].sum())
        assert set(held.loc[masks["tensor_id"], "dtype"]) == {"bool"}
        assert int(held.loc[rest["tensor_id"], "bytes"].sum()) in (
            int(rest["bytes"].sum()), int(rest["bytes"].sum()) // 2)
    held = apply_recipe(gpt, recipe_named("megatron-bf16")).tensors.set_index("tensor_id")
    # autocast keeps layer norm (and softmax) outputs in fp32
    ln = set(gpt.ops[gpt.ops["op"].str.startswith("aten.native_layer_norm.")]["op_id"])
    ln_out = fwd_bwd[fwd_bwd["producer"].isin(ln)]
    amp = apply_recipe(gpt, recipe_named("amp")).tensors.set_index("tensor_id")
    assert len(ln_out) and set(amp.loc[ln_out["tensor_id"], "dtype"]) == {"float32"}
    assert int(amp.loc[ln_out["tensor_id"], "bytes"].sum()) == int(ln_out["bytes"].sum())


def test_gemms_run_at_the_half_rate(gpt: Any) -> None:
    """Each GEMM at most at its kernel family's rate (fp32 on the CUDA cores, half on the
    tensor cores, a half GEMM of an odd size on the align1 kernels), the largest close
    to it (the wave model's last wave and fixed time are a small part of it)."""
    cost = A100_80GB.cost
    fp32, half = (compile(gpt, Options(target="a100", gpu_precision=n))
                  for n in ("as-recorded", "megatron-fp16"))
    for r, peak, slow in ((fp32, A100_80GB.fp32_flops * cost.fp32_matmul_efficiency,
                           A100_80GB.fp32_flops * cost.fp32_matmul_efficiency),
                          (half, A100_80GB.bf16_flops * cost.matmul_efficiency,
                           A100_80GB.bf16_flops * cost.misaligned_output_matmul_efficiency)):
        mm = r.tables["ops"].query("op_class == 'matmul' and phase == 'forward' and flops > 0")
        # the LM head's vocabulary (50,257) is no multiple of 8: a half GEMM's align1 rate,
        # its forward's output rows of that size
        vocab = mm["shapes"].astype(str).str.contains("50257").to_numpy()
        assert vocab.sum() == 1
        at_rate = mm["flops"].to_numpy(np.float64) / np.where(vocab, slow, peak) * 1e9
        compute = mm["compute_ns"].to_numpy()
        assert (compute >= at_rate).all()
        big = int(np.argmax(mm["flops"].to_numpy()))  # the LM head
        assert compute[big] <= 1.3 * at_rate[big]
    assert half.summary["step_ms"] < fp32.summary["step_ms"]


def test_persistent_state_and_the_step_transient(gpt: Any) -> None:
    r = compile(gpt, Options(target="a100", gpu_precision="megatron-fp16"))
    held = apply_recipe(gpt, recipe_named("megatron-fp16"))
    t = held.tensors
    scalar = t["shape"].astype(str).isin(["[]", "()", ""])
    kept = t[t["category"].isin(STATE) & ~scalar]  # the grad buffer is there from the start
    live = r.tables["liveness"]
    assert int(live["always_live_bytes"].iloc[0]) == sum(round_size(int(b))
                                                         for b in kept["bytes"])
    params = int(gpt.model["parameters"])
    step = r.tables["variables"].query("name.str.startswith('optimiser step')")
    assert list(step["bytes"]) == [round_size(4 * params)]
    wu = live[live["phase"] == "optimiser"]
    assert int(wu["not_always_live_bytes"].min()) >= round_size(4 * params)
    bf16 = compile(gpt, Options(target="a100", gpu_precision="megatron-bf16"))
    assert bf16.tables["variables"].query("name.str.startswith('optimiser step')").empty


def test_megatron_adam_is_fused_in_place(gpt: Any) -> None:
    wu = set(gpt.ops.query("phase == 'optimiser'")["op_id"])

    def temporaries(program: Any) -> int:
        t = program.tensors
        return int(t[(t["category"] == "temporary") & t["producer"].isin(wu)]["bytes"].sum())

    assert temporaries(gpt) > 0  # torch's foreach AdamW: sqrt(v) and friends
    assert temporaries(apply_recipe(gpt, recipe_named("amp"))) == temporaries(gpt)
    for name in ("megatron-fp16", "megatron-bf16-distopt"):
        assert temporaries(apply_recipe(gpt, recipe_named(name))) == 0


def test_amp_holds_a_half_weight_copy_per_microbatch_in_flight(gpt: Any) -> None:
    held = apply_recipe(gpt, recipe_named("amp"))
    casts = held.tensors[held.tensors["name"].str.endswith(".bfloat16_cast")]
    # the LM head reads the token embedding's weight (HF ties them): one cast of it
    gemm_weights = {"lm.transformer.wte.weight"} | {
        f"lm.transformer.h.{i}.{m}.weight" for i in (0, 1)
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
    names = {n.removesuffix(".bfloat16_cast") for n in casts["name"]}
    assert gemm_weights <= names and "lm.transformer.wpe.weight" not in names
    plain, amp = (compile(gpt, Options(target="a100", gpu_precision=n,
                                       splits=["lm.transformer.h.1"], schedule="GPipe",
                                       gradient_accumulation=3)) for n in ("megatron-fp16",
                                                                          "amp"))
    # GPipe holds all 3 micro-batches on stage 0: 3 casts of its GEMM weights stashed
    stash = amp.tables["stages"]["stash_bytes_per_microbatch"]
    assert int(stash.iloc[0]) > int(plain.tables["stages"]["stash_bytes_per_microbatch"]
                                    .iloc[0])


def test_default_is_as_recorded_and_unchanged(gpt: Any) -> None:
    assert Options().gpu_precision == "as-recorded"
    a = compile(gpt, Options(target="h100"))
    b = compile(gpt, Options(target="h100", gpu_precision="as-recorded"))
    assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)
    assert a.summary["gpu_precision"] == "as-recorded"
    assert a.meta["gpu"]["precision"]["name"] == "as-recorded"
    assert a.meta["options"]["gpu_precision"] == "as-recorded"
    assert a.summary["gpu_precision_bytes_per_param"] == 16  # fp32 AdamW as recorded
    # SGD with momentum holds one state: 4 B/param fewer (not the recipe's AdamW figure)
    sgd = compile(gpu_program("mlp", 64, 8, "sgd"), Options(target="h100",
                                                             gpu_precision="megatron-bf16"))
    assert sgd.summary["gpu_precision_bytes_per_param"] == 14


def test_plan_states_how_it_was_held(gpt: Any, tmp_path: Path) -> None:
    import popviz
    from popviz.analysis.facts import profile_facts
    from popviz.format.writer import write_report
    from popviz.reporters.summary import render_text

    r = compile(gpt, Options(target="a100", replication_factor=2,
                             gpu_precision="megatron-bf16-distopt"))
    assert r.meta["gpu"]["precision"]["bytes_per_param"] == 6 + 12 / 2
    write_report(r, tmp_path / "p")
    with popviz.open(tmp_path / "p") as p:
        facts = profile_facts(p)
        assert Options.from_meta(p.meta["options"]).gpu_precision == "megatron-bf16-distopt"
    assert facts["gpu_precision"] == "megatron-bf16-distopt"
    assert "GPU precision: megatron-bf16-distopt, 12 B/param" in render_text(facts)


def test_inference_holds_no_master_copies(gpt: Any) -> None:
    r = compile(gpt, Options(target="a100", training=False, gpu_precision="megatron-bf16"))
    names = r.tables["tensors"]["name"].astype(str)
    assert not names.str.endswith(".main_param").any()
    assert int(r.summary["max_memory_allocated"]["0"]) >= 2 * int(gpt.model["parameters"])


def test_unknown_names_are_one_line() -> None:
    with pytest.raises(ValueError, match=r"GPU precision 'fp8' is not one of as-recorded, "
                                         r"megatron-fp16, .*amp$"):
        Options().set_gpu_precision("fp8")
    with pytest.raises(ValueError, match="is for GPU targets"):
        compile(gpu_program("mlp", 64, 8), Options(target="mk2", gpu_precision="amp"))
    run = subprocess.run([sys.executable, "train.py", "--target", "a100", "--gpu-precision",
                          "fp8"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "--gpu-precision" in run.stderr and "megatron-bf16" in run.stderr
    ipu = subprocess.run([sys.executable, "train.py", "--gpu-precision", "amp"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert ipu.returncode == 2 and "is for GPU targets" in ipu.stderr
    assert ipu.stderr.count("\n") == 1


def test_tune_keeps_the_precision(gpt: Any, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    from popviz.cli.main import main
    from popviz.format.writer import write_report

    options = Options(target="a100", splits=["lm.transformer.h.1.ln_1"], schedule="1F1B",
                      gradient_accumulation=2, gpu_precision="megatron-bf16")
    r = compile(gpt, options)
    write_report(r, tmp_path / "p")
    assert main(["tune", str(tmp_path / "p"), "--gpus", "2", "--no-progress",
                 "--max-compiles", "4"]) == 0
    out = capsys.readouterr().out
    flags = [line for line in out.splitlines() if "train.py ..." in line]
    assert flags and all("--gpu-precision megatron-bf16" in f for f in flags)
    assert 'options.set_gpu_precision("megatron-bf16")' in out
    # the layouts it re-plans hold the recipe once (a second re-typing would halve the
    # activations again): the profile's own layout keeps its last GPU's peak
    import popviz
    from popviz.advise.plans import run_tune

    with popviz.open(tmp_path / "p") as p:
        result = run_tune(p, num_ipus=2, max_compiles=4)
    current = [c for c in result.candidates if c.source.startswith("current")]
    assert current and current[0].gpu_precision == "megatron-bf16"
    same = compile(gpt, options.copy(recomputation=current[0].recomputation))
    assert current[0].peak_bytes[1] == int(same.summary["max_memory_allocated"]["1"])


@pytest.mark.parametrize(("model", "recipe", "schedule"), [
    ("gpt", "as-recorded", "1F1B"), ("gpt", "megatron-fp16", "ZB1P"),
    ("resnet", "as-recorded", "1F1B"), ("resnet", "amp", "ZB2P")])
def test_variables_sum_to_the_liveness_at_every_step(gpt: Any, model: str, recipe: str,
                                                     schedule: str) -> None:
    """What /liveness and /memory list as the variables alive at a step adds up to the
    allocated bytes of that step, exactly: each holds the block the caching allocator gave
    it (a block it does not split is larger than the request), the optimiser step's
    transient included; the tied embedding's copy is always live, not listed here."""
    program, split = (gpt, "lm.transformer.h.1.ln_1") if model == "gpt" else \
        (gpu_program("resnet", 18, 4, "sgd", image=64), "b3/0/relu")
    r = compile(program, Options(target="a100", gpu_precision=recipe, schedule=schedule,
                                 splits=[split], num_ipus=2, gradient_accumulation=3))
    live, variables = r.tables["liveness"], r.tables["variables"]
    for gpu, rows in live.groupby("ipu"):
        mine = variables[(variables["ipu"] == gpu)
                         & ~variables["name"].str.contains("(copy on GPU", regex=False)]
        change = np.zeros(int(rows["step"].max()) + 2, dtype=np.int64)
        np.add.at(change, mine["first_step"].to_numpy(), mine["bytes"].to_numpy())
        np.add.at(change, mine["last_step"].to_numpy() + 1, -mine["bytes"].to_numpy())
        alive = np.cumsum(change)[rows["step"].to_numpy()]
        np.testing.assert_array_equal(alive, rows["not_always_live_bytes"].to_numpy())
