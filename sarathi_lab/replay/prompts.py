"""What is sent: a token-id prompt per request and the completion request's body.

A trace with token ids (a JSONL trace's `prompt_token_ids`, or its text tokenized with
`trace.tokenizer`) is sent as it is. A trace with lengths only gets seeded random ids below
`--vocab-size` (traces.attach_prompt_ids, the ids the torch executor would run): the
completions API takes a prompt as a list of token ids, so the server sees exactly the trace's
prompt length without a tokenizer on this side."""
from __future__ import annotations

import pandas as pd

from sarathi_lab.settings import ConfigError, missing


def with_prompt_ids(trace: pd.DataFrame, vocab_size: int | None, seed: int) -> tuple[pd.DataFrame, str]:
    """(the trace with a `prompt_token_ids` column, where its ids came from: "trace" or
    "synthesized")."""
    from sarathi_lab.traces import attach_prompt_ids
    own = "prompt_token_ids" in trace and not trace["prompt_token_ids"].map(missing).any()
    if own:
        return trace, "trace"
    if vocab_size is None:
        raise ConfigError("the trace has prompt lengths only: give --vocab-size N (the "
                          "endpoint model's vocabulary; random prompt ids are drawn below it)")
    return attach_prompt_ids(trace, vocab_size, seed=seed), "synthesized"


def completion_body(model: str, prompt_ids: list[int], max_tokens: int, ignore_eos: bool) -> dict:
    """The body of one streamed, greedy /v1/completions request that asks for `max_tokens`
    tokens. `ignore_eos` (vLLM's and SGLang's extension) keeps the server from stopping at EOS,
    so that the output length is the trace's; `stream_options.include_usage` asks for the
    token count in the last chunk."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": int(max_tokens),
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    return body
