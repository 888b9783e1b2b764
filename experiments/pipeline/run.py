"""Pipeline study: Llama-2-70B on four A100-80GB, two pipeline stages of TP2 against one TP4 group,
under Sarathi-Serve at token budgets 256 .. 4096 and vLLM: TBT, TTFT, bubbles, throughput.

Every run: the `pipeline` experiment preset (configs/experiment/pipeline.yaml): ShareGPT-4
requests with prompt + output <= 4,096 tokens (Llama-2's context), Poisson arrivals at `--qps`,
simulated with the roofline. Layouts (`parallel=...`, the sim executor's tensor x pipeline
stages; GPUs 4 in each):

- `tp4`: one tensor-parallel group of four GPUs;
- `tp2pp2`: two stages of TP2 on one node (NVLink between the stages): vLLM v0's two virtual
  engines, each with half the KV blocks (sarathi_lab/topology/pipeline.py);
- `tp2pp2-2nodes`: the same, the stages on two nodes (hardware.gpus_per_node=2): the stage
  boundary goes over a NIC (Vidur's measured inter-node send/recv);
- `tp4-nocpu`, `tp2pp2-nocpu`: both without a CPU side (iteration and request overheads 0), as
  an engine that overlaps it with the GPU would run: what is left of the bubbles is the
  micro-batches' and the stages' imbalance.

Per run: P50/P99 TBT, P50/P99 TTFT, output tokens/s, the bubble share of stage time (total and per
stage) and the spread of micro-batch sizes (coefficient of variation of scheduled tokens per
iteration). One command writes results/pipeline/pipeline.csv and the plots and prints the table:

    python experiments/pipeline/run.py [--qps 2 3] [--requests 1000] [--budgets ...]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from studies import compose  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "results" / "pipeline"
NO_CPU = ["executor.iteration_overhead_s=0", "executor.request_overhead_s=0"]
LAYOUTS = {   # label: overrides
    "tp4": ["parallel=tp4"],
    "tp2pp2": ["parallel=tp2pp2"],
    "tp2pp2-2nodes": ["parallel=tp2pp2", "hardware.gpus_per_node=2"],
    "tp4-nocpu": ["parallel=tp4", *NO_CPU],
    "tp2pp2-nocpu": ["parallel=tp2pp2", *NO_CPU],
}
BUDGETS = [256, 512, 1024, 2048, 4096]


def policies(budgets):
    return [(f"sarathi-{b}", ["scheduler=sarathi", f"scheduler.token_budget={b}"])
            for b in budgets] + [("vllm", ["scheduler=vllm"])]


def one(layout: str, policy: str, overrides: list[str], qps: float, n: int) -> dict:
    import pandas as pd

    from sarathi_lab.run.runner import run
    c = compose(["experiment=pipeline", "progress=false", f"trace.qps={qps}",
                 f"trace.num_requests={n}", *LAYOUTS[layout], *overrides])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        s = run(c, Path(d))
        it = pd.read_parquet(Path(d) / "iterations.parquet")
    tokens = (it["prefill_tokens"] + it["decode_tokens"]).to_numpy(float)
    p = s.get("pipeline")
    row = {
        "layout": layout, "qps": qps, "policy": policy,
        "token_budget": s["settings"]["scheduler"].get("token_budget"),
        "p50_tbt_ms": s["tbt"]["p50"] * 1e3, "p99_tbt_ms": s["tbt"]["p99"] * 1e3,
        "p50_ttft_s": s["ttft"]["p50"], "p99_ttft_s": s["ttft"]["p99"],
        "throughput_tok_s": s["throughput_tok_s"], "throughput_rps": s["throughput_rps"],
        "bubble_fraction": p["bubble_fraction_total"] if p else np.nan,
        "bubble_stage0": p["bubble_fraction"][0] if p else np.nan,
        "bubble_stage1": p["bubble_fraction"][1] if p else np.nan,
        "cv_tokens": float(tokens.std() / tokens.mean()),
        "mean_tokens": float(tokens.mean()),
        "kv_blocks": s["kv"]["blocks_total"], "preemptions": s["preemptions"],
        "num_finished": s["num_finished"], "num_rejected": s["num_rejected"],
        "makespan_s": s["makespan_s"], "wall_s": time.perf_counter() - t0,
    }
    return row


def study(layouts, qps_list, budgets, n: int):
    import pandas as pd
    rows = []
    for qps in qps_list:
        for layout in layouts:
            for policy, ov in policies(budgets):
                r = one(layout, policy, ov, qps, n)
                rows.append(r)
                print(f"{qps:g} req/s {layout:14} {policy:13} TBT p50 {r['p50_tbt_ms']:6.1f} "
                      f"p99 {r['p99_tbt_ms']:7.1f} ms  TTFT p50 {r['p50_ttft_s']:6.2f} p99 "
                      f"{r['p99_ttft_s']:6.2f} s  {r['throughput_tok_s']:5.0f} tok/s  bubbles "
                      f"{r['bubble_fraction']:6.1%}  cv {r['cv_tokens']:.2f}  "
                      f"({r['wall_s']:.1f} s)", flush=True)
    return pd.DataFrame(rows)


def plot(df, out: Path) -> list[Path]:
    """TBT, TTFT, bubbles and throughput against the token budget, one panel each, a line per
    layout (vLLM: a dashed level per layout), one figure per load."""
    from matplotlib.figure import Figure
    paths = []
    panels = [("p50_tbt_ms", "P50 TBT (ms)"), ("p99_tbt_ms", "P99 TBT (ms)"),
              ("p50_ttft_s", "P50 TTFT (s)"), ("throughput_tok_s", "output tokens/s"),
              ("bubble_fraction", "bubble share of stage time")]
    for qps, d in df.groupby("qps"):
        fig = Figure(figsize=(16, 3.4), layout="constrained")
        axes = fig.subplots(1, len(panels))
        for (col, label), ax in zip(panels, axes):
            for k, (layout, g) in enumerate(d.groupby("layout", sort=False)):
                color = f"C{k}"
                sar = g[g["policy"] != "vllm"].sort_values("token_budget")
                if sar[col].notna().any():
                    ax.plot(sar["token_budget"], sar[col], "o-", color=color, label=layout)
                v = g.loc[g["policy"] == "vllm", col]
                if len(v) and v.notna().all():
                    ax.axhline(float(v.iloc[0]), color=color, ls="--", lw=1)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("Sarathi token budget (dashed: vLLM)")
            ax.set_title(label, fontsize=10)
            if col in ("p99_tbt_ms", "p50_ttft_s"):
                ax.set_yscale("log")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"Llama-2-70B on 4 x A100-80GB, ShareGPT-4 at {qps:g} req/s")
        path = out / f"pipeline_qps{qps:g}.png"
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qps", type=float, nargs="+", default=[2.0, 3.0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--budgets", type=int, nargs="+", default=BUDGETS)
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    df = study(args.layouts, args.qps, args.budgets, args.requests)
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "pipeline.csv", index=False, float_format="%.4g")
    for p in plot(df, args.out):
        print(p)
    print(f"{args.out / 'pipeline.csv'} ({len(df)} runs in {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
