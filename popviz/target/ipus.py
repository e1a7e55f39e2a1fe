"""The built-in IPUs: Mk1 GC2, Mk2 GC200, Bow and the C600 card.

Every figure cites docs/hardware.md ("hardware.md": the figures and their public sources).
"derived" marks a figure computed from published ones; "assumed" marks a modelling
constant with no public figure (documented and calibrated in docs/cost-model.md).
"""

from __future__ import annotations

from popviz.target.targetspec import KIB, Target

_REF = "docs/hardware.md"
_EENEWS = ("eeNews Europe, 'Graphcore slashes power in first Dell server' (C2 card: 192 GB/s "
           "of IPU-Link bandwidth between its two IPUs; exchange 62.5 Tbit/s)")
_GW = ("published: Graphcore, 'Switched GW-Links in large scale Pod systems' "
       "(docs.graphcore.ai/projects/switched-gwlinks): each IPU-Machine has two GW-Link "
       "ports (east, west) with 100 Gbps interfaces, forming the horizontal loop of a 3D "
       "torus with the IPU-Links; 2 x 100 Gbit/s = 25 GB/s each direction")
_M2000 = "published: an IPU-M2000 / Bow-2000 holds 4 IPUs (" + "docs/hardware.md)"
_POD64 = ("published: Graphcore IPU-POD128 datasheet (docs.graphcore.ai/projects/"
          "ipu-pod128-datasheet): an IPU-POD128 is two IPU-POD64 logical racks joined by "
          "GW-Link cables; IPU-Links stay inside a rack")
_STAGE_LINK = ("assumed: a pipeline stage's copy to the next IPU uses the IPU-Links joining the "
               "two IPUs in one direction, not all ten both ways: 320 GB/s in all = 10 links x "
               "2 directions x 16 GB/s (a PCIe Gen4 x8 physical layer per link, as the "
               "IPU-M2000 block diagram of Graphcore's BMC user guide shows), and two links "
               "assumed between pipeline neighbours: 32 GB/s. Of the link counts tried (2, 4, "
               "all 10 both ways) two gives the one published pipeline with a large stage "
               "boundary (ResNet-50 on 4 IPUs, 25.7 MB a micro-batch at b1/2) the smallest "
               "error (docs/cost-model.md)")
_COMMON = {
    "ipu_link_latency_s": "assumed: 1 us per IPU-Link transfer (no public figure read; Jia et "
                          "al. 2019 measure it, see docs/cost-model.md)",
    "host_latency_s": "assumed: 2 us per host stream copy",
}

MK1 = Target(
    name="mk1",
    description="Graphcore Colossus Mk1 GC2 (C2 card)",
    tiles_per_ipu=1216,
    bytes_per_tile=256 * KIB,
    clock_hz=1.6e9,
    peak_fp16_flops=124.5e12,
    peak_fp32_flops=31.1e12,
    memory_bytes_per_s=45e12,
    exchange_bytes_per_s=8e12,
    ipu_link_bytes_per_s=192e9,
    host_bytes_per_s=32e9,
    ipus_per_machine=2,
    sources={
        "tiles_per_ipu": f"published: {_REF} (1216 tiles)",
        "bytes_per_tile": f"published: {_REF} (256 KiB)",
        "clock_hz": f"derived: {_REF} (~1.6 GHz, derived there from peak / tiles)",
        "peak_fp16_flops": f"published: {_REF} (124.5 TFLOPS)",
        "peak_fp32_flops": f"published: {_REF} (31.1 TFLOPS)",
        "memory_bytes_per_s": f"published: {_REF} (45 TB/s)",
        "exchange_bytes_per_s": f"published: {_REF} (~8 TB/s); {_EENEWS}",
        "ipu_link_bytes_per_s": f"published: {_EENEWS}",
        "stage_link_bytes_per_s": "published: 0 = the C2 card's 192 GB/s, already the figure "
                                  "between its two IPUs (" + _EENEWS + ")",
        "host_bytes_per_s": "derived: PCIe Gen3 x16, half of the Gen4 ~64 GB/s in " + _REF,
        "gw_link_bytes_per_s": "published: Mk1 C2 cards sit in host servers (PCIe); there is "
                               "no IPU-Gateway, so no multi-rack all-reduce (0)",
        "ipus_per_machine": f"published: {_REF} (C2 card: 2 IPUs; unused without GW-Links)",
        "ipus_per_rack": "assumed: unused without GW-Links",
        **_COMMON},
)

MK2 = Target(
    name="mk2",
    description="Graphcore Colossus Mk2 GC200 (IPU-M2000)",
    tiles_per_ipu=1472,
    bytes_per_tile=624 * KIB,
    clock_hz=1.33e9,
    peak_fp16_flops=250e12,
    peak_fp32_flops=62.5e12,
    memory_bytes_per_s=47.5e12,
    exchange_bytes_per_s=8e12,
    ipu_link_bytes_per_s=320e9,
    stage_link_bytes_per_s=32e9,
    host_bytes_per_s=64e9,
    gw_link_bytes_per_s=25e9,
    sources={
        "tiles_per_ipu": f"published: {_REF} (1472 tiles)",
        "bytes_per_tile": f"published: {_REF} (624 KiB)",
        "clock_hz": f"published: {_REF} (1.33 GHz)",
        "stage_link_bytes_per_s": _STAGE_LINK,
        "peak_fp16_flops": f"published: {_REF} (250 TFLOPS)",
        "peak_fp32_flops": f"published: {_REF} (62.5 TFLOPS)",
        "memory_bytes_per_s": f"published: {_REF} (47.5 TB/s)",
        "exchange_bytes_per_s": "published: Graphcore's GC200 product figures, 'IPU-Exchange "
                                "bandwidth 8 TB/s using any communication pattern' (as "
                                "summarised at thecharlieblake.co.uk/ipus; the ~47 TB/s that "
                                "reference/ipu.md lists for Mk2 is its 47.5 TB/s memory "
                                "bandwidth): 4 bytes per tile per cycle, as on Mk1",
        "ipu_link_bytes_per_s": f"published: {_REF} (10 IPU-Links, 320 GB/s in all)",
        "host_bytes_per_s": f"published: {_REF} (PCIe Gen4 x16, ~64 GB/s)",
        "gw_link_bytes_per_s": _GW,
        "ipus_per_machine": _M2000,
        "ipus_per_rack": _POD64,
        **_COMMON},
)

MK2_CLOCK_RATIO = 1.85e9 / 1.33e9
BOW = Target(
    name="bow",
    description="Graphcore Bow IPU (Bow-2000)",
    tiles_per_ipu=1472,
    bytes_per_tile=624 * KIB,
    clock_hz=1.85e9,
    peak_fp16_flops=350e12,
    peak_fp32_flops=62.5e12 * MK2_CLOCK_RATIO,
    memory_bytes_per_s=47.5e12 * MK2_CLOCK_RATIO,
    exchange_bytes_per_s=8e12 * MK2_CLOCK_RATIO,
    ipu_link_bytes_per_s=320e9,
    stage_link_bytes_per_s=32e9,
    host_bytes_per_s=64e9,
    gw_link_bytes_per_s=25e9,
    sources={
        "tiles_per_ipu": f"published: {_REF} (1472 tiles)",
        "bytes_per_tile": f"published: {_REF} (624 KiB)",
        "clock_hz": f"published: {_REF} (1.85 GHz)",
        "stage_link_bytes_per_s": "assumed: Mk2's (same IPU-Links); " + _STAGE_LINK,
        "peak_fp16_flops": f"derived: {_REF} (~350 TFLOPS = 1.4 PFLOPS per Bow-2000 / 4)",
        "peak_fp32_flops": "derived: Mk2's per-tile fp32 rate at Bow's clock",
        "memory_bytes_per_s": "derived: Mk2's 47.5 TB/s at Bow's clock (same tile)",
        "exchange_bytes_per_s": "derived: Mk2's 8 TB/s at Bow's clock (same tile)",
        "ipu_link_bytes_per_s": "assumed: Mk2's 320 GB/s (same IPU-Links)",
        "host_bytes_per_s": "assumed: Mk2's 64 GB/s (same PCIe Gen4 host link)",
        "gw_link_bytes_per_s": _GW,
        "ipus_per_machine": _M2000,
        "ipus_per_rack": _POD64,
        **_COMMON},
)

_C600_SPECS = ("Graphcore C600 product specifications as quoted in bytedance/ByteMLPerf "
               "byte_mlperf/backends/IPU/README.md (commit "
               "3b8b5339047d9550c8745188f1eb9c10adfb3fd0)")
_C600 = "published: " + _C600_SPECS
C600_CLOCK_RATIO = 1.5e9 / 1.33e9
C600 = Target(
    name="c600",
    description="Graphcore C600 PCIe card (one Mk2 IPU at 1.5 GHz)",
    tiles_per_ipu=1472,
    bytes_per_tile=624 * KIB,
    clock_hz=1.5e9,
    peak_fp16_flops=280e12,
    peak_fp32_flops=70e12,
    memory_bytes_per_s=47.5e12 * C600_CLOCK_RATIO,
    exchange_bytes_per_s=8e12 * C600_CLOCK_RATIO,
    ipu_link_bytes_per_s=128e9,
    stage_link_bytes_per_s=32e9,
    host_bytes_per_s=32e9,
    ipus_per_machine=1,
    ipus_per_rack=8,
    sources={
        "tiles_per_ipu": f"{_C600} (1,472 IPU-Cores)",
        "bytes_per_tile": f"derived: {_C600_SPECS} (900 MB of In-Processor Memory over "
                          "1,472 cores: Mk2's 624 KiB tile)",
        "clock_hz": "published: graphcore/PopRT tools/calc_ipu_utilization.py (commit "
                    "7487d65ae3fa17156c12d32653c038953dd996f4): clock speeds C600 1.5e9, M2000 "
                    "1.33e9, Bow2000 1.85e9 (280 TFLOPS / (1,472 tiles x 128 FLOPs) = 1.49 GHz)",
        "peak_fp16_flops": f"{_C600} (up to 280 teraFLOPS of FP16)",
        "peak_fp32_flops": f"{_C600} (up to 70 teraFLOPS of FP32)",
        "memory_bytes_per_s": "derived: Mk2's 47.5 TB/s at the C600's clock (same tile)",
        "exchange_bytes_per_s": "derived: Mk2's 8 TB/s at the C600's clock (same tile)",
        "ipu_link_bytes_per_s": f"{_C600} (32 lanes, 128 GB/s, 64 GB/s each direction)",
        "stage_link_bytes_per_s": "assumed: Mk2's; " + _STAGE_LINK,
        "host_bytes_per_s": f"{_C600} (dual PCIe Gen4 8-lane interfaces: 2 x ~16 GB/s)",
        "gw_link_bytes_per_s": "published: C600 cards sit in host servers (PCIe), up to eight "
                               "joined by IPU-Link cables; no IPU-Gateway (0)",
        "ipus_per_machine": f"{_C600} (one IPU a card)",
        "ipus_per_rack": f"{_C600} (up to eight cards joined by IPU-Link cables)",
        **_COMMON},
)
