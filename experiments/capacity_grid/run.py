"""capacity_grid: the capacity of request_level, orca, vllm and sarathi for Mistral-7B on one
A100 and Yi-34B on two (tensor parallel 2), on the ShareGPT-4 and arXiv-summarization length
traces, under Sarathi-Serve's strict and relaxed SLOs, over several seeds
(experiments/capacity_grid/README.md).

    python experiments/capacity_grid/run.py                  # ~30 min on 2 shared cores
    python experiments/capacity_grid/run.py --root /tmp/x --out /tmp/x/out --requests 60 \
        --seeds 0 1 --models mistral-7b capacity.max_probes=3    # extra Hydra overrides

For each model and SLO (strict, relaxed) one sweep, `sarathi-lab -m experiment=capacity_grid
model=M executor.tensor_parallel=TP slo=M-KIND scheduler.token_budget=B` (B = 512 strict, 2048
relaxed: Sarathi's budget, as the paper sets it; the other policies do not read it), over
scheduler x trace x seed, jobs in parallel. A seed draws its own random sample of the trace
(`trace.shuffle`) and its own arrivals. Then, in `--out`:

- `runs.csv`: one row per search (every seed kept): capacity, the bracket, and which part of the
  criterion failed at the first failing probe (`binding`);
- `cells.csv`: per model, trace, SLO and policy, the capacity's mean, std, min and max over seeds;
- `ratios.csv`: per cell, sarathi/vllm and sarathi/orca computed seed by seed (same requests,
  same arrivals), their mean, min and max;
- `capacity_grid.png`, `run_info.json` (commit, load, wall time).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments"))
from studies import seed_spread, show, start_info, sweep, write_run_info  # noqa: E402

MODELS = {"mistral-7b": 1, "yi-34b": 2}   # model -> GPUs (tensor parallel)
BUDGETS = {"strict": 512, "relaxed": 2048}   # SLO kind -> Sarathi's token budget
POLICIES = ("request_level", "orca", "vllm", "sarathi")
TRACES = ("sharegpt", "arxiv")
CELL = ["model", "trace", "slo_kind", "policy"]


def binding(res: dict) -> str:
    """Which part of Sarathi-Serve's criterion failed at the lowest failing probe of a search:
    'P99 TBT', 'scheduling delay', both, 'rejections', 'none' when nothing failed, or the
    probe's steady-state verdict ('unstable', 'undetermined') when that alone failed it."""
    r = res["criteria"]["tbt"]
    if r["fails_at_qps"] is None:
        return "none"
    slo = res["slo"]
    p = next(p for p in res["probes"] if abs(p["qps"] - r["fails_at_qps"]) <= 1e-9)
    parts = [name for name, bad in (
        ("P99 TBT", p["tbt_p99"] is None or p["tbt_p99"] > slo["p99_tbt"]),
        ("scheduling delay", p["scheduling_delay_p50"] is None
         or p["scheduling_delay_p50"] > slo.get("max_median_scheduling_delay", 2.0)),
        ("rejections", p["num_rejected"] > 0)) if bad]
    if not parts and p.get("stability") not in (None, "stable"):
        # a growing backlog fails the probe whatever its percentiles (capacity.Prober)
        parts = [p["stability"]]
    return " + ".join(parts)


def runs_table(sweeps):
    """One row per capacity search below `sweeps`."""
    import pandas as pd

    from sarathi_lab.report import capacity_table
    cap = capacity_table(sweeps)
    cap = cap[cap["criterion"] == "tbt"]
    rows = []
    for _, r in cap.iterrows():
        res = json.loads((Path(r["run_dir"]) / "capacity.json").read_text())
        cfg = res["config"]
        rows.append({
            "model": r["model"], "tensor_parallel": cfg["executor"]["tensor_parallel"],
            "trace": r["trace"], "slo": r["slo"], "slo_kind": r["slo"].rsplit("-", 1)[-1],
            "policy": r["policy"], "seed": cfg["seed"],
            "token_budget": cfg["scheduler"].get("token_budget") if r["policy"] == "sarathi"
            else None,
            "capacity_qps": r["capacity_qps"], "fails_at_qps": r["fails_at_qps"],
            "bracketed": r["bracketed"], "binding": binding(res), "probes": r["probes"],
            "num_requests": res["num_requests"], "trace_dropped": res.get("trace_dropped", 0),
            "max_model_len": cfg["model"]["max_model_len"], "run_dir": r["run_dir"]})
    order = {p: i for i, p in enumerate(POLICIES)}
    df = pd.DataFrame(rows)
    return df.sort_values(["model", "trace", "slo_kind", "policy", "seed"],
                          key=lambda s: s.map(order) if s.name == "policy" else s,
                          ignore_index=True)


def cells_table(runs):
    """Capacity per cell: mean and spread over seeds, and which criterion bound in how many."""
    cells = seed_spread(runs, CELL, ["capacity_qps"])
    bind = runs.groupby(CELL, sort=False)["binding"].agg(
        lambda b: "; ".join(f"{k} x{v}" for k, v in b.value_counts().items()))
    return cells.merge(bind.rename("binding").reset_index(), on=CELL)


def ratios_table(runs):
    """sarathi/vllm and sarathi/orca per cell, seed by seed, then their mean and spread."""
    wide = runs.pivot_table(index=["model", "trace", "slo_kind", "seed"], columns="policy",
                            values="capacity_qps").reset_index()
    for other in ("vllm", "orca"):
        wide[f"sarathi_over_{other}"] = wide["sarathi"] / wide[other]
    return seed_spread(wide, ["model", "trace", "slo_kind"],
                       ["sarathi_over_vllm", "sarathi_over_orca"])


def plot(cells, out: Path) -> Path:
    """Mean capacity per policy with the seeds' min-max, a panel per model and SLO."""
    import numpy as np
    from matplotlib.figure import Figure

    from sarathi_lab.plots import series_colors
    models = list(dict.fromkeys(cells["model"]))
    kinds = [k for k in BUDGETS if k in set(cells["slo_kind"])]
    traces = list(dict.fromkeys(cells["trace"]))
    policies = [p for p in POLICIES if p in set(cells["policy"])]
    colors = series_colors(cells.assign(series=cells["policy"]))
    fig = Figure(figsize=(4.2 * len(kinds), 3.2 * len(models)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(models), len(kinds), squeeze=False))
    w = 0.8 / len(policies)
    for i, m in enumerate(models):
        for j, k in enumerate(kinds):
            ax = axes[i, j]
            for n, p in enumerate(policies):
                d = cells[(cells["model"] == m) & (cells["slo_kind"] == k)
                          & (cells["policy"] == p)].set_index("trace").reindex(traces)
                x = np.arange(len(traces)) + (n - (len(policies) - 1) / 2) * w
                mean = d["capacity_qps_mean"].to_numpy(float)
                err = np.vstack([mean - d["capacity_qps_min"], d["capacity_qps_max"] - mean])
                ax.bar(x, mean, w * 0.95, yerr=err, capsize=2, color=colors[p], label=p)
            ax.set_yscale("log")
            ax.set_xticks(np.arange(len(traces)), traces)
            ax.set_title(f"{m} (TP{MODELS.get(m, '?')}), {k} SLO", fontsize=9)
            ax.set_ylabel("capacity (req/s)")
            ax.grid(True, axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=7, frameon=False)
    fig.suptitle("Capacity within Sarathi-Serve's SLO: mean over seeds, bars = min-max",
                 fontsize=10)
    path = out / "capacity_grid.png"
    fig.savefig(path, dpi=130)
    return path


def run_study(root: Path, out: Path, requests: int, seeds, models, traces, jobs: int,
              overrides: list[str]):
    """Every sweep, then the tables and the plot in `out`; returns (runs, cells, ratios)."""
    sweeps = []
    for model in models:
        for kind, budget in BUDGETS.items():
            sweeps.append(sweep("capacity_grid", root, f"capacity_grid_{model}_{kind}", [
                f"model={model}", f"executor.tensor_parallel={MODELS[model]}",
                f"slo={model}-{kind}", f"scheduler.token_budget={budget}",
                f"scheduler={','.join(POLICIES)}", f"trace={','.join(traces)}",
                f"seed={','.join(map(str, seeds))}", f"trace.num_requests={requests}",
                "hydra/launcher=parallel", f"hydra.launcher.n_jobs={jobs}", *overrides]))
    out.mkdir(parents=True, exist_ok=True)
    runs = runs_table(sweeps)
    cells, ratios = cells_table(runs), ratios_table(runs)
    runs.drop(columns="run_dir").to_csv(out / "runs.csv", index=False)
    cells.to_csv(out / "cells.csv", index=False)
    ratios.to_csv(out / "ratios.csv", index=False)
    plot(cells, out)
    return runs, cells, ratios


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(REPO / "outputs"), help="results_root of the sweeps")
    ap.add_argument("--out", default=str(REPO / "results" / "capacity_grid"))
    ap.add_argument("--requests", type=int, default=500, help="requests per probe")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    ap.add_argument("--jobs", type=int, default=2, help="parallel jobs per sweep")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every sweep")
    a = ap.parse_args(argv)
    if a.requests < 2 or a.jobs < 1 or min(a.seeds) < 0:
        ap.error("--requests must be >= 2, --jobs >= 1 and seeds >= 0")
    start = start_info()
    out = Path(a.out)
    runs, cells, ratios = run_study(Path(a.root).resolve(), out, a.requests, a.seeds, a.models,
                                    a.traces, a.jobs, a.overrides)
    write_run_info(out, start, "experiments/capacity_grid/run.py", argv or sys.argv[1:])
    show(cells, ratios)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
