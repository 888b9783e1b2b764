"""The draft model of the torch executor's speculative decoding (`executor.draft`).

``layers:N`` is a truncated-layer draft: the target's first N decoder layers, then the target's
final norm and LM head (a self-speculative, early-exit draft, as in LayerSkip or Draft & Verify).
It has no weights and no KV cache of its own: its layers *are* the target's first N layers, so
the KV it reads for the tokens before the step is exactly the KV the target wrote there, and the
KV it writes for its own proposals goes into the slots the policy allocated for the
verification's 1 + k positions. That is correct because the verification forward, in every
layer, writes the K/V of all its 1 + k rows into those same slots before it attends
(`models/llama.py`: write, then attend), so nothing the draft wrote is ever read by the target;
the draft only ever writes positions s .. s + k - 1 (s: the request's computed tokens), inside the
step's allocation; and after the step the request's computed tokens advance by 1 + accepted, so
the slots of rejected drafts hold KV past the request's length, which the next step overwrites
before reading (as any slot past `seq_lens`).

N = the target's number of layers makes the draft the target itself: every proposal is accepted,
which the tests use to check the sharing.

A model preset name (``tiny-llama``, a shipped `configs/model/` preset of the target's vocabulary)
is a separate draft model with seeded random weights (or `path`'s) and a KV cache of its own, laid
out as the target's and addressed through the same block tables (so it needs no allocator: a
block a request holds holds both models' KV of its tokens). The draft computes its KV lazily:
when a request first speculates its whole prefix is one draft chunk, and each later step first
catches up from where the draft's KV is still right (`valid`) to the request's last token.
"""
from __future__ import annotations

import torch

from sarathi_lab.executors.speculation import draft_layers
from sarathi_lab.settings import ConfigError


def check_draft(spec: str, temperature: float) -> None:
    """`executor.draft`'s form, and greedy decoding (the drafts are verified greedily)."""
    draft_layers(spec)
    if temperature > 0:
        raise ValueError(f"draft={spec!r} with temperature={temperature}: the drafts are "
                         "verified greedily (temperature 0 only)")


def require_draft(spec: str | None, k: int) -> None:
    """Start-up, with scheduler.num_speculative_tokens = k > 0: something must propose."""
    if spec is None:
        raise ConfigError(f"scheduler.num_speculative_tokens={k}: the torch executor needs a "
                          "draft model to propose the tokens: set executor.draft (layers:N, the "
                          "target's first N layers, or a model preset)")


class LayerDraft:
    """The target's first `num_layers` layers + its final norm and LM head, over the target's
    paged KV (see the module's docstring for why sharing it is correct)."""

    def __init__(self, model, spec: str):
        n, total = draft_layers(spec), model.args.num_layers
        if n > total:
            raise ConfigError(f"executor.draft={spec!r}: the model has {total} layers; the draft "
                              f"takes its first N, 1 <= N <= {total}")
        self.model, self.num_layers = model, n

    # it reads and writes the target's cache, through the target's attention metadata
    own_cache = False

    def start(self, req) -> int:
        """Where a request's first draft forward of a step starts: its last token (the KV
        before it is the target's, which is this draft's)."""
        return req.num_computed_tokens

    @torch.inference_mode()
    def __call__(self, input_ids, positions, meta, rows) -> torch.Tensor:
        """Logits [len(rows), vocab] in fp32 (each row proposes one token)."""
        m = self.model
        cos, sin = m.cos[positions][:, None], m.sin[positions][:, None]
        x = m.model.embed_tokens(input_ids)
        for layer in m.model.layers[:self.num_layers]:
            x = layer(x, cos, sin, meta, m.kernels)
        return m.lm_head(m.model.norm(x[rows])).float()

    def verified(self, req, start: int, k: int, accepted: int) -> None:
        """Nothing to track: the verification rewrote every slot the draft wrote."""

    def drop(self, request_ids) -> None:
        """Nothing kept per request."""


class ModelDraft:
    """A separate model (a model preset) as the draft, with its own KV cache in the target's
    block layout; `valid[request id]`: the tokens whose draft KV is right."""
    own_cache = True

    def __init__(self, spec: str, target, device, dtype, kernels):
        from sarathi_lab.executors.sim import model_preset
        from sarathi_lab.models.loader import load_model
        preset = model_preset(spec, "executor.draft")
        self.model = load_model(preset, device, dtype)
        a, t = self.model.args, target.args
        if a.vocab_size != t.vocab_size:
            raise ConfigError(f"executor.draft={spec!r}: its vocabulary of {a.vocab_size} tokens "
                              f"is not the target's {t.vocab_size}: a draft proposes the "
                              "target's token ids")
        self.model.setup(kernels, device, t.max_model_len)
        self.valid: dict = {}

    def block_bytes(self, block_size: int, itemsize: int) -> int:
        a = self.model.args
        return 2 * a.num_layers * block_size * a.num_kv_heads * a.head_dim * itemsize

    def bind(self, num_blocks: int, block_size: int, dtype, device) -> None:
        a = self.model.args
        # zeros, not empty: masked-out slots must never hold NaN (as the target's cache)
        cache = torch.zeros(2, a.num_layers, num_blocks, block_size, a.num_kv_heads, a.head_dim,
                            dtype=dtype, device=device)
        self.model.bind_cache(cache[0], cache[1])

    def start(self, req) -> int:
        """Where a request's first draft forward of a step starts: the first token whose draft
        KV is missing or stale (progress that went back, a recompute, leaves less right)."""
        return min(self.valid.get(req.request_id, 0), req.num_computed_tokens)

    def __call__(self, input_ids, positions, meta, rows) -> torch.Tensor:
        return self.model(input_ids, positions, meta, rows)

    def verified(self, req, start: int, k: int, accepted: int) -> None:
        """The draft wrote positions start .. start + k - 1 from its last token and drafts
        1 .. k - 1; those with right inputs (draft j is right for j <= accepted) stay right."""
        self.valid[req.request_id] = start + min(accepted + 1, k)

    def drop(self, request_ids) -> None:
        """Requests that ended or left their blocks (preempted, swapped out: a swap moves the
        target's KV only)."""
        for rid in request_ids:
            self.valid.pop(rid, None)


def make_draft(spec: str, target, device, dtype, kernels):
    """The draft `executor.draft` names: layers:N, or a model preset."""
    if spec.startswith("layers:"):
        return LayerDraft(target, spec)
    return ModelDraft(spec, target, device, dtype, kernels)
