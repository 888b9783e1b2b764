"""The plan's outputs: the ranked table (Parquet, and printed) and the Pareto plot of cost
against P99 TTFT and P99 TBT at the planned load."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

TABLE = "plan.parquet"
PLOT = "pareto.png"
# printed; the Parquet table holds every column
SHOWN = ["rank", "candidate", "replicas", "gpus", "usd_per_1m_output_tokens", "usd_per_hour",
         "capacity_qps", "binds", "ttft_p99", "tbt_p99"]


def ranked(rows: list[dict]) -> pd.DataFrame:
    """Feasible rows first, cheapest per output token first (ties: fewer GPUs, then more
    capacity to spare, then the label), ranked 1..n; then the infeasible and the pruned."""
    df = pd.DataFrame(rows)
    order = {"feasible": 0, "infeasible": 1, "pruned": 2}
    df["_s"] = df["status"].map(order)
    for col in ("usd_per_1m_output_tokens", "gpus", "capacity_qps"):
        if col not in df:
            df[col] = None
    df["_c"] = -pd.to_numeric(df["capacity_qps"])
    df = df.sort_values(["_s", "usd_per_1m_output_tokens", "gpus", "_c", "candidate"],
                        na_position="last", kind="stable").drop(columns=["_s", "_c"])
    feasible = (df["status"] == "feasible").to_numpy()
    df.insert(0, "rank", pd.array([i + 1 if f else None for i, f in enumerate(feasible)],
                                  dtype="Int64"))
    return df.reset_index(drop=True)


def pareto(df: pd.DataFrame, latency: str) -> pd.Series:
    """Which feasible rows no other feasible row beats on both cost and `latency` (a P99
    column): as cheap and as fast, and strictly better in one."""
    f = df["status"] == "feasible"
    cost = df.loc[f, "usd_per_1m_output_tokens"].to_numpy(float)
    lat = df.loc[f, latency].to_numpy(float)
    le = (cost[:, None] <= cost[None, :]) & (lat[:, None] <= lat[None, :])
    lt = (cost[:, None] < cost[None, :]) | (lat[:, None] < lat[None, :])
    beaten = (le & lt).any(axis=0)   # column j: some row i beats row j
    keep = pd.Series(False, index=df.index)
    keep[f] = ~beaten
    return keep


def format_table(df: pd.DataFrame, top: int) -> str:
    f = df[df["status"] == "feasible"].head(top)
    lines = []
    if len(f):
        show = f[[c for c in SHOWN if c in f]].copy()
        show["binds"] = f["binds"].map({"tbt": "TBT", "attainment": "attainment"})
        # an unbracketed capacity is a lower bound: the search never saw it fail
        show["capacity_qps"] = [f"{v:.4g}" if b else f">={v:.4g}"
                                for v, b in zip(f["capacity_qps"], f["capacity_bracketed"])]
        lines.append(show.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        lines.append("")
        lines += [f"#{int(r['rank'])}: {r['command']}" for _, r in f.iterrows()]
        if "check_held" in f and f["check_held"].notna().any():
            r = f[f["check_held"].notna()].iloc[0]
            lines += ["", f"check of #{int(r['rank'])}: {int(r['check_requests'])} requests at "
                      f"the load ({int(r['check_factor'])} x its probe's): "
                      + ("held" if r["check_held"] else "DID NOT HOLD")
                      + f", P99 TTFT {r['check_ttft_p99']:.3g} s, P99 TBT "
                      f"{r['check_tbt_p99']:.3g} s, {r['check_stability']}"
                      + (f"; missed {r['check_missed']}" if r["check_missed"] else ""),
                      f"  {r['check_command']}"]
        elif len(f):
            lines += ["", "the cheapest answer was not checked by a long run (plan.check=0)"]
    counts = df["status"].value_counts().to_dict()
    lines.append(f"{counts.get('feasible', 0)} feasible, {counts.get('infeasible', 0)} "
                 f"infeasible, {counts.get('pruned', 0)} pruned (memory, context or settings)")
    return "\n".join(lines)


def write(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """plan.parquet, and pareto.png when a row is feasible."""
    out_dir.mkdir(parents=True, exist_ok=True)
    from sarathi_lab.run import rundir
    paths = [out_dir / TABLE]
    rundir.atomic_write(paths[0], lambda p: df.to_parquet(p, index=False))
    if (df["status"] == "feasible").any():
        paths.append(out_dir / PLOT)
        plot(df, paths[1])
    return paths


def plot(df: pd.DataFrame, path: Path) -> None:
    from matplotlib.figure import Figure
    f = df[df["status"] == "feasible"]
    fig = Figure(figsize=(10, 4.2))
    for ax, col, what in zip(fig.subplots(1, 2), ("ttft_p99", "tbt_p99"),
                             ("P99 TTFT", "P99 TBT")):
        front = pareto(df, col)[f.index]
        ax.scatter(f[col], f["usd_per_1m_output_tokens"], s=18, c="0.6", label="feasible")
        fr = f[front].sort_values(col)
        ax.plot(fr[col], fr["usd_per_1m_output_tokens"], "o-", c="C0", label="Pareto front")
        for _, r in fr.iterrows():
            ax.annotate(f"#{int(r['rank'])}", (r[col], r["usd_per_1m_output_tokens"]),
                        fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(f"{what} at the planned load (s)")
        ax.set_ylabel("$ per 1M output tokens")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{len(f)} feasible deployments at {f['load_qps'].iloc[0]:.4g} req/s")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
