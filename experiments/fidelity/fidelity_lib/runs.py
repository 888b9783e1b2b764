"""The study's runs: the model, the policies and the two scales it runs them at, a run's config
(the torch executor or the simulator on the same trace and KV cache size), the figures compared
from a run's summary, and how busy a real run kept its engine."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from studies import compose

# A random Llama (about 5M parameters) whose real runs of a few hundred requests take seconds each
# on one CPU thread, with both compute (prefills of a few hundred tokens: tens of ms) and per-step
# overheads (a decode step: a few ms) in play.
MODEL = ["model=tiny-llama", "model.name=fidelity-llama", "model.num_layers=4",
         "model.hidden_size=256", "model.intermediate_size=768", "model.num_heads=4",
         "model.num_kv_heads=2", "model.head_dim=64", "model.vocab_size=4096",
         "model.max_model_len=1024"]


POLICIES = {
    "request_level": ["scheduler=request_level"],
    "orca": ["scheduler=orca"],
    "vllm": ["scheduler=vllm"],
    "sarathi-128": ["scheduler=sarathi", "scheduler.token_budget=128"],
    "sarathi-512": ["scheduler=sarathi", "scheduler.token_budget=512"],
}


# what the profile and the real runs time: the thread's CPU time (see the docstring)
CLOCK = "executor.clock=cpu"


SCALES = {
    # prompts of ~50-768 tokens (chunked under both budgets), outputs of ~5-200
    # 7 req/s keeps the real runs busy about 80% of their span on a quiet 2-core CPU (steps of
    # ~23 s of CPU for 200 requests): below capacity, where latency follows the steps and not
    # an ever-growing queue (Vidur's comparisons stop at ~85% of capacity); --qps 10 is at it
    "full": dict(model=MODEL, grid="cpu", profile_repeats=5, num_requests=200, qps=7.0,
                 prompt_len={"dist": "lognormal", "mean": 256, "sigma": 0.6},
                 output_len={"dist": "lognormal", "mean": 32, "sigma": 0.7},
                 max_prompt_tokens=768, max_total_tokens=1024, num_kv_blocks=2048),
    "toy": dict(model=["model=tiny-llama", "model.max_model_len=512"], grid="tiny",
                profile_repeats=3, num_requests=16, qps=200.0,
                prompt_len={"dist": "uniform", "low": 16, "high": 160},
                output_len={"dist": "uniform", "low": 2, "high": 12},
                max_prompt_tokens=160, max_total_tokens=200, num_kv_blocks=256),
}


# (summary key, statistic) of each compared figure
METRICS = [(m, q) for m in ("ttft", "tbt", "e2e") for q in ("p50", "p90", "p99")] + \
    [("throughput_tok_s", None), ("num_iterations", None)]


def metric_name(m, q):
    return f"{m}_{q}" if q else m


def run_config(scale: dict, policy: str, executor: list[str], hardware: dict | None) -> dict:
    c = compose([*scale["model"], *POLICIES[policy], *executor, "trace=synthetic",
                 f"scheduler.num_kv_blocks={scale['num_kv_blocks']}", "progress=false"])
    c["trace"].update(num_requests=scale["num_requests"], qps=scale["qps"],
                      prompt_len=scale["prompt_len"], output_len=scale["output_len"],
                      max_prompt_tokens=scale["max_prompt_tokens"],
                      max_total_tokens=scale["max_total_tokens"], seed=0)
    if hardware is not None:
        c["hardware"] = hardware
    return c


def sim_overrides(profile) -> list[str]:
    """The simulator on `profile`, as a run's overrides."""
    return ["executor=sim", "executor.cost_model=profiled", f"executor.profile={profile}"]


def figures(summary: dict) -> dict:
    return {metric_name(m, q): (summary[m][q] if q else summary[m]) for m, q in METRICS}


def busy_share(run_dir) -> float:
    """The share of a run's span (first arrival to last finish) that its iterations ran."""
    it = pd.read_parquet(Path(run_dir) / "iterations.parquet")
    req = pd.read_parquet(Path(run_dir) / "requests.parquet", columns=["arrival_time",
                                                                        "finish_time"])
    span = req["finish_time"].max() - req["arrival_time"].min()
    return float(it["duration"].sum() / span) if span > 0 else float("nan")
