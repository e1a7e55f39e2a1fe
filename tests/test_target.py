"""Targets: published figures, derived rates, custom targets and their validation."""

from __future__ import annotations

import json

import pytest

from popviz.target import get_target, load_target, make_target, register_target, target_names


def test_builtin_targets_match_the_reference_figures() -> None:
    mk1, mk2, bow = get_target("mk1"), get_target("MK2"), get_target("bow")
    assert (mk1.tiles_per_ipu, mk1.bytes_per_tile) == (1216, 256 * 1024)
    assert (mk2.tiles_per_ipu, mk2.bytes_per_tile) == (1472, 624 * 1024)
    assert (bow.tiles_per_ipu, bow.bytes_per_tile) == (1472, 624 * 1024)
    assert mk1.bytes_per_ipu == 304 * 1024 * 1024  # hardware.md: 304 MiB per Mk1 IPU
    # hardware.md derived: 64 FLOPs/tile/cycle on Mk1, ~128 on Mk2 and Bow, FP32 a quarter
    assert mk1.flops_per_tile_cycle_fp16 == pytest.approx(64, rel=0.01)
    assert mk2.flops_per_tile_cycle_fp16 == pytest.approx(128, rel=0.01)
    assert bow.flops_per_tile_cycle_fp16 == pytest.approx(128, rel=0.01)
    for t in (mk1, mk2):
        assert t.flops_per_tile_cycle_fp32 == pytest.approx(t.flops_per_tile_cycle_fp16 / 4,
                                                            rel=0.01)
    assert bow.clock_hz > mk2.clock_hz
    assert get_target("gc200") is mk2


def test_ring_and_host_cycles_grow_with_bytes() -> None:
    mk2 = get_target("mk2")
    assert mk2.ring_cycles(0) == 0
    assert mk2.ring_cycles(1 << 20) < mk2.ring_cycles(1 << 24)
    # a ring sends over all ten links one way: 160 GB/s of the 320 quoted for both ways,
    # so 32 MB take ~200 us plus the latency
    assert mk2.ring_cycles(32e6) / mk2.clock_hz == pytest.approx(200e-6 + 1e-6, rel=0.01)
    assert mk2.host_cycles(64e6) > mk2.ring_cycles(64e6)


def test_a_stage_copy_uses_the_links_to_its_neighbour_one_way() -> None:
    mk1, mk2, bow = get_target("mk1"), get_target("mk2"), get_target("bow")
    # Mk2 / Bow: two of the ten links, 16 GB/s each way: 32 MB take 1 ms, a tenth of the
    # whole IPU's 320 GB/s; Mk1's 192 GB/s is already its two IPUs' figure
    for t in (mk2, bow):
        assert t.stage_copy_cycles(32e6) / t.clock_hz == pytest.approx(1e-3 + 1e-6)
        assert t.stage_copy_cycles(32e6) > 4.5 * t.ring_cycles(32e6)  # 2 links of 10
    # Mk1: the C2 card's two IPUs, 192 GB/s in all; a stage copies one way over them
    assert mk1.stage_copy_cycles(32e6) == pytest.approx(mk1.ring_cycles(16e6), rel=1e-9)
    assert mk2.stage_copy_cycles(0) == 0


def test_a_pipelines_activation_copies_are_costed_at_the_stage_link() -> None:
    from popviz.compiler import compile
    from popviz.options import Options
    from tooling.testing.programs import synthetic_program

    program = synthetic_program(layers=8, batch=8, channels=32, hw=32)
    options = Options(splits=["l4"], num_ipus=2, gradient_accumulation=4,
                      micro_batch_size=8)
    exchange = compile(program, options).tables["exchange"]
    copies = exchange[exchange["kind"].isin(["activation", "gradient"])]
    assert len(copies) and (copies["bytes"] > 0).all()
    mk2 = get_target("mk2")
    want = [int(-(-mk2.stage_copy_cycles(b) // 1)) for b in copies["bytes"]]
    assert (copies["end"] - copies["start"]).tolist() == want


def test_unknown_target_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match=r"valid targets: .*mk1, .*mk2"):
        get_target("mk9")


def test_custom_target_from_dict_and_base() -> None:
    small = register_target({"name": "Tiny", "base": "mk2", "tiles_per_ipu": 16})
    assert small.name == "tiny" and small.tiles_per_ipu == 16
    assert small.bytes_per_tile == get_target("mk2").bytes_per_tile
    assert get_target("tiny") == small
    assert "tiny" in target_names()
    with pytest.raises(ValueError, match="exists"):
        register_target({"name": "tiny", "base": "mk1"})


@pytest.mark.parametrize(("spec", "message"), [
    ({"name": "x", "tiles_per_ipu": 4}, "lacks fields"),
    ({"name": "x", "base": "mk2", "bytes_per_tile": -1}, "must be >= 0"),
    ({"name": "x", "base": "mk2", "clock_hz": 0}, "must be > 0"),
    ({"name": "x", "base": "mk2", "tiles": 4}, "unknown target fields"),
    ({"name": "x", "base": "mk2", "clock_hz": "fast"}, "must be a number"),
    ({"name": "x", "base": "nope"}, "unknown target"),
    ({"name": " ", "base": "mk2"}, "non-empty"),
])
def test_invalid_target_descriptions_raise_one_clear_error(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_target(spec)


def test_load_target_from_json_and_toml(tmp_path) -> None:
    fields = {"name": "lab", "tiles_per_ipu": 64, "bytes_per_tile": 65536, "clock_hz": 1e9,
              "peak_fp16_flops": 64 * 1e9 * 32, "peak_fp32_flops": 64 * 1e9 * 8,
              "memory_bytes_per_s": 1e12, "exchange_bytes_per_s": 1e12,
              "ipu_link_bytes_per_s": 1e10}
    (tmp_path / "lab.json").write_text(json.dumps(fields))
    lab = load_target(tmp_path / "lab.json")
    assert lab.flops_per_tile_cycle_fp16 == pytest.approx(32)
    assert get_target("lab") == lab
    toml = "\n".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}"
                     for k, v in {**fields, "name": "lab2"}.items()).replace("'", '"')
    (tmp_path / "lab2.toml").write_text("[target]\n" + toml + "\n")
    assert load_target(tmp_path / "lab2.toml").tiles_per_ipu == 64
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid json"):
        load_target(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="does not exist"):
        load_target(tmp_path / "missing.json")
