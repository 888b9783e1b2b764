"""The admission study's table and figure from its sweep (configs/experiment/admission.yaml).

    python experiments/admission/analyze.py outputs/sweeps/admission results/admission

Writes admission.csv (one row per run: offered load, admission rule, goodput in requests and
in tokens per second, SLO attainment,
P99 TTFT of the served requests, rejections and the mean prompt of the served and of the
rejected requests, waiting queue) and goodput_ttft.png (goodput in requests
and in tokens, and P99 TTFT, against offered load, one line per rule, capacity marked), and prints the table.
Capacity is read off the runs without admission control: the highest load whose SLO
attainment reaches the SLO's target.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from sarathi_lab.metrics import slo_met
from sarathi_lab.plots import _save as save
from sarathi_lab.report import find
from sarathi_lab.run import rundir


def rule(sched: dict) -> str:
    parts = []
    if sched.get("max_queue_len") is not None:
        parts.append(f"queue <= {sched['max_queue_len']}")
    if sched.get("deadline_admission"):
        parts.append("deadline")
    return " + ".join(parts) or "none"


def table(sweep) -> pd.DataFrame:
    rows = []
    for d in find([sweep], rundir.SUMMARY):
        s = json.loads((d / rundir.SUMMARY).read_text())
        cfg = s["config"]
        req = pd.read_parquet(d / rundir.REQUESTS, columns=[
            "status", "num_prompt_tokens", "num_output_tokens", "ttft", "tpot", "e2e"])
        prompt = req.groupby("status")["num_prompt_tokens"].mean()
        met = slo_met(req, cfg["slo"])
        tokens = (req["num_prompt_tokens"] + req["num_output_tokens"]).to_numpy(float)
        rows.append({
            "qps": float(cfg["trace"]["qps"]), "admission": rule(cfg["scheduler"]),
            "goodput_rps": s["slo"]["goodput_rps"],
            # the same in tokens (prompt + output of the requests meeting the SLO per second):
            # a rule that refuses long requests first flatters goodput in requests
            "goodput_tok_s": float(tokens[met].sum()) / s["makespan_s"],
            "attainment": s["slo"]["attainment"],
            "ttft_p50_s": s["ttft"]["p50"], "ttft_p99_s": s["ttft"]["p99"],
            "rejected": s["num_rejected"], "requests": s["num_requests"],
            # what a rule refuses: deadline admission refuses the long prompts first
            "prompt_mean_served": prompt.get("finished"),
            "prompt_mean_rejected": prompt.get("rejected"),
            "throughput_rps": s["throughput_rps"], "makespan_s": s["makespan_s"],
            "queue_mean": (s.get("queue") or {}).get("mean"),
            "queue_max": (s.get("queue") or {}).get("max"),
            "attainment_target": s["slo"]["attainment_target"]})
    if not rows:
        raise FileNotFoundError(f"{sweep}: no run (summary.json) below it")
    return pd.DataFrame(rows).sort_values(["admission", "qps"], ignore_index=True)


def capacity(df: pd.DataFrame) -> float | None:
    """Highest offered load at which the runs without admission control meet the target."""
    ok = df[(df["admission"] == "none") & (df["attainment"] >= df["attainment_target"])]
    return float(ok["qps"].max()) if len(ok) else None


def plot(df: pd.DataFrame, cap, out: Path) -> Path:
    from matplotlib.figure import Figure
    fig = Figure(figsize=(14, 4))
    ax_g, ax_k, ax_t = fig.subplots(1, 3)
    for name, g in df.groupby("admission", sort=False):
        ax_g.plot(g["qps"], g["goodput_rps"], marker="o", label=name)
        ax_k.plot(g["qps"], g["goodput_tok_s"] / 1e3, marker="o", label=name)
        ax_t.plot(g["qps"], g["ttft_p99_s"], marker="o", label=name)
    ax_g.plot(df["qps"].drop_duplicates().sort_values(), df["qps"].drop_duplicates().sort_values(),
              color="grey", lw=0.8, ls=":", label="offered")
    ax_t.axhline(2.5, color="grey", lw=0.8, ls="--", label="TTFT deadline 2.5 s")
    ax_t.set_yscale("log")
    for ax in (ax_g, ax_k, ax_t):
        if cap is not None:
            ax.axvline(cap, color="black", lw=0.8, ls="--")
        ax.set_xlabel("offered load (req/s)")
        ax.grid(alpha=0.3)
    ax_g.set_ylabel("goodput (req/s meeting the SLO)")
    ax_k.set_ylabel("goodput (k tokens/s, prompt + output)")
    ax_t.set_ylabel("P99 TTFT of served requests (s)")
    ax_g.legend(title="admission control", fontsize=8)
    fig.suptitle("Sarathi-Serve, Mistral-7B on A100 (simulated), ShareGPT-4 chat; "
                 f"dashed: capacity {cap} req/s" if cap else "no load met the SLO")
    return save(fig, out / "goodput_ttft", ("png",))[0]


def main(sweep: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    df = table(sweep)
    cap = capacity(df)
    df.to_csv(out / "admission.csv", index=False)
    plot(df, cap, out)
    pd.set_option("display.width", 200)
    print(df.drop(columns=["attainment_target"]).round(3).to_string(index=False))
    print(f"capacity (no admission control, attainment >= target): {cap} req/s")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
