"""A generated trace: arrivals from a process at a rate, lengths from two specs, redrawn until they
pass the filters.
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from sarathi_lab.traces.arrivals import arrival_times, check_arrival_options
from sarathi_lab.traces.filters import check_filters, describe_filters, length_mask
from sarathi_lab.traces.lengths import length_sampler
from sarathi_lab.traces.streams import ARRIVAL_STREAM, stream_rng

logger = logging.getLogger(__name__)


def synthetic_trace(num_requests, qps, *, arrival="poisson", cv=1.0, burst=None, prompt_len=512,
                    output_len=128, seed=0, max_total_tokens=None,
                    max_prompt_tokens=None) -> pd.DataFrame:
    """A generated trace: arrivals at ``qps`` and lengths from two small specs.

    A length spec is an int (every request the same), ``{"dist": "uniform", "low", "high"}``
    (inclusive), ``{"dist": "lognormal", "mean", "sigma"}`` (``mean`` is the mean length in
    tokens, ``sigma`` the shape: the sigma of the underlying normal) or ``{"trace": name_or_path}``
    (rows drawn with replacement from a trace; when both specs name the same trace, prompt and
    output come from the same rows, so their correlation is kept). Lengths over the optional
    filters are redrawn; ``attrs["dropped"]`` says how many.
    """
    check_arrival_options(qps, arrival, cv, burst)
    check_filters(max_total_tokens, max_prompt_tokens)
    n = int(num_requests)
    if n < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if qps is None:
        raise ValueError("a synthetic trace needs qps (req/s)")
    draw = length_sampler(prompt_len, output_len, seed)

    # Redraw until enough lengths pass the filters; this samples from the truncated
    # distribution rather than silently returning fewer requests than asked for.
    prompts, outputs, kept, dropped = [], [], 0, 0
    for _ in range(1000):
        p, o = draw(n - kept)
        ok = length_mask(p, o, max_total_tokens, max_prompt_tokens)
        prompts.append(p[ok])
        outputs.append(o[ok])
        kept += int(ok.sum())
        dropped += int((~ok).sum())
        if kept == n:
            break
    else:
        raise ValueError(
            f"only {kept} of {kept + dropped} drawn lengths fit max_total_tokens="
            f"{max_total_tokens}, max_prompt_tokens={max_prompt_tokens}; loosen the filters or "
            "the length specs")
    if dropped:
        logger.info("synthetic trace: redrew %d requests longer than %s", dropped,
                    describe_filters(max_total_tokens, max_prompt_tokens))
    df = pd.DataFrame({
        "arrival_time": arrival_times(n, qps, arrival, cv, stream_rng(seed, ARRIVAL_STREAM), burst),
        "num_prompt_tokens": np.concatenate(prompts).astype(np.int64),
        "num_output_tokens": np.concatenate(outputs).astype(np.int64),
    })
    df.attrs.update(source="synthetic", format="synthetic", dropped=dropped, arrivals="drawn",
                    qps=qps, cut_to=None)
    return df
