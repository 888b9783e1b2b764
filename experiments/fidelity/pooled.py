"""The bias at the profile's own speed, pooled over the rounds of several kept studies.

    python experiments/fidelity/pooled.py DIR [DIR ...] [--variant profiled]

Each DIR is a study `run.py` kept (its runs/ folder with the real runs, the simulation and
runs/residuals.parquet). Per round of real runs: the goal figures' bias (`bias_interval`'s
per-round value) and how slow the machine ran that round against the profile (`round_levels`;
both in fidelity_lib/bias.py).
Prints, per study and over all the rounds together, the study's bias, the rounds' mean level and
the bias at the profile's speed (`matched_bias`: the intercept of the rounds' biases against
their log level, with its 90% interval), the slope and the correlation.

Why: on a machine whose speed moves by ±10% from one run to the next, one study's bias is mostly
its rounds' speed against the profile's. Pooling studies' rounds separates what the simulation
misses at equal speed from what the machine did, with as many rounds as were run.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_lib.bias import GOAL, RESIDUALS, bias_interval, matched_bias, profile_of, round_levels
from fidelity_lib.kept import reread  # noqa: E402
from fidelity_lib.report import matched_text, table_markdown  # noqa: E402


def rounds_of(out: Path, variant: str) -> tuple[list[float], list[float], float]:
    """(per-round goal biases, per-round levels, the study's goal bias) of a kept study."""
    kept = reread(out)
    if variant not in kept["sims"]:
        raise ValueError(f"{out}: no kept simulation {variant!r} (has "
                         f"{', '.join(kept['sims'])})")
    res = out / "runs" / RESIDUALS[profile_of(variant)]
    if not res.is_file():
        raise FileNotFoundError(f"{res}: the study's priced iterations are not kept")
    iv = bias_interval(kept["real"], kept["sims"][variant], GOAL)
    return iv["per_round"], round_levels(pd.read_parquet(res)), iv["bias"]


def pooled(dirs, variant: str = "profiled") -> pd.DataFrame:
    """One row per study and one for all their rounds (`matched_bias` where >= 3 rounds)."""
    rows, all_b, all_l = [], [], []
    for d in dirs:
        b, lv, study_bias = rounds_of(Path(d), variant)
        all_b += b
        all_l += lv
        rows.append({"study": str(d), "rounds": len(b), "bias_goal": study_bias,
                     "level_mean": float(pd.Series(lv).mean()),
                     **fit(b, lv)})
    rows.append({"study": "all", "rounds": len(all_b),
                 "bias_goal": float(pd.Series([r["bias_goal"] for r in rows]).mean()),
                 "level_mean": float(pd.Series(all_l).mean()), **fit(all_b, all_l)})
    t = pd.DataFrame(rows)
    if "at_profile_speed" in t:   # a study of fewer than 3 rounds has no line of its own
        t["at_profile_speed"] = t["at_profile_speed"].fillna("")
    return t


def fit(b, lv) -> dict:
    if len(b) < 3:
        return {}
    m = matched_bias(b, lv)
    return {"at_profile_speed": matched_text(m), "slope": m["slope"], "r": m["r"]}


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", help="kept studies (run.py --out DIR)")
    p.add_argument("--variant", default="profiled", help="the simulation compared (default "
                   "profiled: the profile of medians)")
    a = p.parse_args(argv)
    try:
        t = pooled(a.dirs, a.variant)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(str(e))
    md = table_markdown(t, {"bias_goal": "+.1%", "level_mean": ".3f", "slope": ".2f",
                            "r": ".2f"})
    print(md)
    return md


if __name__ == "__main__":
    main()
