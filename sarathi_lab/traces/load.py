"""`load_trace`: a shipped trace or a file, filtered, cut to ``num_requests`` (or a random sample),
and timed: its own arrival times re-timed to ``qps``, or arrivals drawn for a length-only trace.
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from sarathi_lab.traces.arrivals import arrival_times, check_arrival_options, retime
from sarathi_lab.traces.csv_formats import read_csv
from sarathi_lab.traces.files import SHIPPED, is_json, resolve_trace
from sarathi_lab.traces.filters import check_filters, describe_filters, length_mask
from sarathi_lab.traces.jsonl import read_jsonl
from sarathi_lab.traces.mooncake import is_mooncake, read_mooncake
from sarathi_lab.traces.streams import ARRIVAL_STREAM, SHUFFLE_STREAM, stream_rng

logger = logging.getLogger(__name__)


def load_trace(path, *, num_requests=None, qps=None, arrival="poisson", cv=1.0, burst=None,
               max_total_tokens=None, max_prompt_tokens=None, seed=0,
               tokenizer=None, shuffle=False, chat_template="auto", models=None,
               log_types=None) -> pd.DataFrame:
    """Load a shipped trace (by name) or a trace file.

    The length filters are applied first, then the first ``num_requests`` survivors are kept;
    ``df.attrs["dropped"]`` counts the rows the filters skipped among the rows read to get them.
    ``shuffle`` puts the rows in a random order (seeded by ``seed``) first, so that the requests
    kept are a random sample of the trace rather than its head (as Sarathi-Serve's and Vidur's
    trace length generators do); only for a trace without arrival times.
    ``qps`` re-times a timestamped trace (inter-arrival gaps scaled to that mean rate, burstiness
    kept) and is required for a length-only trace, whose arrivals are then drawn from ``arrival``
    (``poisson``, ``gamma`` with coefficient of variation ``cv``, or ``onoff`` with ``burst`` =
    (on_s, off_s): Poisson arrivals only during on periods). ``tokenizer`` (a local path
    or a tokenizer object) is only needed for a JSONL trace that holds prompt text, which is
    put in the tokenizer's chat template per ``chat_template`` (auto, True, False).
    ``models``, ``log_types`` (a value or a list; BurstGPT only) keep the rows whose ``Model``
    and ``Log Type`` are among them (ignoring case), before ``num_requests`` counts.
    """
    check_arrival_options(qps, arrival, cv, burst)
    check_filters(max_total_tokens, max_prompt_tokens)
    if num_requests is not None:
        if int(num_requests) < 1:
            raise ValueError(f"num_requests must be >= 1 or None, got {num_requests}")
        num_requests = int(num_requests)
    src = resolve_trace(path)
    select = {col: [v] if isinstance(v, str) else v
              for col, v in (("Model", models), ("Log Type", log_types)) if v is not None}
    if select and is_json(src):
        raise ValueError(f"trace.{'models' if models is not None else 'log_types'}: read only "
                         f"for a BurstGPT trace (a CSV with Model and Log Type columns); trace "
                         f"{src} is JSONL")
    if is_json(src) and is_mooncake(src):
        if tokenizer is not None:
            raise ValueError(f"trace.tokenizer={tokenizer}: trace {src} is a Mooncake trace "
                             "(hash ids, no prompt text to tokenize); leave trace.tokenizer unset")
        raw = read_mooncake(src)
    elif is_json(src):
        raw = read_jsonl(src, tokenizer, chat_template)
    elif tokenizer is not None:
        raise ValueError(f"trace.tokenizer={tokenizer}: trace {src} is a CSV of token counts, "
                         "with no prompt text to tokenize (only a JSONL trace holds text); "
                         "leave trace.tokenizer unset")
    else:   # a random sample needs every row; the head only as many as it keeps
        raw = read_csv(src, None if shuffle else num_requests, max_total_tokens,
                       max_prompt_tokens, select)
        if raw.attrs["format"] == "burstgpt":
            logger.info("trace %s: dropped, among the rows read, %d failed calls (0 response "
                        "tokens), %d rows of 0 request tokens and %d not matching %s", src,
                        raw.attrs["failed"], raw.attrs["no_prompt"], raw.attrs["filtered"],
                        select or "no filter")
    timed = raw.attrs["format"] != "lengths"
    if not timed and qps is None:
        raise ValueError(
            f"trace {src} has token lengths but no arrival times: set trace.qps=<req/s> so that "
            f"arrivals can be drawn (trace.arrival={arrival})")
    if shuffle:
        if timed:
            raise ValueError(f"trace.shuffle: trace {src} has its own arrival times, which a "
                             "shuffle would part from their requests (it is for length-only "
                             "traces)")
        fmt = raw.attrs["format"]
        raw = raw.iloc[stream_rng(seed, SHUFFLE_STREAM).permutation(len(raw))].reset_index(drop=True)
        raw.attrs["format"] = fmt

    df, dropped = _select(raw, src, num_requests, max_total_tokens, max_prompt_tokens)
    if timed and arrival != "poisson":
        raise ValueError(f"trace {src} has its own arrival times, so arrival={arrival!r} is not "
                         "read (qps re-times its own gaps; a mix component with arrival="
                         f"{arrival} draws new ones)")
    if timed:
        t = df["arrival_time"].to_numpy()
        t = (t - t[0]) / 1e9 if t.dtype.kind == "i" else t - t[0]  # Azure: int nanoseconds
        if qps is not None:
            t = retime(t, qps, src)
    else:
        t = arrival_times(len(df), qps, arrival, cv, stream_rng(seed, ARRIVAL_STREAM), burst)
    df["arrival_time"] = t
    # what was done to the file's requests, for the summary (build.describe_trace)
    arrivals = ("own" if qps is None else "retimed") if timed else "drawn"
    cut = num_requests if num_requests is not None and len(df) == num_requests else None
    # a shipped trace by its name: the package's install path says nothing about the run and
    # would differ between two checkouts of the same code
    source = f"shipped:{path}" if isinstance(path, str) and path in SHIPPED else str(src)
    df.attrs.update(source=source, format=raw.attrs["format"], dropped=dropped,
                    arrivals=arrivals, qps=qps, cut_to=cut)
    if raw.attrs["format"] == "burstgpt":   # the rows it dropped (csv_formats._BurstRows)
        df.attrs.update({k: raw.attrs[k] for k in ("failed", "no_prompt", "filtered")})
    return df


def _select(raw, src, num_requests, max_total, max_prompt):
    """Filter by length, then keep the first ``num_requests``; return (frame, dropped)."""
    keep = length_mask(raw["num_prompt_tokens"].to_numpy(), raw["num_output_tokens"].to_numpy(),
                        max_total, max_prompt)
    idx = np.flatnonzero(keep)
    if num_requests is not None and len(idx) >= num_requests:
        idx = idx[:num_requests]
        scanned = int(idx[-1]) + 1  # rows after the last kept one were never considered
    else:
        scanned = len(raw)
        if num_requests is not None:
            logger.warning("trace %s: asked for %d requests but only %d are available%s", src,
                           num_requests, len(idx),
                           " after filtering" if len(idx) < len(raw) else "")
    dropped = scanned - len(idx)
    if len(idx) == 0:
        raise ValueError(f"trace {src}: all {len(raw)} requests are longer than "
                         f"{describe_filters(max_total, max_prompt)}")
    if dropped:
        logger.info("trace %s: dropped %d of the first %d requests, longer than %s", src,
                    dropped, scanned, describe_filters(max_total, max_prompt))
    df = raw.iloc[idx].reset_index(drop=True)
    df.attrs = {}
    if "arrival_time" not in df:
        df.insert(0, "arrival_time", 0.0)
    return df, dropped
