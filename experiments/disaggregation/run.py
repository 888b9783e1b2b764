"""Disaggregation study: goodput per GPU of colocated Sarathi-Serve against disaggregated
prefill/decode at matched GPU counts, over P:D ratios and link bandwidths, on a chat trace and a
summarization trace.

Every configuration has 4 GPUs: Llama-3-8B on simulated H100-SXMs, one GPU per replica.

- colocated: 4 replicas behind a least-loaded router: Sarathi-Serve with a token budget of 512
  and of 2048, and vLLM (whole prompts first, the baseline DistServe compared against);
- disaggregated: 1P3D, 2P2D, 3P1D (prefill replicas running whole prompts, vLLM's prefill-first
  batching; decode replicas running Sarathi-Serve's decode-first batches), least-loaded routers
  in both pools, the KV moved over NVLink, InfiniBand (one NDR NIC per GPU), PCIe Gen5, or a
  link of 5 or 1.25 GB/s (40 and 10 Gb/s Ethernet-class, efficiency and latency of the preset's
  NIC): InfiniBand and 1.25 GB/s at every ratio, the others at 2P2D (NVLink and PCIe for chat).

Part A, goodput per GPU as DistServe defines it: the highest Poisson arrival rate at which >= 90%
of requests meet the SLO (a capacity search, `mode=capacity`, attainment criterion), over the 4
GPUs. Chat: ShareGPT under DistServe's chat SLO for 13B-class models (TTFT 0.25 s, TPOT 0.1 s).
Summarization: arXiv under distserve-summarization-13b (TTFT 1.5 s, TPOT 0.1 s: DistServe's
66B summarization SLO scaled as DistServe scales its chat SLO from 66B to 13B; our derivation).

Part B, where the TPOT target decides (DistServe's Figure 8 method): chat over InfiniBand, every
system run at a grid of rates, the attainment of TTFT <= 0.25 s with TPOT <= 100, 40 (DistServe's
tightest SLO scale, 0.4) and 20 ms counted from the same runs, the capacity where it crosses 90%
(linear between grid points).

One command writes results/disaggregation/capacity.csv (part A, a row per configuration),
probes.csv (every probe of its searches), tpot_sweep.csv (part B: attainment per rate and TPOT
target, and the crossings), capacity.png and tpot_sweep.png, and prints the tables:

    python experiments/disaggregation/run.py [--requests 600] [--precision 0.06] [--jobs 2]
    python experiments/disaggregation/run.py --steady 2000   # the leading chat systems, longer
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
BASE = ["model=llama-3-8b", "hardware=h100-sxm", "progress=false"]
CAPACITY = ["mode=capacity", "capacity.criteria=[attainment]", "capacity.qps_low=2",
            "capacity.qps_high=16"]
WORKLOADS = {   # label: trace and SLO
    "chat": ["trace=sharegpt", "slo=distserve-chat-13b"],
    "summarization": ["trace=arxiv", "slo=distserve-summarization-13b"],
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
# InfiniBand and the slowest link at every ratio, the others at 2P2D, NVLink and PCIe for chat
# only (time: the whole study stays within ~15 minutes on 2 loaded cores)
EVERY_RATIO = ["infiniband", "1.25GB/s"]
AT_2P2D = {"chat": ["nvlink", "infiniband", "pcie", "5GB/s", "1.25GB/s"],
           "summarization": ["infiniband", "5GB/s", "1.25GB/s"]}
COLOCATED = {   # label: the replicas' scheduler
    "sarathi-512": ["scheduler.token_budget=512"],
    "sarathi-2048": ["scheduler.token_budget=2048"],
    "vllm": ["scheduler=vllm"],
}
# part B: TPOT targets (s) under the chat SLO's TTFT, and the rates every system runs at
TPOTS = [0.1, 0.04, 0.02]
RATES = [2.0, 4.0, 6.0, 9.0, 13.0, 19.0, 28.0]


def default_links(workload: str, ratio: tuple[int, int]) -> list[str]:
    return AT_2P2D[workload] if ratio == (2, 2) else EVERY_RATIO


def systems(workload: str, ratios, links, colocated) -> list[tuple[dict, list[str]]]:
    """(row labels, overrides) of every system of a workload; `links` None: the defaults."""
    out = []
    for name in colocated:
        out.append(({"workload": workload, "system": f"colocated-{name}", "prefill": 0,
                     "decode": 0, "link": ""},
                    [*WORKLOADS[workload], f"cluster.num_replicas={GPUS}",
                     "cluster.router=least_loaded", *COLOCATED[name]]))
    for p, d in ratios:
        pools = ["cluster=disagg", f"cluster.prefill.num_replicas={p}",
                 f"cluster.decode.num_replicas={d}", "cluster.prefill.scheduler.name=vllm"]
        pools += ["cluster.prefill.router=least_loaded"] if p > 1 else []
        pools += ["cluster.decode.router=least_loaded"] if d > 1 else []
        for link in links or default_links(workload, (p, d)):
            out.append(({"workload": workload, "system": f"{p}P{d}D", "prefill": p,
                         "decode": d, "link": link}, [*WORKLOADS[workload], *pools, *LINKS[link]]))
    return out


def figures(s: dict) -> dict:
    """A run's figures at its rate: where the time goes."""
    row = {"attainment": s["slo"]["attainment"], "ttft_p90_s": s["ttft"]["p90"],
           "tpot_p90_s": s["tpot"]["p90"], "tbt_p99_s": s["tbt"]["p99"]}
    if "transfers" in s:
        t = s["transfers"]
        row.update(transfer_p50_ms=t["time_s"]["p50"] * 1e3,
                   transfer_wait_p90_ms=t["wait_s"]["p90"] * 1e3,
                   kv_gb_per_request=t["bytes"]["mean"] / 1e9,
                   prefill_busy=s["pools"]["prefill"]["utilization"],
                   decode_busy=s["pools"]["decode"]["utilization"])
    return row


def search_one(labels: dict, overrides: list[str], requests: int,
               precision: float) -> tuple[dict, list[dict]]:
    """Part A: the capacity of one system and its figures at that rate; its probes."""
    import tempfile

    from sarathi_lab.run.runner import run
    from sarathi_lab.sweeps.capacity import search
    c = compose([*BASE, *CAPACITY, *overrides, f"trace.num_requests={requests}",
                 f"capacity.precision={precision}"])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        found = search(c, tmp)
    res = found["criteria"]["attainment"]
    probes = [{**labels, **p} for p in found["probes"]]
    row = {**labels, "capacity_qps": res["capacity_qps"], "fails_at_qps": res["fails_at_qps"],
           "bracketed": res["bracketed"], "num_gpus": res["num_gpus"],
           "goodput_per_gpu": res["capacity_qps_per_gpu"]}
    if res["capacity_qps"]:
        c["mode"] = "run"
        c["trace"] = {**c["trace"], "qps": res["capacity_qps"]}
        row.update(figures(run(c, None, write=False)))
    row["wall_s"] = time.perf_counter() - t0
    return row, probes


def curve_one(labels: dict, overrides: list[str], requests: int, rate: float) -> list[dict]:
    """Part B: one system at one rate; the attainment of each TPOT target. The arrivals are a
    capacity search's (one unit-rate Poisson sequence stretched to the rate), so the curves
    and part A's probes see the same requests."""
    import tempfile

    import pandas as pd

    from sarathi_lab.metrics import slo_met
    from sarathi_lab.run.runner import run
    from sarathi_lab.sweeps.capacity import unit_arrivals
    from sarathi_lab.traces import build_trace, to_requests
    c = compose([*BASE, *overrides, f"trace.num_requests={requests}", f"trace.qps={rate}"])
    trace = build_trace({**c["trace"], "qps": 1.0})
    trace["arrival_time"] = unit_arrivals(len(trace), "poisson", c["seed"], None) / rate
    with tempfile.TemporaryDirectory() as tmp:
        s = run(c, tmp, requests=to_requests(trace))
        req_df = pd.read_parquet(Path(tmp) / "requests.parquet")
    rows = []
    for tpot in TPOTS:
        slo = {**c["slo"], "tpot": tpot}
        rows.append({**labels, "qps": rate, "tpot_slo_s": tpot, "ttft_slo_s": slo["ttft"],
                     "attainment": float(slo_met(req_df, slo).mean()),
                     "tpot_p90_s": s["tpot"]["p90"], "ttft_p90_s": s["ttft"]["p90"]})
    return rows


def crossing(rates, attainment, target: float = 0.9) -> tuple[float, bool]:
    """The rate where attainment first falls below `target`, linear between grid points
    (DistServe's find_intersection); (rate, bracketed)."""
    for i, a in enumerate(attainment):
        if a < target:
            if i == 0:
                return rates[0], False
            r0, r1, a0, a1 = rates[i - 1], rates[i], attainment[i - 1], a
            return r0 + (target - a0) * (r1 - r0) / (a1 - a0), True
    return rates[-1], False


def parallel(fn, tasks, jobs: int):
    """fn(*task) for every task, in order; in `jobs` processes."""
    if jobs <= 1:
        return [fn(*t) for t in tasks]
    with ProcessPoolExecutor(jobs) as pool:
        futures = [pool.submit(fn, *t) for t in tasks]
        return [f.result() for f in futures]


def part_a(workloads, ratios, links, colocated, requests, precision, jobs):
    import pandas as pd
    todo = [(lb, ov, requests, precision) for w in workloads
            for lb, ov in systems(w, ratios, links, colocated)]
    rows, probes = [], []
    for r, p in parallel(search_one, todo, jobs):
        rows.append(r)
        probes += p
        print(f"{r['workload']:13} {r['system']:13} {r['link']:10} capacity "
              f"{r['capacity_qps']:6.2f} req/s = {r['goodput_per_gpu']:5.2f} per GPU "
              f"({r['wall_s']:.0f} s)", flush=True)
    return pd.DataFrame(rows), pd.DataFrame(probes)


def part_b(ratios, colocated, requests, rates, jobs):
    import pandas as pd
    todo = [(lb, ov, requests, q) for lb, ov in systems("chat", ratios, ["infiniband"], colocated)
            for q in rates]
    grid = pd.DataFrame([row for rows in parallel(curve_one, todo, jobs) for row in rows])
    cross = []
    for (system, tpot), g in grid.groupby(["system", "tpot_slo_s"], sort=False):
        g = g.sort_values("qps")
        q, ok = crossing(g["qps"].tolist(), g["attainment"].tolist())
        cross.append({"system": system, "tpot_slo_s": tpot, "capacity_qps": q,
                      "bracketed": ok, "goodput_per_gpu": q / GPUS})
        print(f"chat, TPOT <= {tpot * 1e3:3.0f} ms  {system:13} capacity "
              f"{'' if ok else 'outside the grid, '}{q:6.2f} req/s = {q / GPUS:5.2f} per GPU",
              flush=True)
    return grid, pd.DataFrame(cross)


def _panels(n: int, width: float, height: float):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return plt, fig, axes[0]


def steady_check(requests: int, precision: float, jobs: int):
    """Part A's search again for the leading chat systems with a longer trace: how far the
    default trace's capacities are from a steady state."""
    import pandas as pd
    keep = {("colocated-vllm", ""), ("colocated-sarathi-2048", ""), ("2P2D", "infiniband")}
    todo = [(lb, ov, requests, precision) for lb, ov in systems("chat", [(2, 2)], None, COLOCATED)
            if (lb["system"], lb["link"]) in keep]
    rows = [{**r, "requests": requests} for r, _ in parallel(search_one, todo, jobs)]
    for r in rows:
        print(f"steady check, {requests} requests: {r['system']:22} {r['link']:10} capacity "
              f"{r['capacity_qps']:6.2f} req/s = {r['goodput_per_gpu']:5.2f} per GPU", flush=True)
    return pd.DataFrame(rows)


def plot_capacity(df, path: Path) -> None:
    """Goodput per GPU by P:D ratio, a line per link; the colocated systems as levels."""
    workloads = list(dict.fromkeys(df["workload"]))
    plt, fig, axes = _panels(len(workloads), 5.5, 4)
    for ax, w in zip(axes, workloads):
        sub = df[df["workload"] == w]
        for link, g in sub[sub["prefill"] > 0].groupby("link", sort=False):
            g = g.sort_values("prefill")
            ax.plot(g["system"], g["goodput_per_gpu"], marker="o", label=f"disaggregated, {link}")
        for (_, r), ls in zip(sub[sub["prefill"] == 0].iterrows(), ("--", ":", "-.")):
            ax.axhline(r["goodput_per_gpu"], color="k", linestyle=ls, label=r["system"])
        ax.set_title(f"{w}, {GPUS} GPUs")
        ax.set_xlabel("prefill:decode replicas")
        ax.set_ylabel("goodput per GPU (req/s, 90% attainment)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_sweep(grid, path: Path) -> None:
    tpots = list(dict.fromkeys(grid["tpot_slo_s"]))
    plt, fig, axes = _panels(len(tpots), 4.5, 3.6)
    for ax, tpot in zip(axes, tpots):
        sub = grid[grid["tpot_slo_s"] == tpot]
        for system, g in sub.groupby("system", sort=False):
            g = g.sort_values("qps")
            ax.plot(g["qps"] / GPUS, g["attainment"] * 100, marker=".", label=system,
                    linestyle="--" if system.startswith("colocated") else "-")
        ax.axhline(90, color="grey", linewidth=0.8)
        ax.set_title(f"chat, TTFT <= 0.25 s, TPOT <= {tpot * 1e3:.0f} ms")
        ax.set_xlabel("per-GPU rate (req/s)")
        ax.set_ylabel("SLO attainment (%)")
        ax.set_ylim(0, 105)
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
                    help="at every ratio (default: infiniband and 1.25GB/s; at 2P2D also 5GB/s, "
                         "and nvlink and pcie for chat)")
    ap.add_argument("--colocated", nargs="+", default=list(COLOCATED), choices=list(COLOCATED))
    ap.add_argument("--requests", type=int, default=600,
                    help="requests per run: enough for a steady state (a few hundred let the "
                         "colocated systems pass a transient and overstate their capacity)")
    ap.add_argument("--precision", type=float, default=0.06,
                    help="part A's search: stop when high - low <= precision x low")
    ap.add_argument("--rates", type=float, nargs="+", default=RATES,
                    help="part B: the rates (req/s, all GPUs) every system runs at")
    ap.add_argument("--no-sweep", action="store_true", help="part A only")
    ap.add_argument("--steady", type=int, default=None, metavar="N",
                    help="instead: search the leading chat systems with N requests per run "
                         "(writes steady.csv)")
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    ratios = [tuple(int(x) for x in r.split(":")) for r in args.ratios]
    if any(p < 1 or d < 1 or p + d != GPUS for p, d in ratios):
        ap.error(f"--ratios: P:D with P, D >= 1 and P + D = {GPUS}")
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.steady:
        steady_check(args.steady, args.precision, args.jobs).to_csv(
            args.out / "steady.csv", index=False, float_format="%.4g")
        print(f"\n{args.out / 'steady.csv'} ({time.perf_counter() - t0:.0f} s)")
        return
    df, probes = part_a(args.workloads, ratios, args.links, args.colocated, args.requests,
                        args.precision, args.jobs)
    df.to_csv(args.out / "capacity.csv", index=False, float_format="%.4g")
    probes.to_csv(args.out / "probes.csv", index=False, float_format="%.4g")
    plot_capacity(df, args.out / "capacity.png")
    if not args.no_sweep:
        grid, cross = part_b(ratios, args.colocated, args.requests, sorted(args.rates),
                             args.jobs)
        grid.to_csv(args.out / "tpot_sweep.csv", index=False, float_format="%.4g")
        cross.to_csv(args.out / "tpot_capacity.csv", index=False, float_format="%.4g")
        plot_sweep(grid, args.out / "tpot_sweep.png")
    print(f"\n{args.out} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
