"""Routing study: P99 TTFT, P99 TBT and goodput of 4 and 8 replicas under each router, with and
without shared prompt prefixes.

Every replica: Mistral-7B on one A100-80GB (simulated), Sarathi-Serve (token budget 512), prefix
caching on for every router (so the routers differ only in where they send requests). Requests:
ShareGPT-4 lengths (prompt + output <= 4,096), Poisson arrivals at `--qps` per replica, each prompt
opened by a 2,048-token context (a long system prompt, few-shot examples or a document):

- `shared`: one of 400 contexts, drawn with Zipf(1) popularity. The 400 contexts hold 819k
  tokens: about one replica's whole KV cache (927k tokens), so a replica that sees every context
  keeps evicting them, while a fleet that partitions them keeps them all.
- `unique`: the same lengths, each request its own random context: nothing to share.

Goodput: requests meeting DistServe's chat SLO (TTFT <= 2.5 s, TPOT <= 0.15 s) per second.
One command writes results/routing/routing.csv and prints the table:

    python experiments/routing/run.py [--replicas 4 8] [--qps 1.5 2.5 3.5] [--per-replica 300]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from studies import compose  # noqa: E402

ROUTERS = {   # label: cluster settings
    "round_robin": {"router": "round_robin"},
    "least_loaded": {"router": "least_loaded"},
    "power_of_two": {"router": "power_of_two"},
    "prefix_affinity": {"router": "prefix_affinity"},
    # hot contexts would pile onto one replica: give a hit up beyond this many tokens of
    # imbalance (about 5 average requests' prompts; not fitted)
    "prefix_affinity+balance": {"router": "prefix_affinity", "balance_tokens": 16384},
}
OUT = Path(__file__).resolve().parents[2] / "results" / "routing"


def config(replicas: int, cluster: dict) -> dict:
    return compose(["slo=distserve-chat", "scheduler.enable_prefix_caching=true",
                    "progress=false", f"cluster.num_replicas={replicas}",
                    *(f"cluster.{k}={v}" for k, v in cluster.items())])


def workload(n: int, qps: float, shared: bool, *, contexts=400, context_len=2048, zipf=1.0,
             vocab=32000, seed=0):
    """ShareGPT lengths behind a context of `context_len` tokens: one of `contexts` shared ones
    (Zipf popularity) or, unshared, a random one per request. Both variants draw the same
    lengths, arrivals and suffix ids."""
    from sarathi_lab.traces import load_trace, to_requests
    df = load_trace("sharegpt", num_requests=n, qps=qps, seed=seed,
                    max_total_tokens=4096).reset_index(drop=True)
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, vocab, (contexts, context_len)).tolist()
    pop = 1.0 / np.arange(1, contexts + 1) ** zipf
    which = rng.choice(contexts, len(df), p=pop / pop.sum())
    own = np.random.default_rng(seed + 1)
    ids = []
    for k, p in zip(which.tolist(), df["num_prompt_tokens"].tolist()):
        head = pool[k] if shared else own.integers(0, vocab, context_len).tolist()
        ids.append(head + rng.integers(0, vocab, p).tolist())
    df["prompt_token_ids"] = ids
    df["num_prompt_tokens"] = df["num_prompt_tokens"] + context_len
    return to_requests(df)


def one(replicas: int, label: str, qps: float, shared: bool, n: int) -> dict:
    from sarathi_lab.run.runner import run
    c = config(replicas, ROUTERS[label])
    reqs = workload(n, qps * replicas, shared)
    t0 = time.perf_counter()
    s = run(c, None, requests=reqs, write=False)
    served = [p["num_requests"] for p in s["replicas"]]
    return {
        "replicas": replicas, "qps_per_replica": qps,
        "prefixes": "shared" if shared else "unique", "router": label,
        "p99_ttft_s": s["ttft"]["p99"], "p50_ttft_s": s["ttft"]["p50"],
        "p99_tbt_s": s["tbt"]["p99"],
        "goodput_rps": s["slo"]["goodput_rps"], "attainment": s["slo"]["attainment"],
        "prefix_hit_rate": s["prefix_cache"]["hit_rate"],
        "imbalance": max(served) / (sum(served) / len(served)),
        "preemptions": s["preemptions"], "num_rejected": s["num_rejected"],
        "wall_s": time.perf_counter() - t0,
    }


def study(replicas, qps_list, per_replica: int):
    import pandas as pd
    rows = []
    for r in replicas:
        for qps in qps_list:
            for shared in (False, True):
                for label in ROUTERS:
                    row = one(r, label, qps, shared, per_replica * r)
                    rows.append(row)
                    print(f"{r} replicas, {qps:g} req/s each, {row['prefixes']:6} "
                          f"{label:24} P99 TTFT {row['p99_ttft_s']:7.2f} s  P99 TBT "
                          f"{row['p99_tbt_s'] * 1e3:5.0f} ms  goodput {row['goodput_rps']:5.2f}"
                          f"  hits {row['prefix_hit_rate']:.0%}  ({row['wall_s']:.1f} s)",
                          flush=True)
    return pd.DataFrame(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--qps", type=float, nargs="+", default=[1.5, 2.5, 3.5], help="per replica")
    ap.add_argument("--per-replica", type=int, default=300, help="requests per replica")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    df = study(args.replicas, args.qps, args.per_replica)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "routing.csv", index=False, float_format="%.4g")
    print(f"\n{args.out / 'routing.csv'}")


if __name__ == "__main__":
    main()
