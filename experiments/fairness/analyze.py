"""The fairness study's tables and figures from its sweep (configs/experiment/fairness.yaml).

    python experiments/fairness/analyze.py outputs/sweeps/fairness results/fairness

Writes fairness.csv (one row per run: policy, load, Jain's index over the tenants' service,
over the share of its demand each got, and over the service by the last arrival; the heavy
tenant's and the light tenants' TTFT and service share), tenants.csv (one row per run and
tenant), service_over_time.png (each tenant's cumulative service, weighted tokens, at the
highest load, one panel per policy) and tenant_ttft.png (each tenant's median and P99 TTFT
there), and prints the tables.

Service is counted as in the summary (sarathi_lab.metrics.service_tokens): a request's prompt
once its first token is out, each output token when it is emitted, weighted 1 and 2.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from sarathi_lab.metrics import SERVICE_WEIGHTS, token_times_flat
from sarathi_lab.plots import _save as save
from sarathi_lab.report import find
from sarathi_lab.run import rundir

HEAVY = "heavy"


def runs(sweep) -> list[tuple[Path, dict]]:
    out = [(d, json.loads((d / rundir.SUMMARY).read_text()))
           for d in find([sweep], rundir.SUMMARY)]
    if not out:
        raise FileNotFoundError(f"{sweep}: no run (summary.json) below it")
    return out


def tables(found) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, tenant_rows = [], []
    for d, s in found:
        policy, qps = s["config"]["scheduler"]["name"], float(s["config"]["trace"]["qps"])
        ten = s["tenants"]
        for name, t in ten.items():
            tenant_rows.append({"policy": policy, "qps": qps, "tenant": name,
                                "requests": t["num_requests"],
                                "ttft_p50_s": t["ttft"]["p50"], "ttft_p99_s": t["ttft"]["p99"],
                                "tbt_p99_s": t["tbt"]["p99"], "attainment": t["attainment"],
                                "service_share": t["service_share"],
                                "demand_share": t["demand_tokens"]
                                / sum(u["demand_tokens"] for u in ten.values()),
                                "served_of_demand_by_last_arrival":
                                    t["service_tokens_by_last_arrival"] / t["demand_tokens"]})
        light = [t for n, t in ten.items() if n != HEAVY]
        f = s["fairness"]
        rows.append({"policy": policy, "qps": qps, "jain": f["jain"],
                     "jain_of_demand_served": f["jain_of_demand_served"],
                     "jain_by_last_arrival": f["jain_by_last_arrival"],
                     "heavy_ttft_p50_s": ten[HEAVY]["ttft"]["p50"],
                     "heavy_ttft_p99_s": ten[HEAVY]["ttft"]["p99"],
                     "light_ttft_p50_s_worst": max(t["ttft"]["p50"] for t in light),
                     "light_ttft_p99_s_worst": max(t["ttft"]["p99"] for t in light),
                     "heavy_service_share": ten[HEAVY]["service_share"],
                     "attainment": s["slo"]["attainment"], "goodput_rps": s["slo"]["goodput_rps"],
                     "throughput_tok_s": s["throughput_tok_s"], "makespan_s": s["makespan_s"]})
    key = ["policy", "qps"]
    return (pd.DataFrame(rows).sort_values(key, ignore_index=True),
            pd.DataFrame(tenant_rows).sort_values(key + ["tenant"], ignore_index=True))


def service_over_time(run_dir: Path, grid: np.ndarray) -> dict[str, np.ndarray]:
    """{tenant: cumulative weighted service at each time of `grid`}."""
    df = pd.read_parquet(run_dir / rundir.REQUESTS,
                         columns=["tenant", "num_prompt_tokens", "token_times"])
    flat, owner = token_times_flat(df)
    tenant = df["tenant"].astype(str).to_numpy()
    first = np.full(len(df), np.inf)
    np.minimum.at(first, owner, flat)
    out = {}
    for name in sorted(set(tenant)):
        mine = tenant == name
        t = np.concatenate([flat[mine[owner]], first[mine & np.isfinite(first)]])
        w = np.concatenate([np.full(int(mine[owner].sum()), SERVICE_WEIGHTS["output"]),
                            SERVICE_WEIGHTS["prompt"]
                            * df["num_prompt_tokens"].to_numpy(float)[mine & np.isfinite(first)]])
        order = np.argsort(t)
        cum = np.concatenate([[0.0], np.cumsum(w[order])])
        out[name] = cum[np.searchsorted(t[order], grid, side="right")]
    return out


def plot_service(found, qps, out: Path) -> Path:
    from matplotlib.figure import Figure
    at = [(d, s) for d, s in found if float(s["config"]["trace"]["qps"]) == qps]
    end = max(s["makespan_s"] for _, s in at)
    grid = np.linspace(0, end, 400)
    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, len(at), sharey=True, squeeze=False)[0]
    for ax, (d, s) in zip(axes, sorted(at, key=lambda x: x[1]["config"]["scheduler"]["name"])):
        last = float(pd.read_parquet(d / rundir.REQUESTS, columns=["arrival_time"]).max().iloc[0])
        for name, cum in service_over_time(d, grid).items():
            heavy = name == HEAVY
            ax.plot(grid, cum / 1e6, color="tab:red" if heavy else "tab:blue",
                    lw=2 if heavy else 0.8, alpha=1 if heavy else 0.6,
                    label=name if heavy else None)
        ax.plot([], [], color="tab:blue", lw=0.8, label="light tenants (chat0..chat8)")
        ax.axvline(last, color="grey", lw=0.8, ls="--", label="last arrival")
        ax.set_title(f"{s['config']['scheduler']['name']}: Jain (by last arrival) "
                     f"{s['fairness']['jain_by_last_arrival']:.2f}", fontsize=10)
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("service received (M weighted tokens)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Per-tenant service over time at {qps:g} req/s (prompt x1, output x2)",
                 fontsize=10)
    return save(fig, out / "service_over_time", ("png",))[0]


def plot_ttft(tenants: pd.DataFrame, qps, out: Path) -> Path:
    from matplotlib.figure import Figure
    t = tenants[tenants["qps"] == qps]
    names = sorted(t["tenant"].unique())
    policies = sorted(t["policy"].unique())
    fig = Figure(figsize=(10, 3.6))
    ax = fig.subplots()
    x = np.arange(len(names))
    w = 0.8 / len(policies)
    for i, pol in enumerate(policies):
        g = t[t["policy"] == pol].set_index("tenant").loc[names]
        ax.bar(x + i * w, g["ttft_p99_s"], w, label=f"{pol} P99", alpha=0.5)
        ax.bar(x + i * w, g["ttft_p50_s"], w * 0.5, label=f"{pol} P50")
    ax.set_xticks(x + w * (len(policies) - 1) / 2, names)
    ax.set_yscale("log")
    ax.axhline(2.5, color="grey", lw=0.8, ls="--")
    ax.set_ylabel("TTFT (s)")
    ax.legend(fontsize=8, ncol=2)
    ax.set_title(f"Per-tenant TTFT at {qps:g} req/s (dashed: 2.5 s SLO)", fontsize=10)
    return save(fig, out / "tenant_ttft", ("png",))[0]


def main(sweep: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    found = runs(sweep)
    df, tenants = tables(found)
    df.to_csv(out / "fairness.csv", index=False)
    tenants.to_csv(out / "tenants.csv", index=False)
    top = df["qps"].max()
    plot_service(found, top, out)
    plot_ttft(tenants, top, out)
    pd.set_option("display.width", 250)
    print(df.round(3).to_string(index=False))
    print(tenants[tenants["qps"] == top].round(3).to_string(index=False))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
