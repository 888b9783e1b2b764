"""A study kept in a folder, read again (`run.py --bias DIR`, and the scripts beside run.py that
take a kept study): the real runs' and every simulation variant's figures from their summaries,
and the bias table recomputed from them, no run repeated."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .bias import RESIDUALS, profile_of, round_levels, variant_bias
from .report import BIAS_HEAD, bias_fmt, bias_summary, table_markdown
from .runs import POLICIES, figures
from .speed import weighted


def reread(out: Path) -> dict:
    """From a study's kept runs (OUT/runs/<policy>/real-<i> and sim or sim_<variant>): the real
    runs' figures by policy and each variant's, for `bias_interval`."""
    def summary(d: Path) -> dict:
        return figures(json.loads((d / "summary.json").read_text()))
    base = out / "runs"
    policies = [p for p in POLICIES if (base / p / "real-0").is_dir()]
    if not policies:
        raise FileNotFoundError(f"{base}: no kept real runs (<policy>/real-0/summary.json)")
    real = {p: [summary(d) for d in sorted(base.glob(f"{p}/real-*"),
                                           key=lambda d: int(d.name.split("-")[1]))]
            for p in policies}
    sims = {}
    for d in sorted(base.glob(f"{policies[0]}/sim*")):
        v = "profiled" if d.name == "sim" else d.name[len("sim_"):]
        if all((base / p / d.name / "summary.json").is_file() for p in policies):
            sims[v] = {p: summary(base / p / d.name) for p in policies}
    if (base / "speed.json").is_file():
        w = json.loads((base / "speed.json").read_text())["weights"]
        sims["speed"] = {p: weighted([summary(base / p / "speed" / str(i))
                                      for i in range(len(w))], w) for p in policies}
    return {"real": real, "sims": sims}


def reread_bias(out: Path) -> str:
    """`--bias DIR`: the bias table (`BIAS_HEAD`) of a study's kept runs, recomputed from their
    summaries (figures, intervals and the bias's own interval; no run is repeated)."""
    kept = reread(out)
    levels = {k: round_levels(pd.read_parquet(out / "runs" / f))
              for k, f in RESIDUALS.items() if (out / "runs" / f).is_file()}
    biases = {v: variant_bias(kept["real"], sim, levels.get(profile_of(v)))
              for v, sim in kept["sims"].items()}
    summary = bias_summary(biases)
    return BIAS_HEAD + table_markdown(summary, bias_fmt(summary))
