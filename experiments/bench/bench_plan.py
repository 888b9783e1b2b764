"""Planner speed: configurations evaluated (each with its capacity) per wall-clock minute.

The target (issue 26): >= 200 configurations with their capacities in <= 15 minutes on a 2-core
machine, in-process (no start-up per run). The space: Llama-3-8B on A100 / H100 / H200 x TP
1/2/4/8 x colocated / disaggregated 1:1, 1:2, 2:1 x sarathi (budgets 256, 512, 1024, 2048) / vllm
= 240 configurations (no pipeline stages: disaggregated pools run none, so half a PP 1/2 space
would be pruned unrun), each searched for the fewest units that serve the load and that
deployment's capacity, on Azure-conversation lengths at 20 req/s under Llama-3-8B's strict SLO.
The trace's requests longer than the model's 8,192-token context are left out
(trace.max_total_tokens, as the planning study does): probes draw lengths from the whole trace,
whose longest request (14,089 tokens) no rate could serve. Prints the tally, the wall time, the
time per configuration and the load average (this machine is shared: say so beside any figure).

    python experiments/bench/bench_plan.py [--requests 300] [--n-jobs 2] [--out DIR] [--small]
"""
from __future__ import annotations

import argparse
import collections
import os
import tempfile
import time
from pathlib import Path

from sarathi_lab.plan import table
from sarathi_lab.plan.search import run_plan
from sarathi_lab.sweeps.bookkeeping import compose_config


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300,
                    help="requests per unit (a deployment of k units replays k x as many)")
    ap.add_argument("--load", type=float, default=20.0, help="req/s to serve")
    ap.add_argument("--n-jobs", type=int, default=2, help="joblib processes")
    ap.add_argument("--out", default=None, help="the plan's directory (default: a fresh temp one)")
    ap.add_argument("--small", action="store_true", help="one hardware, colocated: 20 configs")
    args = ap.parse_args()
    base = ["model=llama-3-8b", "trace=azure_conv", f"trace.num_requests={args.requests}",
            "trace.max_total_tokens=8192"]
    p = compose_config(base, "plan")["plan"]
    p["space"].update(
        hardware=["a100-80gb"] if args.small else ["a100-80gb", "h100-sxm", "h200"],
        layout={"tensor_parallel": [1, 2, 4, 8]},
        split=["colocated"] if args.small else ["colocated", "1:1", "1:2", "2:1"],
        policy=["sarathi", "vllm"], token_budget=[256, 512, 1024, 2048], max_replicas=32)
    p.update(load_qps=args.load, backend="joblib", n_jobs=args.n_jobs)
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_plan_"))
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    rows = run_plan(p, base, out, log=lambda s: None)
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()
    df = table.ranked(rows)
    table.write(df, out)
    n = collections.Counter(df["status"])
    evaluated = n["feasible"] + n["infeasible"]
    sims = int(df["simulations"].fillna(0).sum())
    cpu = float(df["cpu_s"].fillna(0).sum())   # the workers' own CPU time, whatever the load
    print(table.format_table(df, 5))
    print(f"\n{len(df)} configurations: {evaluated} evaluated with their capacities "
          f"({n['feasible']} feasible, {n['infeasible']} infeasible), {n['pruned']} pruned "
          f"before running; {sims} simulations of {args.requests} requests")
    print(f"wall {wall:.0f} s = {wall / 60:.1f} min with {args.n_jobs} joblib processes: "
          f"{wall / max(evaluated, 1):.2f} s per configuration, "
          f"{wall / max(sims, 1) * 1e3:.0f} ms per simulation")
    print(f"CPU {cpu:.0f} s in the workers: {cpu / max(evaluated, 1):.2f} CPU-s per "
          f"configuration, so {cpu / args.n_jobs / 60:.1f} min on {args.n_jobs} idle cores")
    print(f"load average (1/5/15 min) at start {load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}, "
          f"at end {load1[0]:.1f}/{load1[1]:.1f}/{load1[2]:.1f}; {os.cpu_count()} CPUs")
    print(f"plan directory: {out}")


if __name__ == "__main__":
    main()
