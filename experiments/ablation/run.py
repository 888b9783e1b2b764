"""ablation: hybrid batching against chunked prefills, Sarathi-Serve's ablation (their Table 6)
in the simulator: Yi-34B on two A100s (tensor parallel 2), ShareGPT-4 and arXiv-summarization
lengths, P50 TTFT and P99 TBT (experiments/ablation/README.md).

    python experiments/ablation/run.py                     # ~2 min on 2 shared cores
    python experiments/ablation/run.py --root /tmp/x --out /tmp/x/out --seeds 0 -- \
        trace.num_requests=20                              # extra Hydra overrides

One sweep per arm and trace, `sarathi-lab -m experiment=ablation ARM trace=T trace.qps=Q,...
seed=...`, each seed its own random sample of the trace (`trace.shuffle`) and arrivals:

  hybrid_only     sarathi, token_budget 8192 = the context: whole prompts ride with the decodes
                  (the paper's own setting for this arm; a prompt is split only when the decodes
                  leave less room than it needs)
  chunking_only   simple_chunking (experiments/ablation/simple_chunking.py, a plug-in loaded by
                  dotted path): 512-token prefill chunks, never in an iteration with a decode
  both            sarathi, token_budget 512
  orca            whole prompts with the decodes, KV reserved up front (the built-in policy
                  closest to hybrid only)
  vllm            neither: prefill-only iterations of whole prompts, then decode-only ones

In --out: `runs.csv` (one row per run, every seed), `cells.csv` (mean, std, min, max over seeds
per arm, trace and load), `ablation.png`, `run_info.json`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "experiments"))
from studies import seed_spread, show, start_info, sweep, write_run_info  # noqa: E402

ARMS = {
    "hybrid_only": ["scheduler=sarathi", "scheduler.token_budget=8192"],
    "chunking_only": ["scheduler=custom", "scheduler.name=simple_chunking:SimpleChunking",
                      "scheduler.token_budget=512"],
    "both": ["scheduler=sarathi", "scheduler.token_budget=512"],
    "orca": ["scheduler=orca"],
    "vllm": ["scheduler=vllm"],
}
LOADS = {"sharegpt": [1.0], "arxiv": [0.5, 1.0]}   # req/s: the paper's (scheduling_ablation.sh),
# and for our shorter arXiv prompts (<= 4k tokens, the paper's reach 16k) a heavier one
METRICS = ["ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "throughput_rps", "stalls_count",
           "preemptions"]


def runs_table(sweeps: dict):
    """One row per run: arm, trace, seed and the figures."""
    import pandas as pd

    from sarathi_lab.report import run_table
    rows = []
    for (arm, trace), path in sweeps.items():
        t = run_table([path])
        for _, r in t.iterrows():
            s = json.loads((Path(r["run_dir"]) / "summary.json").read_text())
            rows.append({"arm": arm, "trace": trace, "qps": s["config"]["trace"]["qps"],
                         "seed": s["config"]["seed"], "policy": r["policy"],
                         "token_budget": s["settings"]["scheduler"].get("token_budget"),
                         "num_requests": s["num_requests"], "num_finished": s["num_finished"],
                         **{m: r[m] for m in METRICS}})
    return pd.DataFrame(rows)


def plot(cells, out: Path) -> Path:
    """P50 TTFT against P99 TBT per arm (mean over seeds, bars = min-max), a panel per trace."""
    import numpy as np
    from matplotlib.figure import Figure
    panels = list(dict.fromkeys(zip(cells["trace"], cells["qps"])))
    fig = Figure(figsize=(4.2 * len(panels), 3.8), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    marks = dict(zip(ARMS, "o^sDv"))
    for ax, (trace, qps) in zip(axes, panels):
        for _, r in cells[(cells["trace"] == trace) & (cells["qps"] == qps)].iterrows():
            x, y = r["tbt_p99_mean"], r["ttft_p50_mean"]
            ax.errorbar(x, y, xerr=[[x - r["tbt_p99_min"]], [r["tbt_p99_max"] - x]],
                        yerr=[[y - r["ttft_p50_min"]], [r["ttft_p50_max"] - y]],
                        fmt=marks.get(r["arm"], "o"), capsize=2, label=r["arm"])
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("P99 TBT (s)")
        ax.set_ylabel("P50 TTFT (s)")
        ax.set_title(f"Yi-34B TP2, {trace} @ {qps:g} req/s", fontsize=9)
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
    fig.suptitle("P50 TTFT against P99 TBT: mean over seeds, bars = min-max", fontsize=9)
    path = out / "ablation.png"
    fig.savefig(path, dpi=130)
    return path


def run_study(root: Path, out: Path, seeds, traces, overrides: list[str]):
    """Every sweep, then the tables and the plot in `out`; returns (runs, cells)."""
    # the plug-in is a file of this directory, imported by its dotted path in every job
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    sweeps = {}
    for trace in traces:
        for arm, args in ARMS.items():
            sweeps[arm, trace] = sweep("ablation", root, f"ablation_{trace}_{arm}", [
                *args, f"trace={trace}", f"trace.qps={','.join(map(str, LOADS[trace]))}",
                f"seed={','.join(map(str, seeds))}", *overrides])
    out.mkdir(parents=True, exist_ok=True)
    runs = runs_table(sweeps)
    cells = seed_spread(runs, ["trace", "qps", "arm"], METRICS)
    runs.to_csv(out / "runs.csv", index=False)
    cells.to_csv(out / "cells.csv", index=False)
    plot(cells, out)
    return runs, cells


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(REPO / "outputs"), help="results_root of the sweeps")
    ap.add_argument("--out", default=str(REPO / "results" / "ablation"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--traces", nargs="+", default=list(LOADS), choices=list(LOADS))
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every sweep")
    a = ap.parse_args(argv)
    if min(a.seeds) < 0:
        ap.error("seeds must be >= 0")
    start = start_info()
    out = Path(a.out)
    _, cells = run_study(Path(a.root).resolve(), out, a.seeds, a.traces, a.overrides)
    write_run_info(out, start, "experiments/ablation/run.py", argv or sys.argv[1:])
    show(cells[["trace", "qps", "arm"] + [f"{m}_{s}" for m in ("ttft_p50", "tbt_p99")
                                          for s in ("mean", "min", "max")]])
    print(f"-> {out}")


if __name__ == "__main__":
    main()
