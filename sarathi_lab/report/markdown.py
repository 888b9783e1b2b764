"""report.md: the key columns of the tables, the jobs without a result, the plots."""
from __future__ import annotations

import numpy as np
import pandas as pd

from sarathi_lab.run import rundir

KEY_COLUMNS = ("label", "policy", "token_budget", "load_mode", "offered_qps", "ttft_p50",
               "ttft_p99", "tbt_p50", "tbt_p99", "stalls_count", "stalls_worst_s",
               "throughput_rps", "slo_attainment", "slo_goodput_rps", "slo_meets_tbt_slo",
               "queue_mean", "fairness_jain", "cost_usd_per_1m_output_tokens")
# per configuration (over seeds): the metrics shown as "mean [lo, hi]"
KEY_METRICS = ("offered_qps", "ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99", "throughput_rps",
               "slo_attainment", "slo_goodput_rps", "slo_meets_tbt_slo", "capacity_qps")


def _cell(v) -> str:
    if isinstance(v, float):
        return "" if np.isnan(v) else f"{v:.4g}"
    return str(v)


def md_table(df: pd.DataFrame, cols) -> str:
    cols = [c for c in cols if c in df]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(v) for v in r) + " |" for r in df[cols].itertuples(False)]
    return "\n".join(lines)


def spread_view(agg: pd.DataFrame, lead=("config", "n_seeds", "interval")) -> pd.DataFrame:
    """The aggregate table's key metrics as text, "mean [lo, hi]" (a true/false metric: the
    share of seeds where it holds)."""
    out = agg[[c for c in lead if c in agg]].copy()
    for m in KEY_METRICS:
        if f"{m}_lo" in agg:
            out[m] = [("" if np.isnan(a) else f"{a:.4g} [{lo:.4g}, {hi:.4g}]" if lo != hi
                       else f"{a:.4g}")
                      for a, lo, hi in zip(agg[f"{m}_mean"], agg[f"{m}_lo"], agg[f"{m}_hi"])]
        elif f"{m}_mean" in agg:
            out[m] = [_cell(v) for v in agg[f"{m}_mean"]]
    return out


def write_markdown(rep, paths):
    lines = ["# Report", "", "Inputs: " + ", ".join(f"`{p}`" for p in paths), ""]
    if rep.from_tables:
        lines += ["Drawn from the tables of an earlier report (no run directories): the plots "
                  "that need a run's requests or iterations are not made.", ""]
    if not rep.table.empty:
        lines += [f"## Runs ({len(rep.table)})", "", md_table(rep.table, KEY_COLUMNS), "",
                  "Times in seconds; full table in `summary.csv`.", ""]
    for title, agg, stem in (("Configurations over seeds", rep.by_config, "summary_by_config"),
                             ("Capacity over seeds", rep.capacity_by_config,
                              "capacity_by_config")):
        if not agg.empty:
            lines += [f"## {title} ({len(agg)})", "",
                      "Mean [interval] over each configuration's seeds: the 95% Student-t "
                      "interval of the mean from 4 seeds on, the smallest and largest value "
                      f"with 2 or 3 (`interval`). Full table in `{stem}.csv`.", "",
                      md_table(spread_view(agg), list(spread_view(agg).columns)), ""]
    if not rep.capacity.empty:
        lines += ["## Capacity", "", md_table(rep.capacity, ["label", "policy", "slo",
                                                             "criterion", "capacity_qps",
                                                             "fails_at_qps", "probes"]), ""]
    if not rep.incomplete.empty:
        lines += [f"## Jobs without a result ({len(rep.incomplete)})", "",
                  "Not in the tables above; also in `incomplete.csv`.", "",
                  md_table(rep.incomplete.assign(detail=rep.incomplete["detail"].str.replace(
                      "|", "\\|", regex=False)), ["status", "run_dir", "detail"]), ""]
    lines += ["## Plots", ""]
    for name, (files, _) in rep.plots.items():
        png = [f for f in files if f.suffix == ".png"]
        lines += [f"### {name}", ""] + [f"![{name}]({f.name})" for f in png] + [""]
    if rep.skipped:
        lines += ["Not made:", ""] + [f"- {k}: {v}" for k, v in rep.skipped.items()] + [""]
    p = rep.out / "report.md"
    text = "\n".join(lines)
    rundir.atomic_write(p, lambda tmp: tmp.write_text(text))
    return p
