"""Mixture-of-experts layers in the roofline: routed experts by tokens per expert, the weights of
the experts a batch touches, and expert parallelism's all-to-all (a part of `RooflineCostModel`).

An MoE layer (models/shape.py) is a router (h x E, replicated on every GPU), E routed SwiGLU
experts of width I_e (top-k per token), optional shared experts of total width I_s (dense: every
token) and, in DeepSeek-MoE, leading layers with a dense MLP. The router, the shared experts and
the dense MLPs are priced with the attention projections as dense linear layers (model.py); the
routed experts here:

  experts(T) = soft(F, M) over the L_moe MoE layers, per GPU of the busiest expert-parallel group
    F = 2 x (T k / ep) x rho x 3 h I_e / tp / (peak ce)        FLOPs of its tokens' assignments
    M = b_w x touched(T) x 3 h I_e / tp / (bw me)              weights of the experts it reads
    touched(T) = (E / ep) x (1 - (1 - k/E)^T)

  T tokens make T k assignments. Under uniform routing a token picks a given expert with
  probability k/E, so an expert is missed by all T tokens with probability (1 - k/E)^T (tokens
  independent), and E (1 - (1 - k/E)^T) experts are expected to be read: a decode batch of 1
  reads k experts' weights, a large batch all E. (Top-k picks k distinct experts, so the per-token
  events are not independent across experts, but each expert's marginal is exactly k/E, and the
  expectation is a sum of marginals: the formula is exact in expectation.) The soft roofline of
  equal per-expert GEMMs is the soft roofline of their sums (it is homogeneous of degree 1).
  rho = moe_imbalance >= 1: the busiest group's assignments over the mean (routing is never
  perfectly balanced; 1 with one group). Elementwise work per assignment (SiLU x mul of the
  expert, and the permute/unpermute of the token's hidden state) is in model.py's elementwise.

Expert parallelism (executor.expert_parallel = ep): a stage's GPUs are ep groups of tp. Each group
holds E/ep of the experts (each sharded over its tp GPUs) and a copy of everything else, and runs
attention data-parallel: the batch's requests are spread over the groups (ASSUMPTION: evenly; a
batch that cannot split evenly, e.g. one decode on 8 groups, is priced low in its per-token terms,
which a decode's weight reads dominate), each group with its own KV cache (the engine's KV pool is
the groups' sum). This is the layout of vLLM's data-parallel attention with --enable-expert-
parallel and of SGLang's DP attention; ep = 1 is plain tensor parallelism (every expert on every
GPU, sharded tp ways). Each MoE layer then moves every assignment whose expert lives in another
group there and back (dispatch and combine, all-to-all):

  all_to_all(T) = 2 L_moe x (latency + (T/ep) k rho (ep-1)/ep h b / tp / (bandwidth eff))

over NVLink within a node (the TP all-reduce's link_bandwidth, link_eff and link_latency_s), over
the NICs (net_bandwidth, net_eff, net_latency_s) for the groups on other nodes (each GPU sends
its 1/tp slice of a token's hidden state; ASSUMPTION: no deduplication of a token's k copies
bound for one group, as in vLLM's naive all-to-all). Nothing in the expert groups overlaps the
all-to-all (no two-batch overlap).
"""
from __future__ import annotations


def touched_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts `tokens` tokens route to, each picking `top_k` of
    `num_experts` uniformly: E (1 - (1 - k/E)^T)."""
    if tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def check_layout(model, expert_parallel: int, imbalance: float | None) -> None:
    """Expert parallelism needs experts to split: a dense model, or a degree that does not
    divide the experts, is refused; an imbalance is read only with more than one group."""
    ep = expert_parallel
    if ep > 1 and not model.is_moe:
        raise ValueError(f"expert_parallel={ep}: model {model.name!r} is dense (num_experts=0: "
                         "no experts to split); expert parallelism needs a mixture-of-experts "
                         "model")
    if model.is_moe and model.num_experts % ep:
        raise ValueError(f"expert_parallel={ep}: must divide model {model.name!r}'s "
                         f"num_experts={model.num_experts}")
    if imbalance is not None:
        if ep == 1:
            raise ValueError(f"moe_imbalance={imbalance}: read only with expert_parallel > 1 "
                             "(the busiest group's load over the mean; one group has none)")
        if not 1 <= imbalance <= ep:
            raise ValueError(f"moe_imbalance={imbalance}: must be between 1 (balanced) and "
                             f"expert_parallel={ep} (every assignment on one group)")


class MoeCost:
    """The routed experts' terms of one GPU (seconds, whole model), precomputed."""

    def __init__(self, model, hw, tp: int, ep: int, imbalance: float, b: int, b_w: int,
                 gemm_flops: float):
        m = model
        self.E, self.k, self.ep, self.rho = m.num_experts, m.num_experts_per_tok, ep, imbalance
        self.layers = m.moe_layers
        h = m.hidden_size
        self.expert_params = 3 * h * m.moe_intermediate_size / tp    # one expert, one GPU
        self.local_experts = m.num_experts // ep
        #: routed experts' weights held by one GPU, all layers
        self.params = self.layers * self.local_experts * self.expert_params
        bw = hw.mem_bandwidth * hw.mem_eff
        self.n, self.inv_n = hw.ridge_exponent, 1.0 / hw.ridge_exponent
        # per token of the batch: its k assignments, 1/ep of them on this group, times rho
        self.per_token = self.layers * 2 * self.k / ep * imbalance * self.expert_params \
            / (gemm_flops * hw.compute_eff)
        self.per_expert_read = self.layers * b_w * self.expert_params / bw
        self.a2a_fixed, self.a2a_per_token = all_to_all_terms(
            hw, tp, ep, self.layers, self.k * imbalance * h * b / tp)

    def experts_time(self, T: int) -> float:
        if T <= 0:
            return 0.0
        memory = touched_experts(self.E, self.k, T) / self.ep * self.per_expert_read
        x = T * self.per_token / memory
        return memory * (1.0 + x ** self.n) ** self.inv_n

    def all_to_all_time(self, T: int) -> float:
        return self.a2a_fixed + T * self.a2a_per_token if T > 0 and self.ep > 1 else 0.0


def all_to_all_terms(hw, tp: int, ep: int, moe_layers: int,
                     assignment_bytes: float) -> tuple[float, float]:
    """(fixed s, s per token of the batch) of an iteration's 2 L_moe all-to-alls (dispatch,
    combine) among ep groups of tp GPUs, each GPU sending `assignment_bytes` per token of its
    group (k assignments x rho x h b / tp) spread evenly over the groups; 0 at ep 1. The groups
    on this node (gpus_per_node / tp of them) exchange over NVLink, the rest over the NICs, both
    at once: the slower of the two sets the time."""
    if ep == 1:
        return 0.0, 0.0
    local = max(1, min(ep, hw.gpus_per_node // tp))     # groups sharing this GPU's node
    n = 2 * moe_layers
    per_token = assignment_bytes / ep                   # this group's share of the batch
    on_node = per_token * (local - 1) / ep / (hw.link_bandwidth * hw.link_eff)
    off_node = per_token * (ep - local) / ep / (hw.net_bandwidth * hw.net_eff)
    latency = hw.link_latency_s if local == ep else max(hw.link_latency_s, hw.net_latency_s)
    return n * latency, n * max(on_node, off_node)
