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
"""
from __future__ import annotations

import re

import torch

from sarathi_lab.settings import ConfigError

_LAYERS = re.compile(r"layers:(\d+)")


def draft_layers(spec: str) -> int:
    """N of ``layers:N`` (the form `TorchConfig.validate` checks before a model is known)."""
    m = _LAYERS.fullmatch(spec)
    if m is None or int(m.group(1)) < 1:
        raise ConfigError(f"executor.draft={spec!r}: expected layers:N with N >= 1 (the target's "
                          "first N layers as the draft)")
    return int(m.group(1))


class LayerDraft:
    """The target's first `num_layers` layers + its final norm and LM head, over the target's
    paged KV (see the module's docstring for why sharing it is correct)."""

    def __init__(self, model, spec: str):
        n, total = draft_layers(spec), model.args.num_layers
        if n > total:
            raise ConfigError(f"executor.draft={spec!r}: the model has {total} layers; the draft "
                              f"takes its first N, 1 <= N <= {total}")
        self.model, self.num_layers = model, n

    @torch.inference_mode()
    def __call__(self, input_ids, positions, meta) -> torch.Tensor:
        """Logits [T, vocab] in fp32, every row (each draft row proposes one token)."""
        m = self.model
        cos, sin = m.cos[positions][:, None], m.sin[positions][:, None]
        x = m.model.embed_tokens(input_ids)
        for layer in m.model.layers[:self.num_layers]:
            x = layer(x, cos, sin, meta, m.kernels)
        return m.lm_head(m.model.norm(x)).float()
