"""Disaggregation study: goodput per GPU of colocated Sarathi-Serve against disaggregated
prefill/decode at matched GPU counts, over P:D ratios and link bandwidths, on a chat trace and a
summarization trace.

Every configuration has 4 GPUs: Llama-3-8B on simulated H100-SXMs, one GPU per replica.

- colocated: 4 Sarathi-Serve replicas behind a least-loaded router, token budget 512 and 2048;
- disaggregated: 1P3D, 2P2D, 3P1D (prefill replicas running whole prompts, vLLM's prefill-first
  batching; decode replicas running Sarathi-Serve's decode-first batches), least-loaded routers
  in both pools, the KV moved over NVLink, InfiniBand (one NDR NIC per GPU), PCIe Gen5, or a
  link of 5 or 1.25 GB/s (40 and 10 Gb/s Ethernet-class, efficiency and latency of the preset's
  NIC); all five for chat, the last three for summarization.

Goodput per GPU is DistServe's: the highest Poisson arrival rate at which >= 90% of requests
meet the SLO (capacity search, `mode=capacity`, attainment criterion), over the 4 GPUs.
Traces and SLOs: ShareGPT (chat) under DistServe's chat SLO for 13B-class models (TTFT 0.25 s,
TPOT 0.1 s), arXiv summarization under DistServe's summarization SLO (TTFT 15 s, TPOT 0.15 s).
One command writes results/disaggregation/capacity.csv (a row per configuration), probes.csv
(every probe of every search) and capacity.png, and prints the table:

    python experiments/disaggregation/run.py [--requests 400] [--precision 0.04] [--jobs 2]
"""
from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from studies import compose  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "results" / "disaggregation"
BASE = ["model=llama-3-8b", "hardware=h100-sxm", "progress=false", "mode=capacity",
        "capacity.criteria=[attainment]", "capacity.qps_low=1", "capacity.qps_high=16"]
WORKLOADS = {   # label: trace and SLO
    "chat": ["trace=sharegpt", "slo=distserve-chat-13b"],
    "summarization": ["trace=arxiv", "slo=distserve-summarization"],
}
GPUS = 4
RATIOS = [(1, 3), (2, 2), (3, 1)]
LINKS = {   # label: cluster settings
    "nvlink": ["cluster.link=nvlink"],
    "infiniband": ["cluster.link=net"],
    "pcie": ["cluster.link=pcie"],
    "5GB/s": ["cluster.link=net", "cluster.link_bandwidth=5e9"],
    "1.25GB/s": ["cluster.link=net", "cluster.link_bandwidth=1.25e9"],
}
# the preset links matter little next to the slower ones: all of them for chat, the slower
# ones for summarization (time: the whole study stays within ~15 minutes on 2 loaded cores)
DEFAULT_LINKS = {"chat": list(LINKS), "summarization": ["infiniband", "5GB/s", "1.25GB/s"]}
BUDGETS = [512, 2048]


def configs(workloads, ratios, links, budgets) -> list[tuple[dict, list[str]]]:
    """(row labels, overrides) of every configuration of the study."""
    out = []
    for w in workloads:
        for b in budgets:
            out.append(({"workload": w, "system": f"colocated-{b}", "prefill": 0, "decode": 0,
                         "link": ""},
                        [*WORKLOADS[w], f"cluster.num_replicas={GPUS}",
                         "cluster.router=least_loaded", f"scheduler.token_budget={b}"]))
        for p, d in ratios:
            pools = ["cluster=disagg", f"cluster.prefill.num_replicas={p}",
                     f"cluster.decode.num_replicas={d}", "cluster.prefill.scheduler.name=vllm"]
            pools += ["cluster.prefill.router=least_loaded"] if p > 1 else []
            pools += ["cluster.decode.router=least_loaded"] if d > 1 else []
            for link in links or DEFAULT_LINKS[w]:
                out.append(({"workload": w, "system": f"{p}P{d}D", "prefill": p, "decode": d,
                             "link": link}, [*WORKLOADS[w], *pools, *LINKS[link]]))
    return out


def one(labels: dict, overrides: list[str], requests: int,
        precision: float) -> tuple[dict, list[dict]]:
    """The capacity of one configuration and its figures at that rate; its probes."""
    import tempfile

    from sarathi_lab.capacity import search
    from sarathi_lab.runner import run
    c = compose([*BASE, *overrides, f"trace.num_requests={requests}",
                 f"capacity.precision={precision}"])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        found = search(c, tmp)
    res = found["criteria"]["attainment"]
    probes = [{**labels, **p} for p in found["probes"]]
    row = {**labels, "capacity_qps": res["capacity_qps"], "fails_at_qps": res["fails_at_qps"],
           "bracketed": res["bracketed"], "num_gpus": res["num_gpus"],
           "goodput_per_gpu": res["capacity_qps_per_gpu"]}
    if res["capacity_qps"]:   # the run at capacity: where the time goes
        c["mode"] = "run"
        c["trace"] = {**c["trace"], "qps": res["capacity_qps"]}
        s = run(c, None, write=False)
        row.update(attainment=s["slo"]["attainment"], ttft_p90_s=s["ttft"]["p90"],
                   tpot_p90_s=s["tpot"]["p90"], tbt_p99_s=s["tbt"]["p99"])
        if "transfers" in s:
            t = s["transfers"]
            row.update(transfer_p50_ms=t["time_s"]["p50"] * 1e3,
                       transfer_wait_p90_ms=t["wait_s"]["p90"] * 1e3,
                       kv_gb_per_request=t["bytes"]["mean"] / 1e9,
                       prefill_busy=s["pools"]["prefill"]["utilization"],
                       decode_busy=s["pools"]["decode"]["utilization"])
    row["wall_s"] = time.perf_counter() - t0
    return row, probes


def study(workloads, ratios, links, budgets, requests: int, precision: float, jobs: int):
    """(one row per configuration, every probe of every search)."""
    import pandas as pd
    todo = configs(workloads, ratios, links, budgets)
    rows, probes = [], []
    pool = ProcessPoolExecutor(jobs) if jobs > 1 else None
    try:
        results = [pool.submit(one, lb, ov, requests, precision) for lb, ov in todo] if pool \
            else (one(lb, ov, requests, precision) for lb, ov in todo)
        for f in results:
            r, p = f.result() if pool else f
            rows.append(r)
            probes += p
            print(f"{r['workload']:13} {r['system']:13} {r['link']:10} capacity "
                  f"{r['capacity_qps']:6.2f} req/s = {r['goodput_per_gpu']:5.2f} per GPU "
                  f"({r['wall_s']:.0f} s)", flush=True)
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
    return pd.DataFrame(rows), pd.DataFrame(probes)


def plot(df, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    workloads = list(dict.fromkeys(df["workload"]))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        sub = df[df["workload"] == w]
        dis = sub[sub["prefill"] > 0]
        for link, g in dis.groupby("link", sort=False):
            g = g.sort_values("prefill")
            ax.plot(g["system"], g["goodput_per_gpu"], marker="o", label=f"disagg, {link}")
        for (_, r), ls in zip(sub[sub["prefill"] == 0].iterrows(), ("--", ":")):
            ax.axhline(r["goodput_per_gpu"], color="k", linestyle=ls, label=r["system"])
        ax.set_title(f"{w} ({GPUS} GPUs)")
        ax.set_xlabel("prefill:decode replicas")
        ax.set_ylabel("goodput per GPU (req/s at 90% attainment)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--ratios", nargs="+", default=[f"{p}:{d}" for p, d in RATIOS],
                    help="prefill:decode replicas, summing to 4")
    ap.add_argument("--links", nargs="+", default=None, choices=list(LINKS),
                    help="for every workload (default: all for chat; infiniband, 5GB/s, "
                         "1.25GB/s for summarization)")
    ap.add_argument("--budgets", type=int, nargs="+", default=BUDGETS,
                    help="colocated Sarathi-Serve token budgets")
    ap.add_argument("--requests", type=int, default=400, help="requests per probe")
    ap.add_argument("--precision", type=float, default=0.04,
                    help="capacity search: stop when high - low <= precision x low")
    ap.add_argument("--jobs", type=int, default=2, help="configurations searched in parallel")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    ratios = [tuple(int(x) for x in r.split(":")) for r in args.ratios]
    if any(p < 1 or d < 1 or p + d != GPUS for p, d in ratios):
        ap.error(f"--ratios: P:D with P, D >= 1 and P + D = {GPUS}")
    t0 = time.perf_counter()
    df, probes = study(args.workloads, ratios, args.links, args.budgets, args.requests,
                       args.precision, args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "capacity.csv", index=False, float_format="%.4g")
    probes.to_csv(args.out / "probes.csv", index=False, float_format="%.4g")
    plot(df, args.out / "capacity.png")
    print(f"\n{args.out / 'capacity.csv'} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
