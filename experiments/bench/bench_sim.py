"""Simulator speed: simulated requests per wall-clock second and µs per schedule()+update().

The setting of the core issue: 10,000 requests with lengths from the Azure conversation trace
(total length capped at 4,096), Poisson arrivals at 1 QPS, Llama-2-70B with TP 2 on A100s,
max_num_seqs 128, sarathi token budget 512. Every policy runs the same requests, side by side.

    python experiments/bench/bench_sim.py [--requests 10000]
        [--policies sarathi,vllm,orca,request_level]
"""
from __future__ import annotations

import argparse
import time

from sarathi_lab.engine import Engine
from sarathi_lab.metrics import iterations_table, requests_table, summarize
from sarathi_lab.run.runner import build
from sarathi_lab.traces import load_trace, to_requests


def config(policy: str, fast_forward: bool) -> dict:
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    with initialize_config_module("sarathi_lab.configs", version_base="1.3"):
        cfg = compose("config", overrides=[
            f"scheduler={policy}", "scheduler.max_num_seqs=128",
            *(["scheduler.token_budget=512"] if policy == "sarathi" else []),
            "model=llama-2-70b", "hardware=a100-80gb", "executor.tensor_parallel=2",
            f"fast_forward={fast_forward}"])
    return OmegaConf.to_container(cfg, resolve=True)


def timed(obj, name, acc):
    fn = getattr(obj, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            acc[name] += time.perf_counter() - t
    setattr(obj, name, wrapper)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--qps", type=float, default=1.0)
    ap.add_argument("--policies", default="sarathi,vllm,orca,request_level")
    ap.add_argument("--cli", action="store_true",
                    help="also time the whole `sarathi-lab` command (start-up, trace, run, files)")
    ap.add_argument("--no-fast-forward", action="store_true",
                    help="also time the plain loop (every iteration through schedule/update)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    df = load_trace("azure_conv", num_requests=args.requests, qps=args.qps,
                    max_total_tokens=4096, seed=0)
    t_load = time.perf_counter() - t0
    print(f"trace: {len(df)} requests, mean prompt {df.num_prompt_tokens.mean():.0f}, "
          f"mean output {df.num_output_tokens.mean():.0f}, loaded in {t_load:.2f} s")
    modes = [True] + ([False] if args.no_fast_forward else [])
    hdr = (f"{'policy':<14}{'ff':>4}{'sim s':>8}{'out s':>8}{'total s':>9}{'req/s wall':>12}"
           f"{'iters':>9}{'µs/iter':>9}{'sched+upd µs/call':>19}{'P99 TBT ms':>12}")
    print(hdr)
    for policy in args.policies.split(","):
        for ff in modes:
            t0 = time.perf_counter()
            pol, ex = build(config(policy, ff))
            reqs = to_requests(df)
            acc = {"schedule": 0.0, "update": 0.0}
            calls = {"n": 0}
            timed(pol, "schedule", acc)
            timed(pol, "update", acc)
            sched = pol.schedule

            def counting(now, _s=sched):
                calls["n"] += 1
                return _s(now)
            pol.schedule = counting
            eng = Engine(pol, ex, fast_forward=ff)
            eng.run(reqs)
            t_sim = time.perf_counter() - t0
            t1 = time.perf_counter()
            rq, it = requests_table(reqs), iterations_table(eng.iterations())
            s = summarize(rq, it, kv_blocks_total=pol.kv.num_blocks, block_size=pol.kv.block_size)
            t_out = time.perf_counter() - t1
            n_it = len(it)
            per_call = (acc["schedule"] + acc["update"]) / max(calls["n"], 1) * 1e6
            print(f"{policy:<14}{'on' if ff else 'off':>4}{t_sim:>8.2f}{t_out:>8.2f}"
                  f"{t_sim + t_out:>9.2f}{len(reqs) / (t_sim + t_out):>12.0f}{n_it:>9}"
                  f"{t_sim / n_it * 1e6:>9.2f}{per_call:>19.1f}"
                  f"{(s['tbt']['p99'] or 0) * 1e3:>12.1f}")
    print("sim s: build + engine loop; out s: request/iteration tables + summary (per-token "
          "times kept); µs/iter: sim s / iterations; sched+upd: per schedule() call actually made")
    if args.cli:
        import subprocess
        import sys
        import tempfile
        for policy in args.policies.split(","):
            cmd = [sys.executable, "-m", "sarathi_lab.cli.main", f"scheduler={policy}",
                   "trace=azure_conv", f"trace.num_requests={args.requests}",
                   f"trace.qps={args.qps}", "trace.max_total_tokens=4096", "model=llama-2-70b",
                   "executor.tensor_parallel=2", "scheduler.max_num_seqs=128",
                   *(["scheduler.token_budget=512"] if policy == "sarathi" else []),
                   "progress=false",
                   f"hydra.run.dir={tempfile.mkdtemp()}"]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            print(f"whole command, {policy}: {time.perf_counter() - t0:.2f} s "
                  "(start-up, trace, simulation, requests/iterations parquet, summary)")


if __name__ == "__main__":
    main()
