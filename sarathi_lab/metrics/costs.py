"""Offered load (module docstring of sarathi_lab.metrics) and the cost of serving at a rate."""
from __future__ import annotations

import math

import pandas as pd


def offered_load(req_df: pd.DataFrame) -> dict:
    """What the trace asked of the server (see the module docstring)."""
    arrival = req_df["arrival_time"].to_numpy(float)
    n = len(arrival)
    span = float(arrival.max() - arrival.min()) if n else 0.0
    rate = (n - 1) / span if n > 1 and span > 0 else None

    def tok_s(col):
        mean = float(req_df[col].mean())   # NaN when no request has one: a served session's
        return None if rate is None or math.isnan(mean) else rate * mean   # are the model's
    return {"num_requests": n, "arrival_span_s": span, "requests_per_s": rate,
            "prompt_tokens_per_s": tok_s("num_prompt_tokens"),
            "output_tokens_per_s": tok_s("target_output_tokens")}


def cost_at_rate(requests_per_s: float, mean_output_tokens: float, price_per_gpu_hour: float,
                 num_gpus: int) -> dict:
    """Cost of serving a steady `requests_per_s` (e.g. a capacity) on `num_gpus` GPUs rented
    at `price_per_gpu_hour`: dollars per 1M output tokens and per request."""
    usd_per_s = price_per_gpu_hour * num_gpus / 3600.0
    tok_s = requests_per_s * mean_output_tokens
    return {"usd_per_1m_output_tokens": usd_per_s / tok_s * 1e6 if tok_s > 0 else None,
            "usd_per_request": usd_per_s / requests_per_s if requests_per_s > 0 else None}


def run_cost(req_df: pd.DataFrame, span: float, price_per_gpu_hour: float,
             num_gpus: int) -> dict:
    """Cost of the run at its own load: `num_gpus` GPUs rented for the makespan, whatever
    their use, divided over the output tokens and requests that finished."""
    fin = req_df["status"] == "finished"
    tokens = float(req_df.loc[fin, "num_output_tokens"].sum())
    n = int(fin.sum())
    gpu_hours = span / 3600.0 * num_gpus
    usd = gpu_hours * price_per_gpu_hour
    return {"price_per_gpu_hour": float(price_per_gpu_hour), "num_gpus": int(num_gpus),
            "gpu_hours": gpu_hours, "usd": usd,
            "usd_per_1m_output_tokens": usd / tokens * 1e6 if tokens else None,
            "usd_per_request": usd / n if n else None}
