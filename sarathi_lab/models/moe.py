"""The sparse mixture-of-experts MLP of the paged-KV forward: Mixtral's and Qwen2-MoE's.

Each row (token) of the flattened batch is routed on its own: a linear router scores the
experts, a softmax over all of them gives probabilities, the top k are kept (renormalised over
the k when `norm_topk_prob`: Mixtral always, Qwen2-MoE by its config flag), and the row's
output is the weighted sum of those k experts' SwiGLU MLPs. Qwen2-MoE adds a shared expert that
every row goes through, scaled by a sigmoid gate of the row (`shared_expert_gate`; without it, as
DeepSeek's, the shared expert is added as it is).

Numerics follow Hugging Face's (softmax and the routing weights in fp32), so greedy decoding
equals ``transformers`` token for token. Module names mirror HF's ``mlp.gate``, ``mlp.experts``
(whose weights are stacked over the experts, gate and up fused, as transformers 5 keeps them),
``mlp.shared_expert`` and ``mlp.shared_expert_gate``; the loader maps the checkpoints' per-expert
tensors into the stacks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sarathi_lab.models.shape import ModelShape


class SwiGLU(nn.Module):
    """silu(gate(x)) * up(x), projected down: the dense MLP and the shared expert."""

    def __init__(self, hidden: int, inter: int, bias: bool = False):
        super().__init__()
        self.inter = inter
        # one matmul for gate and up (the loader concatenates the checkpoint's two)
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Experts(nn.Module):
    """The routed experts' weights, stacked: gate_up_proj [E, 2I, H] (gate rows first),
    down_proj [E, H, I]."""

    def __init__(self, num_experts: int, hidden: int, inter: int):
        super().__init__()
        self.inter = inter
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter))

    def forward(self, x, top_idx, top_w):
        """x [T, H]; top_idx, top_w [T, k]: each row's experts and their weights."""
        n_exp = self.gate_up_proj.shape[0]
        k = top_idx.shape[1]
        flat = top_idx.reshape(-1)
        # the (row, slot) pairs grouped by expert: one host sync for the counts per layer,
        # not one per expert
        order = flat.argsort(stable=True)
        rows = order // k
        weights = top_w.reshape(-1)[order, None]
        counts = torch.bincount(flat, minlength=n_exp).tolist()
        xs = x[rows]
        outs, start = [], 0
        for e, n in enumerate(counts):
            if n:
                h = xs[start:start + n]
                gate, up = F.linear(h, self.gate_up_proj[e]).split(self.inter, dim=-1)
                y = F.linear(F.silu(gate) * up, self.down_proj[e])
                # weights stay fp32 as HF's Mixtral keeps them: the product is cast once
                outs.append((y * weights[start:start + n]).to(x.dtype))
            start += n
        out = torch.zeros_like(x)
        # no rows (a step whose last layer keeps none: prompt chunks that sample nothing)
        return out.index_add_(0, rows, torch.cat(outs)) if outs else out


class SparseMoE(nn.Module):
    """Top-k routed experts, plus an optional shared expert (gated or not)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, expert_inter: int,
                 norm_topk_prob: bool, shared_inter: int = 0, shared_gate: bool = False):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok={top_k} must be between 1 and "
                             f"num_experts={num_experts}")
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = Experts(num_experts, hidden, expert_inter)
        self.shared_expert = SwiGLU(hidden, shared_inter) if shared_inter else None
        self.shared_expert_gate = (nn.Linear(hidden, 1, bias=False)
                                   if shared_inter and shared_gate else None)

    @classmethod
    def from_shape(cls, a: ModelShape) -> SparseMoE:
        return cls(a.hidden_size, a.num_experts, a.num_experts_per_tok,
                   a.moe_intermediate_size, a.norm_topk_prob,
                   a.shared_expert_intermediate_size, a.shared_expert_gate)

    def forward(self, x):
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        top_w, top_idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        out = self.experts(x, top_idx, top_w)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out


def is_moe_layer(a: ModelShape, layer: int) -> bool:
    """Whether `layer` has routed experts (DeepSeek's first layers keep a dense MLP)."""
    return a.is_moe and layer >= a.first_dense_layers
