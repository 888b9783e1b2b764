"""The study's figure: TTFT, TBT and E2E CDFs of every real run beside the simulation's."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def cdf_plot(runs: dict[str, dict], out: Path) -> Path:
    """One row per policy: TTFT, TBT and E2E CDFs, each real run (solid) and the simulation
    (dashed), on the same axes."""
    from matplotlib.figure import Figure

    from sarathi_lab.metrics import tbt_gaps
    from sarathi_lab.plots import QUANTILES
    policies = list(runs)
    fig = Figure(figsize=(13, 2.6 * len(policies)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(policies), 3))
    for i, policy in enumerate(policies):
        for kind, dirs in (("real", runs[policy]["real"]), ("sim", [runs[policy]["sim"]])):
            for j, d in enumerate(dirs):
                req = pd.read_parquet(Path(d) / "requests.parquet")
                vals = {"TTFT (s)": req["ttft"].dropna().to_numpy(),
                        "TBT (ms)": tbt_gaps(req)[0] * 1e3,
                        "E2E (s)": req["e2e"].dropna().to_numpy()}
                for ax, (label, v) in zip(axes[i], vals.items()):
                    if not len(v):
                        continue
                    ax.plot(np.quantile(v, QUANTILES), QUANTILES,
                            color="C0" if kind == "real" else "C3",
                            ls="-" if kind == "real" else "--", lw=1.2 if kind == "real" else 1.8,
                            alpha=0.6 if kind == "real" else 1.0,
                            label=(f"real (x{len(dirs)})" if kind == "real" else "simulated")
                            if j == 0 else None)
                    ax.set_xlabel(label)
        axes[i, 0].set_ylabel(f"{policy}\nshare")
        for ax in axes[i]:
            ax.set_xscale("log")
            ax.grid(True, alpha=0.3)
            ax.set_ylim(0, 1.01)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("Simulated (profiled cost model) vs real runs (torch executor), same trace",
                 fontsize=10)
    path = out / "cdfs.png"
    fig.savefig(path, dpi=110)
    return path
