"""The one trace frame every source ends up as (columns and optional service columns, with
`Request`'s own defaults), and `to_requests`, which turns a frame into Requests.
"""
from __future__ import annotations

import inspect
import logging

import numpy as np
import pandas as pd

from sarathi_lab.request import Request
from sarathi_lab.settings import missing

logger = logging.getLogger(__name__)


COLUMNS = ["arrival_time", "num_prompt_tokens", "num_output_tokens"]


# Optional per-request service columns, with Request's own defaults (one source of truth).
SERVICE_DEFAULTS = {k: inspect.signature(Request).parameters[k].default
                    for k in ("priority", "tenant", "slo_class", "deadline")}


# What a valid value is, for error messages.
SERVICE_WHAT = {
    "priority": "a whole number below 2**53 in magnitude (lower is more urgent)",
    "tenant": "a string",
    "slo_class": "a string",
    "deadline": "a number of seconds > 0 (after arrival, for the first token)",
}


# Counts and priorities beyond this are no longer exact as floats (nor sane as tokens).
MAX_WHOLE = 2 ** 53


def is_int(x) -> bool:
    """A JSON value that is an integer (JSON's true/false are not counts)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x) -> bool:
    return is_int(x) or isinstance(x, float)


def to_requests(df: pd.DataFrame, max_tokens=None) -> list[Request]:
    """One Request per row; request ids are row positions 0..N-1. A row with 0 output tokens
    becomes a 1-token request: the forward pass over a prompt always yields a first token
    (a warning counts them). Service columns present in ``df`` are passed on, a relative
    ``deadline`` as the absolute time ``arrival_time + deadline``; absent ones keep Request's
    defaults."""
    arrival = df["arrival_time"].to_numpy(dtype=np.float64)
    prompt = df["num_prompt_tokens"].to_numpy(dtype=np.int64)
    output = df["num_output_tokens"].to_numpy(dtype=np.int64)
    if (output < 1).any():
        logger.warning("%s: %d requests with 0 output tokens run as 1-token requests",
                    df.attrs.get("source", "trace"), int((output < 1).sum()))
        output = np.maximum(output, 1)
    ids = df["prompt_token_ids"].tolist() if "prompt_token_ids" in df else [None] * len(df)
    # the answers' ids, where the trace plans them (sessions): the simulator emits them
    planned = df["output_token_ids"].tolist() if "output_token_ids" in df else [None] * len(df)
    service = {k: df[k].tolist() for k in SERVICE_DEFAULTS if k in df}
    if "deadline" in service:
        service["deadline"] = [None if missing(d) else a + d
                               for a, d in zip(arrival.tolist(), service["deadline"])]
    # rows as Python values, zipped: indexing numpy arrays element by element costs more than
    # building the requests themselves
    keys = list(service)
    rows = zip(arrival.tolist(), prompt.tolist(), output.tolist(), ids, planned,
               *(service[k] for k in keys))
    requests = []
    for i, (a, p, o, row_ids, row_out, *extra) in enumerate(rows):
        tokens = None if missing(row_ids) else [int(t) for t in row_ids]
        if tokens is not None and len(tokens) != p:
            raise ValueError(f"row {i}: {len(tokens)} prompt_token_ids but "
                             f"num_prompt_tokens={p}")
        answer = None if missing(row_out) else [int(t) for t in row_out]
        if answer is not None and len(answer) != o:
            raise ValueError(f"row {i}: {len(answer)} output_token_ids but "
                             f"num_output_tokens={o} (a request emits at least one token)")
        requests.append(Request(i, a, p, o, tokens, max_tokens, planned_output_ids=answer,
                                **dict(zip(keys, extra))))
    return requests
