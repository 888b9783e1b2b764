"""Does step noise with memory explain what a fidelity study's simulation misses?

    python experiments/fidelity/noise_memory.py [DIR] [--seeds 4]

Reads a study that `run.py` kept in DIR (default results/fidelity: its runs/ folder, its profile,
fidelity.json) and simulates its trace again under every policy with step jitter of two shapes,
each `--seeds` times (the figures averaged over the seeds: the simulation's expected figure):

- independent draws (`executor.step_jitter`), and
- draws with memory (`executor.step_jitter_memory`: an AR(1) log factor),

both with the real runs' own spread and correlation about the model (`noise_of`: fitted to these
runs, a diagnostic, not a prediction). Writes DIR/noise_memory.md: the verdict of each against
the kept real runs (bias, its interval, figures inside) and the errors on the P50/P90/P99 TBT.

Why: the real steps' speed drifts over hundreds of steps (their log residuals' lag-1
correlation is about 0.8), so slow steps come in runs, which lifts a run's upper percentiles more
than independent draws of the same spread do; a deterministic simulation has neither.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_lib import ROOT  # noqa: E402
from fidelity_lib.bias import bias_rows, verdict  # noqa: E402
from fidelity_lib.kept import reread  # noqa: E402
from fidelity_lib.report import table_markdown  # noqa: E402
from fidelity_lib.runs import figures, run_config, sim_overrides  # noqa: E402

TBT = ["tbt_p50", "tbt_p90", "tbt_p99"]


def noise_of(res: pd.DataFrame) -> tuple[float, float]:
    """(sigma, rho) of the real steps about the model: ln(measured / predicted) less its run's
    mean (what a whole run is off by is the machine's level that hour, not step noise); sigma
    its standard deviation, rho the median over runs of its lag-1 correlation within the run."""
    lr = np.log(res["measured_s"] / res["predicted_s"])
    d = lr - lr.groupby(res["run"]).transform("mean")
    rhos = [np.corrcoef(x[:-1], x[1:])[0, 1]
            for x in (g.to_numpy() for _, g in d.groupby(res["run"])) if len(x) > 2]
    if not rhos:
        raise ValueError("no real run with more than 2 iterations")
    return float(d.std(ddof=1)), float(np.clip(np.median(rhos), 0.0, 0.99))


def simulate(out: Path, info: dict, tag: str, jitter: list[str], seeds: int) -> dict[str, dict]:
    """Per policy, the figures of the study's simulation with these jitter overrides, averaged
    over `seeds` jitter streams (runs in DIR/runs/<policy>/noise_memory/<tag>-<seed>)."""
    from sarathi_lab import profiler
    from sarathi_lab.run import runner
    profile = out / "profile.parquet"
    hardware = profiler.host_hardware(profiler.profile_meta(profile)["device"])
    sims = {}
    for policy in info["policies"]:
        figs = []
        for seed in range(seeds):
            ex = [*sim_overrides(profile), *jitter, f"executor.step_jitter_seed={seed}"]
            d = out / "runs" / policy / "noise_memory" / f"{tag}-{seed}"
            figs.append(figures(runner.run(
                run_config(info["scale"], policy, ex, hardware), d)))
        sims[policy] = {k: float(np.mean([f[k] for f in figs])) for k in figs[0]}
    return sims


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", nargs="?", default=str(ROOT / "results" / "fidelity"))
    p.add_argument("--seeds", type=int, default=4, help="jitter streams per policy (>= 1)")
    a = p.parse_args(argv)
    if a.seeds < 1:
        sys.exit(f"--seeds={a.seeds}: must be >= 1")
    out = Path(a.dir)
    try:
        info = json.loads((out / "fidelity.json").read_text())
        res = pd.read_parquet(out / "runs" / "residuals.parquet")
    except FileNotFoundError as e:
        sys.exit(f"{out}: not a kept fidelity study ({e.filename} missing; run "
                 "experiments/fidelity/run.py --out DIR first)")
    real = reread(out)["real"]
    sigma, rho = noise_of(res)
    variants = {"independent": ("iid", [f"executor.step_jitter={sigma!r}"]),
                "with memory": ("ar1", [f"executor.step_jitter={sigma!r}",
                                        f"executor.step_jitter_memory={rho!r}"])}
    rows, tbt = [], []
    for name, (tag, jitter) in variants.items():
        sims = simulate(out, info, tag, jitter, a.seeds)
        t = verdict(real, sims)
        rows += bias_rows(real, sims, jitter=name)
        tbt.append(t[t["metric"].isin(TBT)].pivot(index="policy", columns="metric",
                                                  values="error")[TBT].assign(jitter=name))
    summary = pd.DataFrame(rows)
    tbt_t = pd.concat(tbt).reset_index()[["jitter", "policy", *TBT]]
    md = (f"Step noise of the real runs about the model (`noise_of`, fitted to these runs: a "
          f"diagnostic): log-sd {sigma:.3f}, lag-1 correlation {rho:.2f}. The simulation with "
          f"jitter of that spread, independent or with that memory, figures averaged over "
          f"{a.seeds} jitter streams, against the {len(next(iter(real.values())))} real runs "
          f"per policy kept in {out}:\n\n"
          + table_markdown(summary, {"bias": "+.1%", "error_sd": ".1%"})
          + "\nError on TBT percentiles:\n\n"
          + table_markdown(tbt_t, {m: "+.1%" for m in TBT}))
    (out / "noise_memory.md").write_text(md)
    print(md)
    return md


if __name__ == "__main__":
    main()
