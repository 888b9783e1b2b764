"""The roofline's inputs: a GPU preset (`HardwareSpec`, configs/hardware/*.yaml) and the cost
model's settings (`RooflineConfig`: overrides of the preset's fitted terms, quantization)."""
from __future__ import annotations

from dataclasses import dataclass

from sarathi_lab.costmodels.base import CostModelConfig
from sarathi_lab.models.dtypes import dtype_name
from sarathi_lab.settings import ConfigError, parse, plain, setting


@dataclass(frozen=True)
class HardwareSpec:
    """A GPU preset (configs/hardware/*.yaml). The peaks come from datasheets; the efficiencies,
    the ridge exponent and the floors are fitted by experiments/calibration/calibrate_roofline.py
    (defaults: roughly the A100 fit, for a preset that leaves them out; the per-request and
    one-shot all-reduce terms default to what leaves them out of the sum)."""
    name: str = setting(help="label")
    peak_flops: float = setting(gt=0, help="dense bf16 tensor-core FLOP/s")
    mem_bandwidth: float = setting(gt=0, help="HBM bytes/s")
    memory_bytes: float = setting(gt=0, help="GPU memory, bytes")
    link_bandwidth: float = setting(gt=0, help="GPU-to-GPU bytes/s, one direction")
    link_latency_s: float = setting(ge=0, help="per ring (NCCL) all-reduce, and per transfer "
                                    "between GPUs (disaggregated pools, all-gathers)")
    # 8-bit GEMMs (executor.weight_dtype=fp8 / int8 with 8-bit activations); null: the GPU has
    # no such tensor cores (A100: no fp8)
    peak_flops_fp8: float | None = setting(None, gt=0, help="dense fp8 tensor-core FLOP/s")
    peak_flops_int8: float | None = setting(None, gt=0, help="dense int8 tensor-core OP/s")
    # links beyond NVLink, for KV moved to host memory (swap) or to another node (disaggregated
    # prefill/decode): a transfer of B bytes takes latency + B / (bandwidth * eff)
    pcie_bandwidth: float = setting(32.0e9, gt=0, help="GPU-host bytes/s, one direction")
    pcie_eff: float = setting(0.8, gt=0, le=1, help="share of pcie_bandwidth a pinned copy gets")
    pcie_latency_s: float = setting(1.0e-5, ge=0, help="per GPU-host copy")
    # vLLM refuses a swap space (per GPU, times the node's GPUs) above 70% of the host's memory
    host_memory_bytes: float = setting(2.0e12, gt=0, help="host (CPU) memory of one node, "
                                       "bytes: bounds the swap space (DGX: 2 TB)")
    net_bandwidth: float = setting(25.0e9, gt=0,
                                   help="inter-node bytes/s per GPU (its NIC), one direction")
    net_eff: float = setting(0.9, gt=0, le=1, help="share of net_bandwidth an RDMA write gets")
    net_latency_s: float = setting(1.0e-5, ge=0, help="per inter-node transfer")
    compute_eff: float = setting(0.71, gt=0, le=1, help="achieved share of peak_flops in GEMMs")
    mem_eff: float = setting(0.81, gt=0, le=1,
                             help="achieved share of mem_bandwidth reading weights, activations")
    ridge_exponent: float = setting(
        1.5, ge=1, le=64, help="GEMM time = (F^n + M^n)^(1/n) of its compute time F and memory "
        "time M: 1 adds them, large n is the hard max(F, M)")
    attn_eff: float = setting(0.28, gt=0, le=1, help="achieved share of peak_flops in attention "
                              "over cached context (a chunk's queries x earlier tokens; decodes)")
    attn_self_eff: float | None = setting(
        None, gt=0, le=1, help="achieved share of peak_flops in attention within a prefill "
        "chunk (its causal c (c + 1) / 2 query-key pairs); null: attn_eff")
    attn_kv_eff: float = setting(0.91, gt=0, le=1,
                                 help="achieved share of mem_bandwidth reading KV in attention")
    link_eff: float = setting(0.51, gt=0, le=1, help="share of link_bandwidth, ring all-reduce")
    ar_step_latency_s: float = setting(
        0.0, ge=0, help="per step of a ring all-reduce (2 (tp-1) steps), beside link_latency_s")
    fast_ar_latency_s: float = setting(
        1.0, ge=0, help="per one-shot (custom, latency-bound) all-reduce; the cheaper of it and "
        "the ring is charged (default 1 s: never cheaper, ring only)")
    fast_ar_eff: float = setting(0.11, gt=0, le=1,
                                 help="share of link_bandwidth, one-shot all-reduce")
    fast_ar_peer_latency_s: float = setting(
        0.0, ge=0, help="per peer (tp-1) of a one-shot all-reduce, beside fast_ar_latency_s")
    iteration_overhead_s: float = setting(
        1.4e-3, ge=0, help="CPU side of an iteration: scheduling, input preparation, sampling, "
        "output processing (vLLM v0 measured by Vidur: 1.4 ms + 0.1 ms per request)")
    request_overhead_s: float = setting(0.0, ge=0,
                                        help="CPU side of an iteration, per request in the batch")
    layer_overhead_s: float = setting(5.1e-5, ge=0, help="GPU kernel floors per layer")
    price_per_gpu_hour: float | None = setting(None, gt=0, help="USD, for the run's cost "
                                               "figures; null: none")
    # pipeline stages (executor.pipeline_parallel): the activations a stage hands to the next go
    # by an NCCL send/recv, latency + bytes / (bandwidth * eff), over NVLink (link_bandwidth)
    # within a node and over the node's NICs (net_bandwidth) across nodes; fitted to Vidur's
    # send_recv profiles by experiments/pipeline/calibrate_send_recv.py
    gpus_per_node: int = setting(8, ge=1, le=1024, help="GPUs sharing one NVLink domain (DGX: 8)")
    p2p_eff: float = setting(0.96, gt=0, le=1, help="share of link_bandwidth, send/recv")
    p2p_latency_s: float = setting(1.3e-5, ge=0, help="per send/recv within a node")
    net_p2p_eff: float = setting(0.31, gt=0, le=1, help="share of net_bandwidth, send/recv")
    net_p2p_latency_s: float = setting(2.9e-5, ge=0, help="per send/recv across nodes")

    @classmethod
    def from_config(cls, cfg, overrides=None) -> "HardwareSpec":
        """`overrides` (the cost model's settings) replaces efficiency factors it sets
        non-null; a preset's keys are checked like any setting (``hardware.<key>``)."""
        c = plain(cfg)
        for key, val in plain(overrides).items():
            if val is not None and key in cls.__dataclass_fields__:
                c[key] = val
        return parse(cls, c, "hardware", f"hardware preset {c.get('name')!r}")


@dataclass
class RooflineConfig(CostModelConfig):
    """Overrides of the hardware preset's fitted terms; null keeps the preset's (fitted by
    experiments/calibration/calibrate_roofline.py)."""
    compute_eff: float | None = setting(None, gt=0, le=1, help="share of peak FLOP/s in GEMMs")
    mem_eff: float | None = setting(None, gt=0, le=1, help="share of HBM bandwidth achieved")
    ridge_exponent: float | None = setting(None, ge=1, le=64,
                                           help="smoothness of the GEMM roofline (large: max)")
    attn_eff: float | None = setting(None, gt=0, le=1,
                                     help="share of peak FLOP/s in attention over cached context")
    attn_self_eff: float | None = setting(None, gt=0, le=1, help="share of peak FLOP/s in "
                                          "attention within a prefill chunk")
    attn_kv_eff: float | None = setting(None, gt=0, le=1,
                                        help="share of HBM bandwidth reading KV in attention")
    link_eff: float | None = setting(None, gt=0, le=1, help="share of link bandwidth, ring")
    fast_ar_latency_s: float | None = setting(None, ge=0,
                                              help="one-shot all-reduce latency")
    fast_ar_eff: float | None = setting(None, gt=0, le=1,
                                        help="share of link bandwidth, one-shot all-reduce")
    iteration_overhead_s: float | None = setting(
        None, ge=0, help="CPU side of an iteration (presets: vLLM v0 as measured by Vidur)")
    request_overhead_s: float | None = setting(
        None, ge=0, help="CPU side of an iteration per request in the batch (presets: vLLM v0)")
    layer_overhead_s: float | None = setting(None, ge=0, help="GPU kernel floors per layer")
    # quantized weights and KV (vLLM's --quantization fp8 / W8A8 int8 and --kv-cache-dtype)
    weight_dtype: str | None = setting(
        None, help="the linear layers' weights: null (model.dtype) | bfloat16 | float16 | fp8 | "
                   "int8; 8-bit weights run 8-bit GEMMs at the GPU's 8-bit peak (activations "
                   "quantized on the fly) unless weight_only")
    weight_only: bool | None = setting(
        None, help="true: 8-bit weights dequantised to model.dtype inside the GEMM, which runs at "
                   "the 16-bit peak (vLLM's FP8 Marlin on GPUs without fp8 tensor cores); null: "
                   "false")
    kv_cache_dtype: str | None = setting(None, help="the KV cache: null (model.dtype) | bfloat16 "
                                                    "| float16 | fp8: bytes read, written, held")
    # mixture-of-experts models (costmodels/roofline/moe.py)
    expert_parallel: int | None = setting(
        None, ge=1, le=64, help="expert-parallel groups of tensor_parallel GPUs per stage (GPUs: "
        "their product): each group holds 1/expert_parallel of the experts and runs attention "
        "data-parallel; all-to-all dispatch and combine between groups; null: 1, every expert on "
        "every GPU (> 1: MoE models only)")
    moe_imbalance: float | None = setting(
        None, ge=1, help="the busiest expert-parallel group's routed tokens over the mean "
        "(expert_parallel > 1); null: 1, balanced")

    def validate(self) -> None:
        for key, allowed in (("weight_dtype", _WEIGHT_DTYPES), ("kv_cache_dtype", _KV_DTYPES)):
            v = getattr(self, key)
            if v is not None:
                name = dtype_name(v, key)
                if name not in allowed:
                    raise ValueError(f"{key}={v!r}: must be null or one of {', '.join(allowed)}")
                setattr(self, key, name)
        if self.weight_only and self.weight_dtype not in ("float8", "int8"):
            raise ValueError(f"weight_only=true: needs 8-bit weights (weight_dtype=fp8 or int8), "
                             f"not weight_dtype={self.weight_dtype or 'null (model.dtype)'}")


_WEIGHT_DTYPES = ("float32", "bfloat16", "float16", "float8", "int8")
_KV_DTYPES = ("float32", "bfloat16", "float16", "float8")


def gemm_peak(hw: HardwareSpec, weight_dtype: str, weight_only: bool) -> float:
    """The tensor-core peak the linear layers' GEMMs run at: the 8-bit one for 8-bit weights
    with 8-bit activations (W8A8), else the 16-bit one (weight-only dequantisation is assumed
    free: fused into the GEMM's loads, as Marlin-style kernels do)."""
    if weight_dtype not in ("float8", "int8") or weight_only:
        return hw.peak_flops
    peak = hw.peak_flops_fp8 if weight_dtype == "float8" else hw.peak_flops_int8
    if peak is None:
        kind = "fp8" if weight_dtype == "float8" else "int8"
        raise ConfigError(
            f"executor.weight_dtype={kind}: {hw.name} has no {kind} tensor cores "
            f"(hardware.peak_flops_{kind} is null); set executor.weight_only=true ({kind} "
            "weights dequantised to 16 bits in the GEMM)"
            + (" or executor.weight_dtype=int8 (W8A8 int8)" if kind == "fp8"
               and hw.peak_flops_int8 else ""))
    return peak
