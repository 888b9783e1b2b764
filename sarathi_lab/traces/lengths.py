"""Length specs for generated traces: a constant, uniform, lognormal, or rows drawn from a trace
(prompt and output from the same row when both specs name the same trace).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from sarathi_lab.settings import plain
from sarathi_lab.traces.csv_formats import read_csv
from sarathi_lab.traces.files import is_json, resolve_trace
from sarathi_lab.traces.jsonl import read_jsonl
from sarathi_lab.traces.mooncake import is_mooncake, read_mooncake
from sarathi_lab.traces.streams import OUTPUT_STREAM, PROMPT_STREAM, stream_rng


def length_sampler(prompt_spec, output_spec, seed):
    """A function n -> (prompt lengths, output lengths) for the two specs."""
    prompt_spec, output_spec = plain(prompt_spec), plain(output_spec)
    rng_p, rng_o = stream_rng(seed, PROMPT_STREAM), stream_rng(seed, OUTPUT_STREAM)
    tables = {}

    def table(spec):
        src = resolve_trace(spec["trace"])
        if src not in tables:
            raw = (read_csv(src, None, None, None) if not is_json(src) else
                   read_mooncake(src, with_ids=False) if is_mooncake(src) else
                   read_jsonl(src, None))
            tables[src] = (raw["num_prompt_tokens"].to_numpy(),
                           raw["num_output_tokens"].to_numpy())
        return tables[src]

    def one(spec, rng, which, what):
        if isinstance(spec, Mapping) and "trace" in spec:
            cols = table(spec)
            return lambda n: cols[which][rng.integers(0, len(cols[which]), n)]
        return distribution(spec, rng, what)

    same_trace = (isinstance(prompt_spec, Mapping) and isinstance(output_spec, Mapping)
                  and "trace" in prompt_spec and "trace" in output_spec
                  and resolve_trace(prompt_spec["trace"]) == resolve_trace(output_spec["trace"]))
    if same_trace:
        tp, to = table(prompt_spec)

        def joint(n):
            rows = rng_p.integers(0, len(tp), n)
            return tp[rows], to[rows]
        return joint
    draw_p = one(prompt_spec, rng_p, 0, "prompt_len")
    draw_o = one(output_spec, rng_o, 1, "output_len")
    return lambda n: (draw_p(n), draw_o(n))


def distribution(spec, rng, what):
    """A function n -> n draws of the length spec `spec` (an int, uniform or lognormal; `what`
    names it in errors), drawing from `rng`."""
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        if spec < 1:
            raise ValueError(f"{what} must be >= 1, got {spec}")
        return lambda n: np.full(n, int(spec), dtype=np.int64)
    if not isinstance(spec, Mapping) or "dist" not in spec:
        raise ValueError(f"{what}: expected an int, {{dist: uniform, low, high}}, "
                         f"{{dist: lognormal, mean, sigma}} or {{trace: name}}, got {spec!r}")
    dist = spec["dist"]
    if dist == "uniform":
        low, high = int(spec["low"]), int(spec["high"])
        if not 1 <= low <= high:
            raise ValueError(f"{what}: need 1 <= low <= high, got low={low}, high={high}")
        return lambda n: rng.integers(low, high, n, endpoint=True, dtype=np.int64)
    if dist == "lognormal":
        mean, sigma = float(spec["mean"]), float(spec["sigma"])
        if mean <= 0 or sigma < 0:
            raise ValueError(f"{what}: lognormal needs mean > 0 and sigma >= 0")
        mu = np.log(mean) - sigma ** 2 / 2  # so that the lengths themselves average `mean`
        return lambda n: np.maximum(np.rint(rng.lognormal(mu, sigma, n)), 1).astype(np.int64)
    raise ValueError(f"{what}: unknown dist {dist!r}; use uniform or lognormal")
