"""The priorities study's table and figure from its sweep (configs/experiment/priorities.yaml).

    python experiments/priorities/analyze.py outputs/sweeps/priorities results/priorities

Writes priorities.csv (one row per run: policy, batch load, the interactive class's P99 TTFT,
P99 TBT and SLO attainment, the batch class's median and P99 E2E and attainment, preemptions)
and classes.png (those figures against the batch load, one line per policy), and prints the
table.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from sarathi_lab.plots import _save as save
from sarathi_lab.report import find
from sarathi_lab.run import rundir


def label(sched: dict) -> str:
    """The policy, with sarathi_priority's aging rate (the sweep tries two)."""
    if sched["name"] != "sarathi_priority":   # the others ignore the swept aging rate
        return sched["name"]
    return f"{sched['name']} (aging {sched['aging_rate']:g}/s)"


def table(sweep) -> pd.DataFrame:
    rows = []
    for d in find([sweep], rundir.SUMMARY):
        s = json.loads((d / rundir.SUMMARY).read_text())
        cfg, chat, batch = s["config"], s["classes"]["interactive"], s["classes"]["batch"]
        comp = cfg["trace"]["components"]
        rows.append({
            "policy": label(cfg["scheduler"]),
            "batch_qps": float(comp["batch"]["qps"]), "chat_qps": float(comp["chat"]["qps"]),
            "chat_ttft_p50_s": chat["ttft"]["p50"], "chat_ttft_p99_s": chat["ttft"]["p99"],
            "chat_tbt_p99_s": chat["tbt"]["p99"], "chat_attainment": chat["attainment"],
            "batch_ttft_p50_s": batch["ttft"]["p50"],
            "batch_e2e_p50_s": batch["e2e"]["p50"], "batch_e2e_p99_s": batch["e2e"]["p99"],
            "batch_attainment": batch["attainment"],
            "batch_requests": batch["num_requests"], "chat_requests": chat["num_requests"],
            "preemptions": s["preemptions"], "throughput_tok_s": s["throughput_tok_s"]})
    if not rows:
        raise FileNotFoundError(f"{sweep}: no run (summary.json) below it")
    return pd.DataFrame(rows).sort_values(["policy", "batch_qps"], ignore_index=True)


PANELS = [("chat_ttft_p99_s", "interactive P99 TTFT (s)", 2.5),
          ("chat_tbt_p99_s", "interactive P99 TBT (s)", None),
          ("chat_attainment", "interactive SLO attainment", 0.9),
          ("batch_e2e_p50_s", "batch median E2E (s)", 60.0)]


def plot(df: pd.DataFrame, out: Path) -> Path:
    from matplotlib.figure import Figure
    fig = Figure(figsize=(14, 3.6))
    axes = fig.subplots(1, len(PANELS))
    for ax, (col, label, limit) in zip(axes, PANELS):
        for name, g in df.groupby("policy", sort=False):
            ax.plot(g["batch_qps"], g[col], marker="o", label=name)
        if limit is not None:
            ax.axhline(limit, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("batch load (req/s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Chat at {df['chat_qps'].iloc[0]:g} req/s beside a growing arXiv batch job; "
                 "Mistral-7B on A100 (simulated); dashed: the SLO", fontsize=10)
    fig.tight_layout()
    return save(fig, out / "classes", ("png",))[0]


def main(sweep: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    df = table(sweep)
    df.to_csv(out / "priorities.csv", index=False)
    plot(df, out)
    pd.set_option("display.width", 250)
    print(df.round(3).to_string(index=False))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
