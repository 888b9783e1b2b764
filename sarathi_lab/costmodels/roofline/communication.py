"""Collectives between GPUs: the tensor-parallel all-reduce, and the pipeline stages' send/recv and
all-gather. Every constant is a preset's (configs/hardware/*.yaml, with its source there).

All-reduce of m bytes over p GPUs of one NVLink/NVSwitch node, the cheaper of

  ring (NCCL)     link_latency + 2 (p-1) ar_step_latency + 2 (p-1)/p m / (link_bw link_eff)
                  (reduce-scatter then all-gather: 2 (p-1) steps, each moving m/p per GPU)
  one-shot        fast_ar_latency + (p-1) fast_ar_peer_latency + 2 (p-1)/p m / (link_bw fast_ar_eff)
  (vLLM custom)   (one kernel; small messages, where NCCL's launch and protocol latency dominate)

Both latencies and efficiencies are fitted by experiments/calibration/calibrate_roofline.py: the
ring to Vidur's NCCL all-reduce profiles (one DGX node, p = 2, 4, 8, 2 KiB - 64 MiB), the one-shot
to the vLLM custom all-reduce table of sglang PR #2904 (H100, p = 2, 4, 8). NCCL's tree algorithm
is for multi-node groups; a tensor-parallel group here is one node.
"""
from __future__ import annotations


def allreduce_terms(hw, tp: int, num_layers: int, token_bytes: float) -> tuple[float, ...]:
    """(ring fixed s, ring s per token, one-shot fixed s, one-shot s per token) of an iteration's
    2 L all-reduces (after attention's O projection and the MLP's down projection) of
    `token_bytes` per token each; all 0 at tp 1."""
    if tp == 1:
        return 0.0, 0.0, 0.0, 0.0
    n = 2 * num_layers
    moved = n * 2 * (tp - 1) / tp * token_bytes / hw.link_bandwidth   # s per token at link speed
    ring_fixed = n * (hw.link_latency_s + 2 * (tp - 1) * hw.ar_step_latency_s)
    fast_fixed = n * (hw.fast_ar_latency_s + (tp - 1) * hw.fast_ar_peer_latency_s)
    return ring_fixed, moved / hw.link_eff, fast_fixed, moved / hw.fast_ar_eff


def send_recv_terms(hw, token_bytes: float, across_nodes: bool) -> tuple[float, float]:
    """(latency, seconds per token) of a stage handing `token_bytes` per token to the next, over
    NVLink within a node, over a NIC across nodes (fitted to Vidur's send_recv profiles by
    experiments/pipeline/calibrate_send_recv.py)."""
    if across_nodes:
        return hw.net_p2p_latency_s, token_bytes / (hw.net_bandwidth * hw.net_p2p_eff)
    return hw.p2p_latency_s, token_bytes / (hw.link_bandwidth * hw.p2p_eff)


def gather_terms(hw, tp: int, token_bytes: float) -> tuple[float, float]:
    """(latency, seconds per token) of a ring all-gather of `token_bytes` per token over a TP
    group: (tp-1)/tp of the bytes at the ring all-reduce's latency and bus bandwidth (an
    ASSUMPTION: NCCL's all-gather moves half the bytes of an all-reduce at the same speed)."""
    if tp == 1:
        return 0.0, 0.0
    return hw.link_latency_s, (tp - 1) / tp * token_bytes / (hw.link_bandwidth * hw.link_eff)
