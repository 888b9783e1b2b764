"""memory: capacity under the strict SLO when KV memory binds, by preemption mode (recompute vs
swap to host memory) and precision (bf16 vs fp8 KV; fp8 weights on H100), for Llama-2-70B at
tensor parallel 2 on ShareGPT-4 (experiments/memory/README.md).

    python experiments/memory/run.py                     # ~10 min on 2 (shared) cores
    python experiments/memory/run.py --root /tmp/x --out /tmp/x/report --requests 60 \\
        capacity.max_probes=3 ...                        # extra Hydra overrides

1. `sarathi-lab -m experiment=memory`: capacity searches on two A100-80GB of vllm and sarathi,
   preemption by recompute and by swap, bf16 and fp8 KV (8 searches).
2. The same preset on two H100-SXM for sarathi (recompute): bf16 and fp8 weights x bf16 and fp8
   KV (4 searches).
3. Every A100 configuration of 1. as one run at a fixed load (--qps): how often requests are
   preempted, what recompute re-prefills and what swapping moves over PCIe.
4. `sarathi-lab-report` over 1. and 2., memory.csv (one row per configuration: its capacity and
   the preemptions of the probe at capacity), fixed_load.csv (3.), and memory.png.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments"))
from studies import short, study_args, sweep  # noqa: E402

H100 = ["hardware=h100-sxm", "scheduler=sarathi", "scheduler.preemption_mode=recompute",
        "executor.weight_dtype=bfloat16,fp8", "executor.kv_cache_dtype=bfloat16,fp8"]


def _settings(cfg: dict) -> dict:
    """A configuration's labels from its config: policy, hardware, preemption mode, precisions."""
    from sarathi_lab.models.dtypes import dtype_name
    ex = cfg["executor"]
    return {"policy": cfg["scheduler"]["name"], "hardware": cfg["hardware"]["name"],
            "preemption_mode": cfg["scheduler"].get("preemption_mode") or "recompute",
            "weight_dtype": dtype_name(ex.get("weight_dtype") or cfg["model"]["dtype"]),
            "kv_cache_dtype": dtype_name(ex.get("kv_cache_dtype") or cfg["model"]["dtype"])}


def preemption_cost(run_dir: Path) -> dict:
    """What a run's preemptions cost: counts by mode, prompt work recomputed, bytes swapped."""
    import pandas as pd
    s = json.loads((run_dir / "summary.json").read_text())
    it = pd.read_parquet(run_dir / "iterations.parquet")
    rq = pd.read_parquet(run_dir / "requests.parquet")
    started = rq["first_scheduled_time"].notna()
    sw = s.get("swap") or {}
    return {
        **_settings(s["config"]), "qps": s["config"]["trace"]["qps"],
        "kv_blocks": s["kv"]["blocks_total"], "num_finished": s["num_finished"],
        "preemptions": s["preemptions"],
        "preempted_requests": int((rq["num_preemptions"] > 0).sum()),
        "swap_outs": sw.get("swap_outs", 0),
        "fallbacks_to_recompute": sw.get("fallbacks_to_recompute", 0),
        # every prefill token beyond each started request's prompt is recomputed KV
        "recomputed_tokens": int(it["prefill_tokens"].sum()
                                 - rq.loc[started, "num_prompt_tokens"].sum()),
        "swapped_gb_per_gpu": (sw.get("bytes_out") or 0) / 1e9,
        "swap_time_s": sw.get("time_s", 0.0), "swap_time_share": sw.get("time_share", 0.0),
        "makespan_s": s["makespan_s"], "throughput_rps": s["throughput_rps"],
        "p99_tbt_s": s["tbt"]["p99"], "max_tbt_s": s["tbt"]["max"],
        "median_scheduling_delay_s": s["scheduling_delay"]["p50"],
        "meets_tbt_slo": s["slo"]["meets_tbt_slo"],
    }


def capacity_table(cap):
    """One row per searched configuration: its capacity, and its last passing probe's
    preemptions (how much preemption happens at capacity)."""
    import pandas as pd
    rows = []
    for _, r in cap.iterrows():
        res = json.loads((Path(r["run_dir"]) / "capacity.json").read_text())
        probes = [p for p in res["probes"] if p["qps"] == r["capacity_qps"]]
        rows.append({**_settings(res["config"]), "capacity_qps": r["capacity_qps"],
                     "fails_at_qps": r["fails_at_qps"], "bracketed": bool(r["bracketed"]),
                     "probes": r["probes"],
                     "preemptions_at_capacity": probes[0]["preemptions"] if probes else None,
                     "usd_per_1m_output_tokens": r["usd_per_1m_output_tokens"]})
    order = ["hardware", "policy", "weight_dtype", "kv_cache_dtype", "preemption_mode"]
    return pd.DataFrame(rows).sort_values(order, ignore_index=True)


_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float8": "fp8", "int8": "int8"}


def plot(table, fixed, out: Path) -> Path:
    """Capacity per configuration (A100: recompute and swap side by side; H100: precisions),
    and the preemptions of the fixed-load runs."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(11, 4.4), layout="constrained")
    ax, bx = fig.subplots(1, 2, width_ratios=[3, 2])

    def colour(mode):
        return "tab:orange" if mode == "swap" else "tab:blue"
    labels = []
    for _, r in table.iterrows():
        gpu = "A100" if r["hardware"].startswith("a100") else "H100"
        labels.append(f"{gpu} {r['policy']}\nW {_SHORT[r['weight_dtype']]} "
                      f"KV {_SHORT[r['kv_cache_dtype']]}")
    bars = ax.bar(range(len(table)), table["capacity_qps"],
                  color=[colour(m) for m in table["preemption_mode"]])
    ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(table)), labels, rotation=90, fontsize=7)
    ax.set_ylabel("capacity (req/s)")
    ax.set_title("capacity: P99 TBT <= 1 s, median scheduling delay <= 2 s\n"
                 "(blue: preemption by recompute, orange: by swap)", fontsize=9)
    f = fixed.sort_values(["policy", "kv_cache_dtype", "preemption_mode"])
    names = [f"{p}\nKV {_SHORT[k]}" for p, k in zip(f["policy"], f["kv_cache_dtype"])]
    bars = bx.bar(range(len(f)), f["preemptions"], color=[colour(m) for m in
                                                           f["preemption_mode"]])
    bx.bar_label(bars, fontsize=7)
    bx.set_xticks(range(len(f)), names, rotation=90, fontsize=7)
    bx.set_ylabel("preemptions (of 1,000 requests)" if len(f) else "preemptions")
    qps = f["qps"].iloc[0] if len(f) else float("nan")
    bx.set_title(f"two A100s at {qps:g} req/s: preemptions", fontsize=9)
    fig.suptitle("Llama-2-70B, tensor parallel 2, ShareGPT-4 within 4,096 tokens", fontsize=10)
    path = out / "memory.png"
    fig.savefig(path, dpi=130)
    return path


def write_results(a100: Path, h100: Path, fixed: Path, out: Path):
    """The report over the capacity sweeps, memory.csv, fixed_load.csv and memory.png."""
    import pandas as pd

    from sarathi_lab.report import find, make_report
    out.mkdir(parents=True, exist_ok=True)
    rep = make_report([a100, h100], out)
    table = capacity_table(rep.capacity)
    table.to_csv(out / "memory.csv", index=False)
    fixed_t = pd.DataFrame([preemption_cost(d) for d in find([fixed], "summary.json")])
    fixed_t = fixed_t.sort_values(["policy", "kv_cache_dtype", "preemption_mode"],
                                  ignore_index=True)
    fixed_t.to_csv(out / "fixed_load.csv", index=False)
    plot(table, fixed_t, out)
    return rep, table, fixed_t


def run_study(root: Path, out: Path, requests: int, qps: float, overrides: list[str]):
    """The three sweeps and `write_results`; returns (the report, the capacity table, the
    fixed-load table)."""
    common = [f"trace.num_requests={requests}", *overrides]
    a100 = sweep("memory", root, "memory_a100", common)
    h100 = sweep("memory", root, "memory_h100", [*common, *H100])
    fixed = sweep("memory", root, "memory_fixed", [*common, "mode=run", f"trace.qps={qps}"])
    return write_results(a100, h100, fixed, out)


def main(argv=None) -> None:
    ap = study_args(__doc__, "memory", 1000)
    ap.add_argument("--qps", type=float, default=0.6, help="the fixed-load runs' rate, req/s")
    a = ap.parse_args(argv)
    if a.requests < 2 or a.qps <= 0:
        ap.error("--requests must be >= 2 and --qps > 0")
    _, table, fixed = run_study(Path(a.root).resolve(), Path(a.out), a.requests, a.qps,
                                a.overrides)
    import pandas as pd
    with pd.option_context("display.width", 250, "display.max_columns", 40):
        print(table.to_string(index=False, float_format="%.4g"))
        print(fixed.to_string(index=False, float_format="%.4g"))
    print(f"-> {short(Path(a.out))}")


if __name__ == "__main__":
    main()
