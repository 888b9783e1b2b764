"""What is sent: a prompt per request (token ids or text) and the request's body.

`--prompt ids` (the default): a trace with token ids (a JSONL trace's `prompt_token_ids`, or
its text tokenized with `trace.tokenizer`) is sent as it is; a trace with lengths only gets
seeded random ids below `--vocab-size` (traces.attach_prompt_ids, the ids the torch executor
would run). The server sees exactly the trace's prompt length without a tokenizer on this side,
but only servers that take a list of ids as `prompt` accept it (vLLM, SGLang, sarathi-lab-serve).

`--prompt text`: a JSONL trace's own prompt text where it has it; else text synthesized with
`--tokenizer DIR` (the endpoint model's tokenizer, a local directory) to the trace's prompt
lengths (`synthesize_texts`, checked to tokenize to exactly that many tokens). The chat API
takes text only."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from sarathi_lab.settings import ConfigError, missing

PROMPTS = ("ids", "text")
APIS = {"completions": "/completions", "chat": "/chat/completions"}
TEXT_STREAM = 0x7E47   # the random stream of synthesized words (apart from the trace's own)
# a whole word as one vocabulary entry: byte-level BPE's and SentencePiece's word-start marks
_WORD = re.compile(r"^(?:\u0120|\u2581)([A-Za-z]{2,})$")
_FIT_ROUNDS = 8


def with_prompt_ids(trace: pd.DataFrame, vocab_size: int | None, seed: int) -> tuple[pd.DataFrame, str]:
    """(the trace with a `prompt_token_ids` column, where its ids came from: "trace" or
    "synthesized")."""
    from sarathi_lab.traces import attach_prompt_ids
    own = "prompt_token_ids" in trace and not trace["prompt_token_ids"].map(missing).any()
    if own:
        return trace, "trace"
    if vocab_size is None:
        raise ConfigError("the trace has prompt lengths only: give --vocab-size N (the "
                          "endpoint model's vocabulary; random prompt ids are drawn below it), "
                          "or --prompt text --tokenizer DIR")
    return attach_prompt_ids(trace, vocab_size, seed=seed), "synthesized"


def prompts(trace: pd.DataFrame, kind: str, *, vocab_size: int | None, tokenizer, seed: int
            ) -> tuple[list, str]:
    """(one prompt per trace row, ids or text; where they came from: "trace",
    "synthesized", "trace text" or "synthesized text")."""
    if kind == "ids":
        trace, source = with_prompt_ids(trace, vocab_size, seed)
        return [list(map(int, p)) for p in trace["prompt_token_ids"]], source
    if vocab_size is not None:
        raise ConfigError("--vocab-size: read only with --prompt ids (random ids); text "
                          "prompts come from the trace or --tokenizer")
    if "prompt_text" in trace and not trace["prompt_text"].map(missing).any():
        if tokenizer is not None:
            raise ConfigError("--tokenizer: the trace has its own prompt text, which is sent as "
                              "it is; nothing to synthesize")
        return list(trace["prompt_text"]), "trace text"
    if tokenizer is None:
        raise ConfigError("--prompt text: the trace has no prompt text (lengths or ids only); "
                          "give --tokenizer DIR (the endpoint model's tokenizer, a local "
                          "directory) to synthesize text of the trace's prompt lengths")
    from sarathi_lab.traces.tokens import load_tokenizer
    tok = load_tokenizer(tokenizer, f"--tokenizer {tokenizer}")
    lengths = trace["num_prompt_tokens"].to_numpy(np.int64)
    return synthesize_texts(tok, lengths, seed), "synthesized text"


def word_pool(tok) -> list[str]:
    """Words that are one vocabulary entry each, with a space before them and alone: the text
    `" w1 w2 ..."` tokenizes to one token per word under a tokenizer that splits words at
    spaces (byte-level BPE, SentencePiece)."""
    words = []
    for piece in tok.convert_ids_to_tokens(list(range(len(tok)))):
        m = _WORD.match(piece) if isinstance(piece, str) else None
        if m:
            words.append(m.group(1))
    words = sorted(set(words))
    if not words:
        return []
    enc = tok([" " + w for w in words], add_special_tokens=False)["input_ids"]
    return [w for w, ids in zip(words, enc) if len(ids) == 1]


def _count(tok, texts: list[str]) -> list[int]:
    return [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]


def synthesize_texts(tok, lengths, seed: int) -> list[str]:
    """For each length n, seeded random words (`word_pool`) joined so that the text tokenizes
    to exactly n tokens without special tokens. Procedure: n words; then, while the count is
    off, drop the surplus words or add the missing ones (a tokenizer that marks the first word
    differently is off by one at most), up to 8 rounds; a text still off is an error, never a
    prompt of another length."""
    pool = word_pool(tok)
    if len(pool) < 100:
        raise ConfigError(f"--tokenizer: only {len(pool)} whole-word tokens found in its "
                          "vocabulary; cannot synthesize text of given lengths (use --prompt "
                          "ids)")
    rng = np.random.default_rng([int(seed), TEXT_STREAM])
    words = [list(rng.choice(pool, int(n))) for n in lengths]
    counts = _count(tok, ["".join(" " + w for w in ws) for ws in words])
    for _ in range(_FIT_ROUNDS):
        off = [i for i, (c, n) in enumerate(zip(counts, lengths)) if c != n]
        if not off:
            break
        for i in off:
            d = int(lengths[i]) - counts[i]
            words[i] = words[i][:d] if d < 0 else words[i] + list(rng.choice(pool, d))
        fixed = _count(tok, ["".join(" " + w for w in words[i]) for i in off])
        for i, c in zip(off, fixed):
            counts[i] = c
    bad = [i for i, (c, n) in enumerate(zip(counts, lengths)) if c != n]
    if bad:
        i = bad[0]
        raise ConfigError(f"--tokenizer: the text synthesized for request {i} tokenizes to "
                          f"{counts[i]} tokens, not the trace's {int(lengths[i])} "
                          f"({len(bad)} such requests)")
    return ["".join(" " + w for w in ws) for ws in words]


def request_body(model: str, prompt, max_tokens: int, ignore_eos: bool, api: str) -> dict:
    """The body of one streamed, greedy request that asks for `max_tokens` tokens: a
    completion of `prompt` (ids or text), or a chat completion with `prompt` (text) as the
    user's message. `ignore_eos` (vLLM's and SGLang's extension) keeps the server from stopping
    at EOS, so that the output length is the trace's; `stream_options.include_usage` asks for
    the token counts in the last chunk."""
    body = {"model": model, "max_tokens": int(max_tokens), "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True
    return body
