"""Service per tenant over time, for one run."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure

from sarathi_lab.metrics import token_times_flat
from sarathi_lab.plots.cdfs import load_requests
from sarathi_lab.plots.style import Skip, context, figure_legend, figure_plot, simulated

MAX_TENANT_LINES = 10


@figure_plot
def tenant_service(row: pd.Series, points: int = 200):
    """Weighted tokens served to each tenant so far, over the run (metrics.service_tokens'
    weights: a prompt counts when its first token comes out, each output token when it does).
    The tenants with the most service get a line each, the rest one summed line."""
    from sarathi_lab.metrics import SERVICE_WEIGHTS
    df = load_requests(row["run_dir"], ["tenant", "num_prompt_tokens", "token_times"])
    name = Path(row["run_dir"]).name
    if df is None or df["tenant"].nunique() < 2:
        raise Skip(f"{name}: fewer than two tenants")
    flat, owner = token_times_flat(df)
    if not len(flat):
        raise Skip(f"{name}: no output token")
    first = np.r_[True, owner[1:] != owner[:-1]]
    w = SERVICE_WEIGHTS["output"] + np.where(
        first, SERVICE_WEIGHTS["prompt"] * df["num_prompt_tokens"].to_numpy(float)[owner], 0.0)
    tenants = df["tenant"].astype(str).to_numpy()[owner]
    total = pd.Series(w).groupby(tenants).sum().sort_values(ascending=False)
    top = list(total.index[:MAX_TENANT_LINES])
    rest = len(total) - len(top)
    others = f"{rest} other tenant" + ("s" if rest > 1 else "")
    group = np.where(np.isin(tenants, top), tenants, others)
    grid = np.linspace(0.0, float(flat.max()), points + 1)
    parts = []
    for g in top + ([others] if rest else []):
        sel = group == g
        t, cum = flat[sel], np.cumsum(w[sel][np.argsort(flat[sel], kind="stable")])
        served = cum[np.searchsorted(np.sort(t), grid, side="right") - 1]
        served[grid < t.min()] = 0.0
        parts.append(pd.DataFrame({"tenant": g, "t": grid, "service_tokens": served}))
    data = pd.concat(parts, ignore_index=True)
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    cum_ax, share_ax = fig.subplots(1, 2)
    wide = data.pivot(index="t", columns="tenant", values="service_tokens")[data["tenant"].unique()]
    cmap = colormaps["tab20"]
    for i, g in enumerate(wide.columns):
        cum_ax.plot(wide.index, wide[g], color=cmap(i % 20), lw=1.5, label=g)
    tot = wide.sum(axis=1).to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(tot > 0, wide.to_numpy().T / tot, np.nan)
    share_ax.stackplot(wide.index, np.nan_to_num(share), colors=[cmap(i % 20)
                                                                for i in range(len(wide.columns))])
    cum_ax.set_ylabel(f"service so far (weighted tokens: prompt x{SERVICE_WEIGHTS['prompt']:g}, "
                      f"output x{SERVICE_WEIGHTS['output']:g})")
    share_ax.set_ylabel("share of all service so far")
    share_ax.set_ylim(0, 1)
    for ax in (cum_ax, share_ax):
        ax.set_xlabel("simulated time (s)" if simulated(row) else "wall-clock time (s)")
        ax.grid(True, alpha=0.3)
    figure_legend(fig, *cum_ax.get_legend_handles_labels())
    fig.suptitle(f"Service per tenant over time: {row['label']}\n"
                 f"{context(pd.DataFrame([row]))}", fontsize=10)
    return fig, data
