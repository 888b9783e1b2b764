"""What a GPU holds: the weights, the activations of a forward and the KV cache it leaves room for,
with and without pipeline stages (a mixin of `RooflineCostModel`, which sets model, hw, tp, ep,
linear_params, expert_params, weight_bytes and kv_bytes_per_token). Under expert parallelism a
GPU holds its layers' attention and dense weights (/tp), 1/ep of the routed experts (/tp), and
the KV of its group's requests: the engine's KV pool is ep times one GPU's blocks."""
from __future__ import annotations

# vLLM's default max_num_seqs: its memory profile holds this many rows of fp32 full-vocab logits.
_MAX_SAMPLED_ROWS = 256


def stage_layers(num_layers: int, stages: int) -> list[int]:
    """The layers of each pipeline stage, as vLLM partitions them (get_pp_indices in
    vllm/distributed/utils.py): num_layers // stages each, and the remainder one more each on
    the stages before the last, from the last but one backwards (the last stage also holds the
    final norm and the LM head; with stages > 2 and a small remainder, the middle ones)."""
    if not 1 <= stages <= num_layers:
        raise ValueError(f"pipeline_parallel={stages}: must be between 1 and the model's "
                         f"{num_layers} layers")
    parts = [num_layers // stages] * stages
    for i in range(2, num_layers % stages + 2):
        parts[-i] += 1
    return parts


class RooflineMemory:
    """KV capacity of one GPU of the group (and of every pipeline stage)."""

    def activation_bytes(self, num_tokens: int) -> float:
        """Transient memory of one forward over num_tokens tokens: residual and normed input,
        QKV, the MLP's gate/up output and activation, plus sampled logits in fp32."""
        m = self.model
        mlp = m.intermediate_size if not m.is_moe else max(
            m.intermediate_size if m.first_dense_layers else 0,
            m.num_experts_per_tok * m.moe_intermediate_size + m.shared_expert_intermediate_size)
        per_tok = 2 * m.hidden_size + (self.heads + 2 * self.kv_heads) * m.head_dim \
            + 3 * mlp / self.tp
        return num_tokens * m.dtype_bytes * per_tok + _MAX_SAMPLED_ROWS * m.vocab_size * 4

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len

    def kv_block_bytes(self, block_size: int) -> int:
        return int(block_size * self.kv_bytes_per_token)

    def num_kv_blocks(self, block_size: int, gpu_memory_utilization: float = 0.9,
                      workspace_bytes: float = 2**30, activation_tokens: int = 8192,
                      draft=None, draft_key: str = "executor.draft") -> int:
        """`draft`: the roofline of a separate draft model (speculative decoding) that each GPU
        holds beside this one: its weights, and its KV in every block (the torch executor lays
        its cache out as the target's, through the same block tables). Its activations are
        not added: the two forwards do not run at once, and the target's are the larger."""
        m, hw = self.model, self.hw
        usable = hw.memory_bytes * gpu_memory_utilization
        reserve = workspace_bytes + self.activation_bytes(activation_tokens)
        gib = 2**30
        beside = draft.weight_bytes if draft is not None else 0
        if beside and self.weight_bytes + reserve < usable <= self.weight_bytes + beside + reserve:
            raise ValueError(
                f"{draft_key}={draft.model.name}: the draft's weights ({beside / gib:.1f} GiB per "
                f"GPU) do not fit beside {m.name}'s ({self.weight_bytes / gib:.1f} GiB) and "
                f"{reserve / gib:.1f} GiB of activations/workspace on {hw.name} at "
                f"tensor_parallel={self.tp}: gpu_memory_utilization={gpu_memory_utilization} of "
                f"{hw.memory_bytes / gib:.1f} GiB leaves {usable / gib:.1f} GiB (choose a smaller "
                "draft, layers:N, which shares the target's weights and KV, or a larger "
                "tensor_parallel)")
        if self.weight_bytes + reserve >= usable:
            need_tp = self.tp
            while need_tp < 64 and self.weight_bytes * self.tp / need_tp + reserve >= usable:
                need_tp *= 2
            layout = f"tensor_parallel={self.tp}" + (
                f" expert_parallel={self.ep}" if self.ep > 1 else "")
            # a MoE model's experts can also be split over expert-parallel groups
            hint = f"try tensor_parallel={need_tp}" + (
                ", or executor.expert_parallel (parallel=tp1ep2, tp1ep4, tp1ep8, tp2ep4)"
                if m.is_moe else "")
            raise ValueError(
                f"{m.name} does not fit on {hw.name} at {layout}: weights take "
                f"{self.weight_bytes / gib:.1f} GiB per GPU plus {reserve / gib:.1f} GiB of "
                f"activations/workspace, but gpu_memory_utilization={gpu_memory_utilization} "
                f"of {hw.memory_bytes / gib:.1f} GiB leaves {usable / gib:.1f} GiB ({hint})")
        # with expert parallelism each of the ep groups keeps its own requests' KV
        per_token = self.kv_bytes_per_token + (draft.kv_bytes_per_token if draft else 0)
        blocks = int((usable - self.weight_bytes - beside - reserve)
                     // (block_size * per_token)) * self.ep
        if blocks < 1:
            raise ValueError(f"{m.name} on {hw.name} at tensor_parallel={self.tp}: no room for "
                             f"one KV block of {block_size} tokens"
                             + (f" beside the draft ({draft_key}={draft.model.name})"
                                if draft is not None else ""))
        return blocks

    def pipeline_kv_blocks(self, layers: list[int], block_size: int,
                           gpu_memory_utilization: float = 0.9, workspace_bytes: float = 2**30,
                           activation_tokens: int = 8192) -> int:
        """KV blocks of `block_size` tokens that fit every stage of a pipeline whose stages hold
        `layers` layers each: a GPU of a stage holds its layers' weights (/tp), the embedding
        on the first stage and the final norm and LM head on the last (a tied embedding is
        loaded on both, as vLLM does), the same workspace and activations as without stages,
        and a block holds the KV of its stage's layers only. The fewest over the stages (vLLM
        takes the smallest cache any worker can hold)."""
        m, hw = self.model, self.hw
        L, P, h = m.num_layers, len(layers), m.hidden_size
        assert P > 1 and sum(layers) == L, (layers, L)
        # a MoE model's layers averaged (DeepSeek's first dense layer is taken as any other)
        per_layer = self.linear_params + self.expert_params / L + 2 * h
        vocab = m.vocab_size * h / self.tp
        # bytes per weight element: the whole model's weights over its elements (its dtypes)
        per_param = self.weight_bytes / (L * per_layer + h
                                         + vocab * (1 if m.tie_word_embeddings else 2))
        usable = hw.memory_bytes * gpu_memory_utilization
        reserve = workspace_bytes + self.activation_bytes(activation_tokens)
        gib = 2**30
        fewest = None
        for s, n in enumerate(layers):
            first, last = s == 0, s == P - 1
            weights = per_param * (n * per_layer + (h if last else 0) + vocab * (first + last))
            if weights + reserve >= usable:
                raise ValueError(
                    f"{m.name} does not fit on {hw.name} at tensor_parallel={self.tp} "
                    f"pipeline_parallel={P}: stage {s} ({n} layers) takes {weights / gib:.1f} "
                    f"GiB of weights per GPU plus {reserve / gib:.1f} GiB of activations/"
                    f"workspace, but gpu_memory_utilization={gpu_memory_utilization} of "
                    f"{hw.memory_bytes / gib:.1f} GiB leaves {usable / gib:.1f} GiB (try more "
                    "pipeline stages or a larger tensor_parallel)")
            blocks = int((usable - weights - reserve)
                         // (block_size * self.kv_bytes_per_token * n / L)) * self.ep
            fewest = blocks if fewest is None else min(fewest, blocks)
        if fewest < 1:
            raise ValueError(f"{m.name} on {hw.name} at tensor_parallel={self.tp} "
                             f"pipeline_parallel={P}: no room for one KV block of {block_size} "
                             "tokens")
        return fewest

