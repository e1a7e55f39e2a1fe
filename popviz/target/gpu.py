"""GPU targets: NVIDIA H100 SXM, H100 PCIe, H200 SXM, A100 80GB (kernels on streams, no tiles).

The second target family beside the IPUs of `machines.py`. A GPU runs each recorded op as
one or more kernels on one stream; its time is a roofline of the op's FLOPs (tensor cores by
dtype) and bytes (HBM) plus a fixed cost per kernel (`popviz/target/gpu_cost.py`); its
memory is what PyTorch's caching allocator holds (`popviz/compiler/gpu_alloc.py`). Every
figure names its source in `sources` (published datasheet figures are listed with their
documents in docs/hardware.md, "GPU targets"); the modelling constants live in `GpuCost`
with their provenance. Times in a GPU profile are ns (`clock_hz` = 1e9).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

GPU_FAMILY = "gpu"
IPU_FAMILY = "ipu"
GB = 1e9
TB = 1e12


@dataclass(frozen=True)
class GpuCost:
    """Modelling constants of the GPU roofline. `fitted` ones are set by
    bench/fit_gpu_cost.py to the ResNet-50 batch-64 H100 fixture's kernel times per op
    class (tests/fixtures/kineto_resnet50_b64.json.gz); the pipelining fixture stays out of
    the fit as a check. The others are assumed (docs/cost-model.md, "GPU targets")."""

    kernel_ns: float = 1456.0  # fitted: fixed GPU time per kernel (launch, ramp, tail)
    # measured: share of dense bf16 / fp16 one SM's tile of a cuBLAS GEMM gets on the tensor
    # cores, and the rest of popviz/target/gpu_gemm.py's wave model (fixed time past the
    # launch, split-K's extra pass, an SM's operand loads per cycle, the share of HBM a
    # GEMM streams at), per kernel family, on 264 GEMMs timed kernel by kernel on an H200
    # (bench/gpu_gemm_shapes.py -> bench/data/gpu_gemm_shapes_h200.json; fit:
    # bench/fit_gpu_gemm.py). Large GEMMs reach 0.83 less their last wave, as Zero Bubble's
    # Table 9 weight-gradient passes do on A100 (0.80-0.81 of the whole GEMM)
    matmul_efficiency: float = 0.83
    tensor_gemm_fixed_ns: float = 1044.0
    tensor_gemm_split_k_ns: float = 2000.0
    tensor_gemm_load_bytes_per_cycle: float = 76.0
    tensor_gemm_memory_efficiency: float = 0.80
    simt_gemm_fixed_ns: float = 1544.0
    simt_gemm_split_k_ns: float = 3000.0
    simt_gemm_load_bytes_per_cycle: float = 8.0
    simt_gemm_memory_efficiency: float = 0.70
    # measured: the same for a half GEMM with a size that is not a multiple of 8 (the align1
    # kernels, `cutlass_75_tensorop_bf16_s1688gemm_bf16_*_align1`), per whole GEMM: its
    # output's rows of such a size (GPT-2's LM head forward, [tokens x 50,257]) 0.095, an
    # operand's only (its input and weight gradients) 0.14, on the H200 microbenchmark
    # (bench/data/gpu_gemm_shapes_h200.json, 768 x 50,257 at 2,048 and 8,192 rows:
    # 0.094-0.095 and 0.139-0.147). One 0.124 had been fitted on the three of the H200 bf16
    # GPT-2 trace (tests/fixtures/kineto_gpt2-small-sdpa-amp-s1024-b8_h200)
    misaligned_matmul_efficiency: float = 0.14
    misaligned_output_matmul_efficiency: float = 0.095
    # fitted on ResNet-50's convolutions and batch norms before they had their own models
    # (gpu_conv.py, gpu_norm.py); kept for grouped / depthwise convolutions, fused
    # attention and layer norms, whose kernels have not been measured apart
    conv_efficiency: float = 0.312  # share of the peak for a convolution (fp32: TF32)
    conv_backward_efficiency: float = 0.216  # the same, dgrad + wgrad
    ramp_ns: float = 18950.0  # a tensor-core op's fixed time (SM fill / drain)
    memory_efficiency: float = 0.840  # fitted: share of HBM bandwidth an elementwise op gets
    norm_reads: float = 3.31  # (as conv_efficiency) times a norm reads its input
    attention_efficiency: float = 0.45  # assumed: fused (flash) attention, FA2 on H100
    vector_efficiency: float = 0.60  # assumed: share of the non-tensor FP32 rate
    # measured: an fp32 GEMM tile's share of the CUDA cores' FP32 rate (cuBLAS SGEMM, FFMA:
    # fp32 matmuls may not use TF32 by default), with the SIMT constants above
    fp32_matmul_efficiency: float = 0.72
    # fitted: host time per kernel eager PyTorch issues (dispatch, autograd, launch), on
    # the host-bound steps of two H200 machines (ResNet-50 b32 on both, b8, GPT-2 small
    # s256 b2: least mean |log error|); a property of the host CPU: the same step ran in
    # 31.4 and 22.3 ms on the two (bench/data/gpu_measured_h200*.json)
    host_launch_ns: float = 28000.0
    conv_forward_kernels: float = 3.0  # measured: fixture, 156 kernels / 53 convs (NCHW)
    conv_backward_kernels: float = 6.0  # measured: fixture, 318 kernels / 53 backward convs
    foreach_tensors: float = 48.0  # assumed: tensors per multi_tensor_apply launch
    context_bytes: int = 512 * 2**20  # assumed: CUDA context + cuBLAS / cuDNN workspace
    # fitted: the share of the link's datasheet rate a pipeline's NCCL send / recv gets,
    # from Zero Bubble's Table 9 (1.5B: 28.3 MB in 0.601 ms, 47.5 GB/s over A100 NVLink's
    # 300 GB/s); its 6.2B p2p (25.2 MB in 0.527 ms) is the check (docs/cost-model.md)
    p2p_efficiency: float = 0.158
    # measured: SM cycles per element of PyTorch's element-wise kernels that are not the
    # vectorized one (popviz/recorder/kernel_path.py), fitted per path on an H200
    # (bench/gpu_kernel_paths.py -> bench/data/gpu_kernel_paths_h200.json; the fit:
    # bench/fit_gpu_paths.py). They count instructions, not bytes, so another GPU runs
    # them in proportion to its SMs x clock. The unrolled kernel (a dtype conversion):
    # base + per operand; the offset-computing one (strided): per thread (spread over the
    # 4 elements a thread takes in 2-byte dtypes, 2 in wider ones) + per element + per
    # merged dimension; a transposed fastest dimension and cat's slow path: per element
    # fitted: the fixed time of a reduction over leading dimensions (a bias gradient's
    # sum over the tokens): PyTorch's reduce kernel splits each output over several blocks
    # that meet through a global buffer and semaphores (Reduce.cuh, global reduce), on the
    # H200 GPT-2 small s512 trace's 48 bias-gradient sums (14.5-27 us against 3-12 us of
    # bytes); the Zero Bubble-shape and bf16 GPT-2 traces are the check
    global_reduce_ns: float = 10500.0
    # measured: 2-D convolutions as cuDNN runs them on NCHW tensors (popviz/target/
    # gpu_conv.py): the share of the tensor cores' peak its GEMM's tiles get, times another
    # share for a weight gradient, for an input of channels that are no multiple of 8, and
    # for a half 1x1 one of pixels that are not (4-aligned kernels); the NHWC copies around
    # an implicit GEMM (times a read and a write of what it reads and writes) and their
    # kernels' fixed time; on ResNet-50's 23 convolutions timed kernel by kernel on an H200
    # (bench/gpu_conv_shapes.py -> bench/data/gpu_conv_shapes_h200.json; fit:
    # bench/fit_gpu_conv.py)
    conv_gemm_efficiency: float = 0.45
    conv_weight_grad_efficiency: float = 0.80
    conv_misaligned_efficiency: float = 0.15
    conv_align4_efficiency: float = 0.45
    conv_copy_passes: float = 1.2
    conv_copy_fixed_ns: float = 4000.0
    # measured: training-mode batch norm as its kernels run it, a block per channel
    # (popviz/target/gpu_norm.py), on 36 shapes of ResNet-50's in fp32 and bf16 timed
    # kernel by kernel on an H200 (bench/gpu_norm_kernels.py -> bench/data/
    # gpu_norm_kernels_h200.json). cuDNN (fp32 / fp16): the times a value is read or
    # written and the bytes a block streams per SM cycle, forward and backward, the share
    # of HBM, the fixed time past the launch; PyTorch's native kernels (bf16): values per
    # cycle of a block's serial statistics, blocks to an SM, bytes per value of the
    # element-wise pass, its cost per (image, channel) plane, the fixed time
    cudnn_bn_forward_reads: float = 3.5
    cudnn_bn_backward_reads: float = 6.0
    cudnn_bn_forward_block_bytes_per_cycle: float = 13.0
    cudnn_bn_backward_block_bytes_per_cycle: float = 8.0
    cudnn_bn_memory_efficiency: float = 0.80
    cudnn_bn_fixed_ns: float = 1044.0
    native_bn_forward_values_per_cycle: float = 0.8
    native_bn_backward_values_per_cycle: float = 0.4
    native_bn_blocks_per_sm: float = 4.0
    native_bn_forward_bytes: float = 10.5
    native_bn_backward_bytes: float = 14.0
    native_bn_plane_ns: float = 80.0
    native_bn_fixed_ns: float = 2044.0
    unrolled_cycles: float = 0.30
    unrolled_operand_cycles: float = 0.21
    strided_thread_cycles: float = 0.50
    strided_element_cycles: float = 0.43
    strided_dim_cycles: float = 0.04
    strided_cast_cycles: float = 0.20
    transpose_cycles: float = 1.80
    cat_dim_cycles: float = 0.40
    # measured: SM cycles per element of CUDA's fused dropout (`fused_dropout_kernel_vec`),
    # which draws each element's uniform from Philox4x32-10: 10 rounds of two 32-bit wide
    # multiplies and XORs per 4 draws, ~25 integer instructions an element at an SM's 64
    # INT32 lanes a cycle (A100 and H100 alike), 0.4 cycles. On the H200 Zero Bubble-shape
    # traces (tests/fixtures/kineto_zb*_h200) the 94-151 M-element attention dropouts ran
    # 597-617 G elements/s, 0.43 cycles, against 840-855 G/s for the backward's
    # masked_scale that moves the same 5 bytes an element (HBM-bound); so on an H100 / H200
    # the draw, not HBM, sets the forward's pace, and on an A100 (less bandwidth per SM
    # cycle) the two are within 5%
    dropout_cycles: float = 0.43

    def to_dict(self) -> dict[str, float]:
        return {f"gpu_{k}": float(v) for k, v in asdict(self).items()}

    def with_values(self, **values: float) -> GpuCost:
        names = {f.name for f in fields(GpuCost)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown GPU cost constants {unknown}; valid: "
                             f"{', '.join(sorted(names))}")
        return replace(self, **values)  # type: ignore[arg-type]  # a fit gives int fields floats too


DEFAULT_GPU_COST = GpuCost()


@dataclass(frozen=True)
class GpuTarget:
    """One GPU model. Rates are dense (no structured sparsity), per GPU."""

    name: str
    description: str
    memory_bytes: int  # device memory the CUDA runtime reports (totalGlobalMem)
    hbm_bytes_per_s: float
    fp32_flops: float  # CUDA cores, no tensor cores
    tf32_flops: float  # tensor cores, dense
    bf16_flops: float  # = fp16, dense
    fp8_flops: float  # 0 where the GPU has none
    nvlink_bytes_per_s: float  # per direction, one GPU to its peers
    pcie_bytes_per_s: float  # per direction, to the host (and peers without NVLink)
    nvlink_gpus: int = 8  # GPUs one NVLink domain joins (an HGX board); more: PCIe
    gpus_per_node: int = 8  # GPUs one server holds; beyond it, the network
    # per GPU per direction between servers: InfiniBand / RoCE, one NIC per GPU
    network_bytes_per_s: float = 25 * GB
    p2p_latency_s: float = 5e-6  # assumed
    host_latency_s: float = 10e-6  # assumed
    sms: int = 132
    sm_clock_hz: float = 1.98e9  # boost clock of the SMs (kernels bound by instructions)
    clock_hz: float = 1e9  # times are ns: one "cycle" is one ns
    sources: dict[str, str] = field(default_factory=dict, compare=False)
    cost: GpuCost = DEFAULT_GPU_COST

    family = GPU_FAMILY

    # IPU words some shared code reads: a GPU has no tiles
    tiles_per_ipu = 0
    bytes_per_tile = 0

    def peak_flops(self, dtype: str, tensor_cores: bool = True) -> float:
        """Dense FLOP/s for an op in `dtype`: bf16 / fp16 on tensor cores; fp32 on TF32
        tensor cores when `tensor_cores` (PyTorch's cuDNN default), else on CUDA cores."""
        d = str(dtype)
        if d in ("float16", "bfloat16", "half"):
            return self.bf16_flops
        if "float8" in d:
            return self.fp8_flops or self.bf16_flops
        return self.tf32_flops if tensor_cores else self.fp32_flops

    def link_bytes_per_s(self, link: bool | str = True) -> float:
        """Line rate of a link, per direction: "nvlink" (True), "pcie" (False: peers
        without NVLink in one server) or "network" (between servers)."""
        name = link_name(link)
        if name == "nvlink" and self.nvlink_bytes_per_s:
            return self.nvlink_bytes_per_s
        if name == "network":
            return self.network_bytes_per_s
        return self.pcie_bytes_per_s

    def p2p_ns(self, nbytes: float, link: bool | str = True) -> float:
        """One NCCL send / recv of `nbytes` between two GPUs (alpha-beta). Over NVLink a
        pipeline's send gets `p2p_efficiency` of the line rate (fitted); that ceiling is
        NCCL's (the channels a send / recv uses), so a slower link runs at the lesser of
        its own line rate and it."""
        if nbytes <= 0:
            return 0.0
        ceiling = (self.nvlink_bytes_per_s or self.pcie_bytes_per_s) * self.cost.p2p_efficiency
        rate = ceiling if link_name(link) == "nvlink" else \
            min(self.link_bytes_per_s(link), ceiling)
        return (self.p2p_latency_s + nbytes / rate) * 1e9

    def allreduce_ns(self, nbytes: float, gpus: int, link: bool | str = True) -> float:
        """A ring all-reduce of `nbytes` over `gpus` GPUs: 2(n-1) steps of n-th chunks, at
        the line rate of the slowest link in the ring."""
        if nbytes <= 0 or gpus <= 1:
            return 0.0
        steps = 2 * (gpus - 1)
        return (steps * self.p2p_latency_s
                + steps / gpus * nbytes / self.link_bytes_per_s(link)) * 1e9

    def host_ns(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        return (self.host_latency_s + nbytes / self.pcie_bytes_per_s) * 1e9

    @property
    def usable_bytes(self) -> int:
        """What the caching allocator may reserve: the device memory less the context."""
        return int(self.memory_bytes - self.cost.context_bytes)

    def to_meta(self, num_gpus: int) -> dict[str, Any]:
        """The `target` dict of the profile (JSON-safe): the contract's IPU keys with GPU
        meanings (num_ipus = GPUs, no tiles, clock 1 GHz = ns) plus the GPU figures."""
        meta: dict[str, Any] = {k: v for k, v in asdict(self).items()
                                if k not in ("sources", "cost")}
        meta.update(self.cost.to_dict())
        meta.update({"family": GPU_FAMILY, "num_ipus": int(num_gpus), "num_gpus": int(num_gpus),
                     "tiles_per_ipu": 0, "bytes_per_tile": 0,
                     "usable_bytes": self.usable_bytes})
        return meta


_DS_H100 = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com, 2023): "
_DGX_H100 = ("published: NVIDIA DGX H100 datasheet: 8x single-port ConnectX-7 VPI, 400 Gb/s "
             "InfiniBand / Ethernet, one per GPU; 50 GB/s each direction")
_DS_A100 = "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com, 2021): "
_FIXTURE = ("measured: totalGlobalMem of 'NVIDIA H100 80GB HBM3' in the deviceProperties of "
            "tests/fixtures/kineto_resnet50_b64.json.gz (85,017,493,504 B)")
_ASSUMED = {
    "gpus_per_node": "published: 8 GPUs per DGX / HGX server (NVIDIA DGX A100 and DGX H100 "
                     "datasheets)",
    "p2p_latency_s": "assumed: 5 us per NCCL send/recv (nccl-tests small-message latency "
                     "order; no datasheet figure)",
    "host_latency_s": "assumed: 10 us per host <-> device copy",
}

H100_SXM = GpuTarget(
    name="h100", description="NVIDIA H100 SXM5 80GB (HBM3)",
    memory_bytes=85_017_493_504, hbm_bytes_per_s=3.35 * TB,
    fp32_flops=67e12, tf32_flops=494.5e12, bf16_flops=989.5e12, fp8_flops=1979e12,
    nvlink_bytes_per_s=450 * GB, pcie_bytes_per_s=64 * GB, sms=132,
    network_bytes_per_s=50 * GB,
    sources={
        "memory_bytes": _FIXTURE + "; datasheet: 80 GB",
        "network_bytes_per_s": _DGX_H100,
        "hbm_bytes_per_s": _DS_H100 + "H100 SXM GPU memory bandwidth 3.35 TB/s",
        "fp32_flops": _DS_H100 + "FP32 67 teraFLOPS",
        "tf32_flops": _DS_H100 + "TF32 Tensor Core 989 TFLOPS with sparsity; dense = half",
        "bf16_flops": _DS_H100 + "BF16 / FP16 Tensor Core 1,979 TFLOPS with sparsity; "
                                 "dense = half",
        "fp8_flops": _DS_H100 + "FP8 Tensor Core 3,958 TFLOPS with sparsity; dense = half",
        "nvlink_bytes_per_s": _DS_H100 + "NVLink 900 GB/s (both directions); 450 GB/s each",
        "pcie_bytes_per_s": _DS_H100 + "PCIe Gen5 128 GB/s (both directions); 64 GB/s each",
        "sms": "published: 132 SMs (numSms of the fixture's deviceProperties)",
        "sm_clock_hz": "derived: FP32 67 TFLOPS / (132 SMs x 128 FMA x 2) = 1.98 GHz, the "
                       "boost clock nvidia-smi reports as clocks.max.sm on the H200 (same GPU)",
        "nvlink_gpus": "published: 8 GPUs per HGX H100 board, all joined by NVLink / NVSwitch "
                       "(NVIDIA HGX H100 product page)",
        **_ASSUMED})

H100_PCIE = GpuTarget(
    name="h100-pcie", description="NVIDIA H100 PCIe 80GB (HBM2e)",
    memory_bytes=85_017_493_504, hbm_bytes_per_s=2.0 * TB,
    fp32_flops=51e12, tf32_flops=378e12, bf16_flops=756e12, fp8_flops=1513e12,
    nvlink_bytes_per_s=300 * GB, pcie_bytes_per_s=64 * GB, sms=114, sm_clock_hz=1.755e9,
    nvlink_gpus=2,
    network_bytes_per_s=25 * GB,
    sources={
        "network_bytes_per_s": "assumed: one 200 Gb/s InfiniBand / RoCE NIC per GPU (servers "
                               "of PCIe cards vary); 25 GB/s each direction",
        "memory_bytes": "derived: 80 GB as the SXM part (its totalGlobalMem, see h100)",
        "hbm_bytes_per_s": _DS_H100 + "H100 PCIe GPU memory bandwidth 2 TB/s",
        "fp32_flops": _DS_H100 + "FP32 51 teraFLOPS",
        "tf32_flops": _DS_H100 + "TF32 Tensor Core 756 TFLOPS with sparsity; dense = half",
        "bf16_flops": _DS_H100 + "BF16 / FP16 Tensor Core 1,513 TFLOPS with sparsity; "
                                 "dense = half",
        "fp8_flops": _DS_H100 + "FP8 Tensor Core 3,026 TFLOPS with sparsity; dense = half",
        "nvlink_bytes_per_s": _DS_H100 + "NVLink bridge 600 GB/s (both directions); 300 each",
        "pcie_bytes_per_s": _DS_H100 + "PCIe Gen5 128 GB/s (both directions); 64 GB/s each",
        "sms": "published: 114 SMs (NVIDIA Hopper architecture whitepaper)",
        "sm_clock_hz": "derived: FP32 51 TFLOPS / (114 SMs x 128 FMA x 2) = 1.75 GHz",
        "nvlink_gpus": "published: the NVLink bridge joins two H100 PCIe cards " + "(" +
                       _DS_H100.strip(": ") + ")",
        **_ASSUMED})

_DS_H200 = "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com, 2024): "
H200_SXM = GpuTarget(
    name="h200", description="NVIDIA H200 SXM 141GB (HBM3e)",
    memory_bytes=150_109_880_320, hbm_bytes_per_s=4.8 * TB,
    fp32_flops=67e12, tf32_flops=494.5e12, bf16_flops=989.5e12, fp8_flops=1979e12,
    nvlink_bytes_per_s=450 * GB, pcie_bytes_per_s=64 * GB, sms=132,
    network_bytes_per_s=50 * GB,
    sources={
        "network_bytes_per_s": "published: NVIDIA DGX H200 datasheet: 8x single-port "
                               "ConnectX-7 VPI, 400 Gb/s InfiniBand / Ethernet, one per GPU; "
                               "50 GB/s each direction",
        "memory_bytes": "measured: total_memory of 'NVIDIA H200' (torch.cuda."
                        "get_device_properties, bench/data/gpu_measured_h200.json); "
                        "datasheet: 141 GB",
        "hbm_bytes_per_s": _DS_H200 + "GPU memory bandwidth 4.8 TB/s",
        "fp32_flops": _DS_H200 + "FP32 67 TFLOPS (the H100 SXM's Hopper GPU)",
        "tf32_flops": _DS_H200 + "TF32 Tensor Core 989 TFLOPS with sparsity; dense = half",
        "bf16_flops": _DS_H200 + "BF16 / FP16 Tensor Core 1,979 TFLOPS with sparsity; "
                                 "dense = half",
        "fp8_flops": _DS_H200 + "FP8 Tensor Core 3,958 TFLOPS with sparsity; dense = half",
        "nvlink_bytes_per_s": _DS_H200 + "NVLink 900 GB/s (both directions); 450 GB/s each",
        "pcie_bytes_per_s": _DS_H200 + "PCIe Gen5 128 GB/s (both directions); 64 GB/s each",
        "sms": "measured: 132 multiprocessors (bench/data/gpu_measured_h200.json)",
        "sm_clock_hz": "measured: clocks.max.sm 1980 MHz, and 1980 MHz under load "
                       "(nvidia-smi, bench/data/gpu_kernel_paths_h200.json)",
        "nvlink_gpus": "published: 8 GPUs per HGX H200 board joined by NVLink / NVSwitch "
                       "(NVIDIA HGX product page)",
        **_ASSUMED})

A100_80GB = GpuTarget(
    name="a100", description="NVIDIA A100 SXM4 80GB (HBM2e)",
    memory_bytes=85_198_045_184, hbm_bytes_per_s=2.039 * TB,
    fp32_flops=19.5e12, tf32_flops=156e12, bf16_flops=312e12, fp8_flops=0.0,
    nvlink_bytes_per_s=300 * GB, pcie_bytes_per_s=32 * GB, sms=108, sm_clock_hz=1.41e9,
    network_bytes_per_s=25 * GB,
    sources={
        "network_bytes_per_s": "published: NVIDIA DGX A100 datasheet: 8x single-port "
                               "Mellanox ConnectX-6 VPI, 200 Gb/s HDR InfiniBand, one per "
                               "GPU; 25 GB/s each direction",
        "memory_bytes": "derived: 80 GiB less the driver's reservation, as CUDA reports an "
                        "A100-SXM4-80GB (85,198,045,184 B)",
        "hbm_bytes_per_s": _DS_A100 + "A100 80GB SXM GPU memory bandwidth 2,039 GB/s",
        "fp32_flops": _DS_A100 + "FP32 19.5 TFLOPS",
        "tf32_flops": _DS_A100 + "Tensor Float 32 156 TFLOPS (312 with sparsity)",
        "bf16_flops": _DS_A100 + "BFLOAT16 / FP16 Tensor Core 312 TFLOPS (624 with sparsity)",
        "fp8_flops": "published: none (Ampere has no FP8 tensor cores)",
        "nvlink_bytes_per_s": _DS_A100 + "NVLink 600 GB/s (both directions); 300 GB/s each",
        "pcie_bytes_per_s": _DS_A100 + "PCIe Gen4 64 GB/s (both directions); 32 GB/s each",
        "sms": "published: 108 SMs (NVIDIA A100 Tensor Core GPU architecture whitepaper)",
        "sm_clock_hz": "published: 1410 MHz boost clock (A100 architecture whitepaper); "
                       "FP32 19.5 TFLOPS / (108 SMs x 64 FMA x 2) agrees",
        "nvlink_gpus": "published: 8 GPUs per HGX A100 board joined by NVSwitch (NVIDIA "
                       "HGX A100 product page)",
        **_ASSUMED})

GPU_TARGETS: dict[str, GpuTarget] = {t.name: t for t in (H100_SXM, H100_PCIE, H200_SXM,
                                                          A100_80GB)}
GPU_ALIASES = {"h100-sxm": "h100", "h100_sxm": "h100", "h100_pcie": "h100-pcie",
               "a100-80gb": "a100", "a100_80gb": "a100", "a100-sxm": "a100",
               "h200-sxm": "h200", "h200_sxm": "h200"}


LINKS = ("nvlink", "pcie", "network")  # fastest first


def link_name(link: bool | str) -> str:
    """True -> "nvlink", False -> "pcie", a name as it is (a ValueError otherwise)."""
    if isinstance(link, bool):
        return "nvlink" if link else "pcie"
    if link not in LINKS:
        raise ValueError(f"unknown GPU link {link!r}; valid: {', '.join(LINKS)}")
    return link


def family_of(target: Any) -> str:
    """'gpu' for a GpuTarget, a target meta dict naming that family, else 'ipu'."""
    if isinstance(target, GpuTarget):
        return GPU_FAMILY
    if isinstance(target, dict):
        return str(target.get("family") or IPU_FAMILY)
    return str(getattr(target, "family", IPU_FAMILY))


def is_gpu(target: Any) -> bool:
    return family_of(target) == GPU_FAMILY
