"""JSONL traces (``*.jsonl[.gz]``): one request a line, with token ids or prompt text (tokenized),
an output length, an optional arrival time and the optional service keys; errors name the line.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab.traces.files import json_lines, json_object, line_error
from sarathi_lab.traces.frame import MAX_WHOLE, SERVICE_DEFAULTS, SERVICE_WHAT, is_int, is_number
from sarathi_lab.traces.tokens import chat_prompts, load_tokenizer


def read_jsonl(src: Path, tokenizer, chat_template="auto") -> pd.DataFrame:
    """One JSON object per line; errors give the line number (blank lines count, too). Prompt
    text is tokenized by `tokenizer`, in the tokenizer's chat template (`tokens.chat_prompts`)."""
    ids, texts, outputs, times, service, lines = [], {}, [], [], [], []
    for lineno, line in json_lines(src):
        tokens, text, out, t, extra = _parse_json_line(line, src, lineno)
        if text is not None:
            texts[len(ids)] = text
        ids.append(tokens)
        outputs.append(out)
        times.append(t)
        service.append(extra)
        lines.append(lineno)
    if not ids:
        raise ValueError(f"trace {src} has no requests")
    if not texts and tokenizer is not None:
        raise ValueError(f"trace.tokenizer={tokenizer}: trace {src} holds token ids, no prompt "
                         "text, so there is nothing to tokenize; leave trace.tokenizer unset")
    if texts:
        tok = load_tokenizer(tokenizer, src)
        prompts, special = chat_prompts(tok, list(texts.values()), chat_template, src)
        # a template writes its own special tokens (a plain callable tokenizer takes no flag)
        encoded = tok(prompts) if special else tok(prompts, add_special_tokens=False)
        for row, toks in zip(texts, encoded["input_ids"]):
            if not toks:
                raise ValueError(f"trace {src}: line {lines[row]}: the prompt tokenizes to "
                                 "0 tokens")
            ids[row] = list(toks)

    timed = [t is not None for t in times]
    if any(timed) and not all(timed):
        row = timed.index(not timed[0])
        raise ValueError(f"trace {src}: line {lines[row]}: arrival_time must be given on every "
                         "line or on none")
    raw = pd.DataFrame({
        "num_prompt_tokens": np.array([len(x) for x in ids], dtype=np.int64),
        "num_output_tokens": np.array(outputs, dtype=np.int64),
        "prompt_token_ids": pd.Series(ids, dtype=object),
    })
    if texts:   # the text itself, for a client that sends text (sarathi-lab-replay --prompt text)
        raw["prompt_text"] = pd.Series([texts.get(i) for i in range(len(ids))], dtype=object)
    # A key given on any line makes a column; lines without it get the default.
    for key, default in SERVICE_DEFAULTS.items():
        if any(key in extra for extra in service):
            values = [extra.get(key, default) for extra in service]
            raw[key] = (np.array(values, dtype=np.float64) if key == "deadline" else
                        np.array(values, dtype=np.int64 if key == "priority" else object))
    raw.attrs["format"] = "lengths"
    if all(timed):
        t = np.array(times, dtype=np.float64)
        back = np.flatnonzero(np.diff(t) < 0)
        if len(back):
            i = int(back[0]) + 1
            raise ValueError(f"trace {src}: arrival times are not sorted ascending: line "
                             f"{lines[i]} arrives at {t[i]!r}, before the previous request "
                             f"({t[i - 1]!r})")
        raw.insert(0, "arrival_time", t)
        raw.attrs["format"] = "jsonl"
    return raw


def _parse_json_line(line, src, lineno):
    """-> (token ids or None, prompt text or None, output_len, arrival_time or None,
    {service key: value} for the service keys given)."""
    def bad(msg):
        return line_error(src, lineno, msg)

    obj = json_object(line, src, lineno)
    tokens, text = obj.get("prompt_token_ids"), None
    if tokens is not None:
        if not (isinstance(tokens, list) and all(is_int(t) and t >= 0 for t in tokens)):
            raise bad("prompt_token_ids must be a list of non-negative ints")
        if not tokens:
            raise bad("prompt_token_ids is empty (a prompt of 0 tokens)")
    elif isinstance(obj.get("prompt"), str):
        text = obj["prompt"]
    else:
        raise bad("needs 'prompt_token_ids' (a list of ints) or 'prompt' (text)")
    out = obj.get("output_len")
    if not (is_int(out) and 0 <= out < MAX_WHOLE):
        raise bad(f"output_len must be a non-negative int (< 2**53), got {out!r}")
    t = obj.get("arrival_time")
    if t is not None and not (is_number(t) and np.isfinite(t)):
        raise bad(f"arrival_time must be a number of seconds, got {t!r}")
    extra = {}
    for key in SERVICE_DEFAULTS:
        v = obj.get(key)
        if v is None or (isinstance(v, str) and not v.strip()):
            continue  # the default, as an empty CSV cell
        if key == "priority":
            ok = is_int(v) and abs(v) < MAX_WHOLE
        elif key == "deadline":
            ok = is_number(v) and np.isfinite(v) and v > 0
        else:
            ok = isinstance(v, str)
            v = v.strip() if ok else v
        if not ok:
            raise bad(f"{key} must be {SERVICE_WHAT[key]}, got {v!r}")
        extra[key] = v
    return tokens, text, out, t, extra

