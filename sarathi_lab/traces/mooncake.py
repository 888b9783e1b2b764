"""Mooncake traces (JSONL, one request a line: ``timestamp`` in ms, ``input_length``,
``output_length``, ``hash_ids``), as released with Mooncake (FAST'25, kvcache-ai/Mooncake).

Each hash id names one 512-token block of the prompt, in order; equal ids at the head of two
prompts mean a shared prefix. The prompt's token ids are made from its hash ids: hash id h is
always the same 512 seeded random ids (`HASH_BLOCK_STREAM`, h), the prompt their concatenation
cut to ``input_length``, so the prefix cache shares exactly the blocks the hash ids share: two
requests opening with the same k ids share k * 512 tokens, which are k * 512 / block_size cache
blocks when the KV block size divides 512, else floor(k * 512 / block_size) (the block that
straddles the end of the shared prefix holds tokens of both and is not shared). The trace keeps
its own times (ms, made seconds from the first request).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab.traces.files import DECODE_ERRORS, json_lines, json_object, line_error, open_text
from sarathi_lab.traces.frame import MAX_WHOLE, is_int, is_number
from sarathi_lab.traces.precision import MAX_ARRIVAL_S, unresolvable
from sarathi_lab.traces.streams import HASH_BLOCK_STREAM
from sarathi_lab.traces.tokens import DEFAULT_VOCAB

BLOCK_TOKENS = 512   # tokens per hash id, as the trace's release defines them
KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def is_mooncake(src: Path) -> bool:
    """Whether the JSONL trace `src` is in Mooncake's format: its first object has hash_ids."""
    try:
        with open_text(src) as f:
            for line in f:
                if line.strip():
                    obj = json.loads(line)
                    return isinstance(obj, dict) and "hash_ids" in obj
    except (json.JSONDecodeError, *DECODE_ERRORS):
        return False   # the JSONL reader says what is wrong with it
    return False


def read_mooncake(src: Path, with_ids: bool = True) -> pd.DataFrame:
    """The trace frame of a Mooncake trace, with prompt token ids made from the hash ids
    (`with_ids`; a length table needs none). Errors name the file and the line."""
    rows = []   # (timestamp ms, input_length, output_length, hash_ids)
    for lineno, line in json_lines(src):
        row = _parse_line(line, src, lineno)
        if rows and row[0] < rows[-1][0]:
            raise line_error(src, lineno, f"timestamp {row[0]!r} ms comes before the previous "
                             f"request's ({rows[-1][0]!r} ms); times must be ascending")
        if rows and (row[0] - rows[0][0]) / 1e3 >= MAX_ARRIVAL_S:
            raise line_error(src, lineno, unresolvable((row[0] - rows[0][0]) / 1e3,
                                                       "the request"))
        rows.append(row)
    if not rows:
        raise ValueError(f"trace {src} has no requests")
    times, prompts, outputs, hashes = zip(*rows)
    raw = pd.DataFrame({
        "arrival_time": np.array(times, dtype=np.float64) / 1e3,
        "num_prompt_tokens": np.array(prompts, dtype=np.int64),
        "num_output_tokens": np.array(outputs, dtype=np.int64),
    })
    if with_ids:
        raw["prompt_token_ids"] = pd.Series(block_ids(hashes, prompts), dtype=object)
    raw.attrs["format"] = "mooncake"
    return raw


def block_ids(hashes: list[list[int]], lengths: list[int],
              vocab_size: int = DEFAULT_VOCAB) -> list[list[int]]:
    """Each prompt's token ids: its hash ids' blocks, concatenated, cut to its length."""
    blocks: dict[int, np.ndarray] = {}

    def block(h: int) -> np.ndarray:
        b = blocks.get(h)
        if b is None:
            rng = np.random.default_rng([HASH_BLOCK_STREAM, h])
            b = blocks[h] = rng.integers(0, vocab_size, BLOCK_TOKENS, dtype=np.int64)
        return b
    return [np.concatenate([block(h) for h in ids])[:n].tolist()
            for ids, n in zip(hashes, lengths)]


def _parse_line(line, src, lineno):
    def bad(msg):
        return line_error(src, lineno, msg)

    obj = json_object(line, src, lineno)
    absent = [k for k in KEYS if k not in obj]
    if absent:
        raise bad(f"missing {', '.join(absent)} (a Mooncake trace line has "
                  f"{', '.join(KEYS)})")
    t, p, o, h = (obj[k] for k in KEYS)
    if not (is_number(t) and math.isfinite(t) and t >= 0):
        raise bad(f"timestamp must be a number of milliseconds >= 0, got {t!r}")
    if not (is_int(p) and 1 <= p < MAX_WHOLE):
        raise bad(f"input_length must be a whole number of tokens >= 1, got {p!r}")
    if not (is_int(o) and 0 <= o < MAX_WHOLE):
        raise bad(f"output_length must be a whole number of tokens >= 0, got {o!r}")
    if not (isinstance(h, list) and all(is_int(x) and x >= 0 for x in h)):
        raise bad("hash_ids must be a list of non-negative ints")
    need = -(-p // BLOCK_TOKENS)
    if len(h) != need:
        raise bad(f"{len(h)} hash_ids, but input_length={p} takes {need} blocks of "
                  f"{BLOCK_TOKENS} tokens (one hash id each)")
    return t, p, o, h

