"""Token ids: the tokenizer a text prompt needs (loaded only then) and `attach_prompt_ids`, seeded
random ids for replaying a length-only trace on a real model.
"""
from __future__ import annotations

import logging
import os

import numpy as np
import pandas as pd

from sarathi_lab.settings import missing
from sarathi_lab.traces.streams import IDS_STREAM, stream_rng

logger = logging.getLogger(__name__)

# Token ids a trace draws for itself (multi-turn sessions, Mooncake's hash blocks) stay below
# Llama-2's and Mistral's vocabulary, which every shipped model but the toy tiny-llama (512) holds;
# the real executor refuses ids outside its model's vocabulary (attach_prompt_ids).
DEFAULT_VOCAB = 32000


def load_tokenizer(tokenizer, src):
    if tokenizer is None:
        raise ValueError(f"trace {src} holds prompt text; set trace.tokenizer=DIR (a local "
                         "tokenizer directory, e.g. the model's) to turn it into tokens")
    if not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer  # already a tokenizer object
    from transformers import AutoTokenizer  # heavy import, only when text needs it
    return AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)


def chat_prompts(tok, texts: list[str], chat_template, src) -> tuple[list[str], bool]:
    """The prompts as the model should see them, and whether the tokenizer should still add its
    special tokens. An instruct model's tokenizer carries a chat template (its turn markers):
    without it the text reaches the model as a bare continuation, and SmolLM2-135M-Instruct, for
    one, answers a question with an immediate end of turn. ``chat_template``: auto (the
    template when the tokenizer has one), true (required) or false (the text as it is). A
    template writes its own special tokens, so none are added then."""
    has = bool(getattr(tok, "chat_template", None))
    if chat_template is True and not has:
        raise ValueError(f"trace.chat_template=true: the tokenizer for trace {src} has no chat "
                         "template; set trace.chat_template=false (or auto) to send the prompt "
                         "text as it is")
    if chat_template is False or not has:
        return texts, True
    return [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                    add_generation_prompt=True) for t in texts], False


def attach_prompt_ids(df: pd.DataFrame, vocab_size: int, *, seed=0,
                      shared_prefix_len=0) -> pd.DataFrame:
    """A copy of ``df`` with seeded random prompt token ids in [0, vocab_size).

    For replaying a length-only trace on a real model. With ``shared_prefix_len > 0`` every
    prompt opens with the same "system prompt" of that many tokens (cut to the prompt's own
    length), which gives prefix caching something to find. A trace that already carries its own
    ids keeps them (checked against the vocabulary), so callers may apply this unconditionally.
    """
    vocab_size = int(vocab_size)
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    if shared_prefix_len < 0:
        raise ValueError(f"shared_prefix_len must be >= 0, got {shared_prefix_len}")
    out = df.copy()
    if "prompt_token_ids" in df and not df["prompt_token_ids"].map(missing).any():
        top = max((max(ids) for ids in df["prompt_token_ids"] if len(ids)), default=-1)
        if top >= vocab_size:
            raise ValueError(f"the trace's own prompt_token_ids reach {top}, outside the "
                             f"vocabulary of {vocab_size}")
        logger.info("attach_prompt_ids: the trace carries its own prompt ids; keeping them")
        return out

    rng = stream_rng(seed, IDS_STREAM)
    prefix = rng.integers(0, vocab_size, int(shared_prefix_len), dtype=np.int64)
    lengths = df["num_prompt_tokens"].to_numpy(dtype=np.int64)
    # One draw for all prompts, then sliced: fast, and row i's ids do not depend on how the
    # caller iterates.
    flat = rng.integers(0, vocab_size, int(lengths.sum()), dtype=np.int64)
    ends = np.cumsum(lengths)
    ids = []
    for end, n in zip(ends, lengths):
        row = flat[end - n:end]
        k = min(n, len(prefix))
        row[:k] = prefix[:k]
        ids.append(row.tolist())
    out["prompt_token_ids"] = pd.Series(ids, index=out.index, dtype=object)
    return out
