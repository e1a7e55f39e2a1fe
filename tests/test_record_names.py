"""Splits by module path (no model edits), checked before the step runs."""

from __future__ import annotations

import pytest
import torch

import popviz
from popviz.options import Options
from tests.test_zoo import gpt2


def _record(options: Options, profile_dir=None):
    torch.manual_seed(0)
    built = gpt2("eager")
    ran = []

    def step() -> None:
        ran.append(True)
        built.step()

    with popviz.record(options, profile_dir=profile_dir, model=built.model,
                       progress=False) as recording:
        step()
    return recording, ran


def test_module_path_splits_place_blocks_and_the_loss() -> None:
    options = Options().set_num_ipus(2).set_pipeline_splits("transformer.h.1")
    recording, _ = _record(options)
    from popviz.compiler import compile as compile_program

    report = compile_program(recording.program, recording.options)
    ops = report.tables["ops"]
    fwd = ops[ops.phase == "forward"]
    in_block = fwd.module.str.startswith
    assert set(fwd.loc[in_block("transformer.h.0"), "stage"]) == {0}
    assert set(fwd.loc[in_block("transformer.h.1"), "stage"]) == {1}
    # the block's own residual adds run after its attention: still stage 1
    assert set(fwd.loc[fwd.module == "transformer.h.1", "stage"]) == {1}
    assert fwd.stage.is_monotonic_increasing  # never back to an earlier stage
    loss = ops[ops.op.str.contains("nll_loss")]
    assert len(loss) == 2 and set(loss.stage) == {1}
    assert report.summary["num_ipus"] == 2


def test_one_ipu_splits_are_recomputation_sections() -> None:
    options = Options().set_num_ipus(1).set_pipeline_splits("transformer.h.1")
    options.set_recomputation(True)
    recording, _ = _record(options)
    from popviz.compiler import compile as compile_program

    report = compile_program(recording.program, recording.options)
    ops = report.tables["ops"]
    assert set(ops.stage) == {0}
    fwd = ops[ops.phase == "forward"]
    # two sections in forward order: up to block 1, then block 1 to the loss
    assert fwd.section.is_monotonic_increasing and set(fwd.section) == {0, 1}
    first = fwd[fwd.module.str.startswith("transformer.h.1")].index.min()
    assert set(fwd.loc[:first - 1, "section"]) == {0}
    assert (ops.phase == "recompute").any()


def test_unknown_split_fails_before_the_step_with_closest_names() -> None:
    options = Options().set_num_ipus(2).set_pipeline_splits("transformer.h.7")
    with pytest.raises(ValueError, match=r"'transformer\.h\.7' \(closest: transformer\.h\.") \
            as err:
        _record(options)
    assert "\n" not in str(err.value)
    torch.manual_seed(0)
    built = gpt2("eager")
    ran = []
    with pytest.raises(ValueError), popviz.record(options, profile_dir=None,
                                                  model=built.model, progress=False):
        ran.append(True)
    assert not ran  # the block never ran


def test_split_count_must_match_ipus_before_the_step() -> None:
    options = Options().set_num_ipus(4).set_pipeline_splits("transformer.h.1")
    with pytest.raises(ValueError, match="4 IPUs need 3 pipeline split names"):
        _record(options)


def test_stage_naming_an_unknown_block_fails_before_the_update() -> None:
    model = torch.nn.Linear(3, 2)
    before = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    options = Options().set_execution_strategy(
        popviz.PipelinedExecution(popviz.Stage("A"), popviz.Stage("B")))
    with pytest.raises(ValueError, match="unknown block 'B'"), \
            popviz.record(options, profile_dir=None, model=model, progress=False):
        with popviz.Block("A", ipu_id=0):
            loss = model(torch.randn(4, 3)).sum()
        loss.backward()
        opt.step()
    assert torch.equal(model.weight, before)  # the optimiser never updated


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_num_ipus_setter_checks(bad) -> None:
    with pytest.raises(ValueError, match="num_ipus"):
        Options().set_num_ipus(bad)
    assert Options().set_num_ipus(3).num_ipus == 3


def test_tied_weights_across_stages_copy_and_exchange(tmp_path) -> None:
    """GPT-2's wte is read by the embedding (stage 0) and lm_head (stage 1)."""
    options = Options().set_num_ipus(2).set_pipeline_splits("transformer.h.1")
    recording, _ = _record(options, profile_dir=tmp_path)
    prof = popviz.open(tmp_path)
    shared = prof.meta["shared_parameters"]
    assert shared == [{"name": "transformer.wte.weight", "bytes": 64 * 32 * 4, "home_ipu": 0,
                       "copy_ipus": [1]}]
    ex = prof.exchange
    grads = ex[ex["kind"] == "shared_gradient"]
    updates = prof.trace[(prof.trace["pass"] == "WU") & (prof.trace["stage"] == 0)
                         & (prof.trace["kind"] == "compute")]
    assert len(grads) == updates["start"].nunique() >= 1
    assert (grads["src"] == 1).all() and (grads["dst"] == 0).all()
    assert (grads["bytes"] == 64 * 32 * 2).all()  # fp16 weights (16.16)
    assert (grads["end"] > grads["start"]).all()
    copy = recording.report.tables["tensors"]
    copy = copy[copy["name"] == "transformer.wte.weight (copy on IPU1)"]
    assert copy["ipu"].tolist() == [1] and copy["category"].tolist() == ["parameter"]
    # the copy is spread over tiles like any weight, not piled onto the tile of the
    # program's last op (no op reads the copy by id: only its last_use names one)
    on_ipu1 = prof.tile_memory[prof.tile_memory["ipu"] == 1]
    assert on_ipu1["always_live"].max() < 64 * 32 * 2
    from popviz.analysis.advice import advise

    texts = [a.text for a in advise(prof.meta, prof.stages, prof.tile_memory, prof.ops)]
    assert any("transformer.wte.weight" in t and "copy on IPU1" in t for t in texts)


def test_one_stage_has_no_shared_parameters() -> None:
    recording, _ = _record(Options())
    from popviz.compiler import compile as compile_program

    report = compile_program(recording.program, recording.options)
    assert "shared_parameters" not in report.summary
    assert "shared_gradient" not in set(report.tables["exchange"]["kind"])


def test_tied_weights_count_the_same_in_the_recording_and_in_tune(tmp_path) -> None:
    """tune re-plans the program stored in a profile, whose tensors hold the copies compile
    made: they are made once again, not added to the stored ones (the fullest tile of the
    README's GPT-2 read 1158% recorded and 2164% in tune's 'now' row)."""
    from popviz.advise.tune import load_program
    from popviz.compiler import compile as compile_program

    options = Options().set_num_ipus(2).set_pipeline_splits("transformer.h.1")
    _record(options, profile_dir=tmp_path)
    prof = popviz.open(tmp_path)
    program, stored = load_program(prof)
    copies = program.tensors["name"].str.endswith("(copy on IPU1)")
    assert copies.sum() == 1  # the profile's tensors hold the copy ...
    again = compile_program(program, stored)
    tensors = again.tables["tensors"]
    assert tensors["name"].str.endswith("(copy on IPU1)").sum() == 1  # ... made once
    for column in ("always_live", "total_bytes"):
        assert again.tables["tile_memory"][column].tolist() == \
            prof.tile_memory[column].tolist()


def test_the_readme_gpt2_example_runs_and_fits_as_graphcore_ran_it(tmp_path, monkeypatch
                                                                   ) -> None:
    """README.md's GPT-2 block, run as written (plan mode): it fits, and tune's 'now' row
    is the recorded layout, fitting too."""
    pytest.importorskip("transformers")
    from pathlib import Path

    from popviz.advise.tune import load_program, tune

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = text.index("    import popviz, torch, transformers\n")
    block = text[start:text.index("\n\n", start)]
    code = "\n".join(line[4:] for line in block.splitlines())
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})  # the README's own example, as written
    prof = popviz.open(tmp_path / "gpt2_pipeline")
    assert prof.summary["fits"] is True
    assert prof.meta["options"]["outlining"] is True
    program, options = load_program(prof)
    result = tune(program, options, max_compiles=4)
    assert result.baseline.fits and result.baseline.max_tile_fill == pytest.approx(
        (prof.tile_memory.groupby("ipu")["total_bytes"].max()
         / prof.tile_memory["capacity_bytes"].iloc[0]).round(6).tolist())
