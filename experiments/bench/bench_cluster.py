"""Fleet simulation speed: 10,000 requests over 8 replicas, each router, against the floor.

The floor is the same work without a fleet: the 8 replicas' shares of the trace (round-robin
split, each at 1/N of the rate) simulated one engine after another with `Engine.run`. A fleet can
only add the driver's own cost (routing, picking the engine furthest behind) and the decode runs
cut at arrivals. Mistral-7B on A100s (the defaults), ShareGPT lengths, Poisson arrivals at
2.5 req/s per replica; prefix_affinity gets prefix caching on (its prompts carry no token ids in
this trace, so it routes by load: the cost of asking 8 caches per arrival is what is measured).

    python experiments/bench/bench_cluster.py [--requests 10000] [--replicas 8]
        [--qps-per-replica 2.5]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sarathi_lab.engine import Engine
from sarathi_lab.registry import router_class
from sarathi_lab.run.config import resolve
from sarathi_lab.run.runner import build
from sarathi_lab.topology.fleet import Fleet
from sarathi_lab.traces import load_trace, to_requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/, for studies.py
from studies import compose  # noqa: E402

ROUTERS = ("round_robin", "least_loaded", "power_of_two", "prefix_affinity")


def config(prefix_caching: bool) -> dict:
    return compose([f"scheduler.enable_prefix_caching={prefix_caching}", "progress=false"])


def engines(c: dict, n: int) -> list[Engine]:
    r = resolve(c)
    return [Engine(*build(c, r)) for _ in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--qps-per-replica", type=float, default=2.5)
    args = ap.parse_args()
    n = args.replicas
    df = load_trace("sharegpt", num_requests=args.requests, qps=args.qps_per_replica * n, seed=0)
    print(f"{len(df)} requests, {n} replicas, {args.qps_per_replica * n:g} req/s in all; mean "
          f"prompt {df.num_prompt_tokens.mean():.0f}, output {df.num_output_tokens.mean():.0f}")

    print(f"\n{'':34}{'wall s':>8}{'x floor':>9}{'req/s':>9}{'iterations':>12}{'stepped':>9}"
          f"{'tables+summary s':>18}")
    floors = {}
    for caching in (False, True):
        # the floor: each replica's round-robin share alone, one engine after another
        alone = engines(config(caching), n)
        reqs = to_requests(df)
        t0 = time.perf_counter()
        for j, e in enumerate(alone):
            e.run(reqs[j::n])
        floors[caching] = floor = time.perf_counter() - t0
        iters = sum(e.num_iterations for e in alone)
        steps = sum(len(e.rows) for e in alone)
        label = f"floor: {n} x Engine.run" + (", prefix cache" if caching else "")
        print(f"{label:34}{floor:8.2f}{1:9.2f}{len(reqs) / floor:9.0f}{iters:12d}"
              f"{steps / iters:9.1%}")
    for name in ROUTERS:
        caching = name == "prefix_affinity"
        c = config(caching)
        cls = router_class(name)
        fleet = Fleet(engines(c, n), cls(cls.config_class(), n, 0))
        reqs = to_requests(df)
        t0 = time.perf_counter()
        fleet.run(reqs)
        wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        req_df, it_df = fleet.tables(reqs)
        s = fleet.summarize(req_df, it_df, slo=c["slo"])
        post = time.perf_counter() - t1
        iters = s["num_iterations"]
        steps = sum(len(e.rows) for e in fleet.engines)
        assert s["num_finished"] + s["num_rejected"] + s["num_length_capped"] == len(reqs)
        print(f"{name:34}{wall:8.2f}{wall / floors[caching]:9.2f}{len(reqs) / wall:9.0f}"
              f"{iters:12d}{steps / iters:9.1%}{post:18.2f}")


if __name__ == "__main__":
    main()
