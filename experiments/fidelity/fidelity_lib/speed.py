"""The machine's speed, which moves by ~10% over minutes: how far it moved between the profile's
parts (`part_levels`), and the simulation averaged over that spread (`speed_spread`, a
Gauss-Hermite quadrature over profiles scaled to each speed), the simulation's prediction of the
real runs' mean where latency is convex in the step time."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from .runs import figures, run_config, sim_overrides


def part_levels(paths) -> np.ndarray:
    """The machine's speed in each part of a study's profile (measured minutes apart, merged by
    `profiler.merge`) against the parts' typical speed: per part, the median over the grid's
    points of ln(its time / the point's median over the parts), over the points of at least
    0.1 ms in every part (the shorter ones are mostly the timer's noise). The parts hold the
    same points in the same order (`merge` checks)."""
    times = np.array([pd.read_parquet(x)["time_s"].to_numpy(dtype=float) for x in paths])
    if len(times) < 2:
        raise ValueError(f"the speed's spread needs >= 2 profile parts, got {len(times)}")
    ok = (times >= 1e-4).all(axis=0)
    if not ok.any():
        raise ValueError(f"{paths[0]}...: no point of >= 0.1 ms in every part")
    lt = np.log(times[:, ok])
    return np.median(lt - np.median(lt, axis=0), axis=1)


# points of the quadrature over the machine's speed (`speed_nodes`): exact for figures that are
# polynomials of degree up to 2n - 1 in the log speed, plenty for a smooth queue
SPEED_NODES = 5


def speed_nodes(sigma: float, n: int = SPEED_NODES) -> tuple[np.ndarray, np.ndarray]:
    """(factors, weights): Gauss-Hermite quadrature of a log-normal slowdown of log-sd `sigma`
    about 1 (factor exp(sigma x_i), weight w_i / sum w, x and w the probabilists' nodes and
    weights); sum_i w_i f(factor_i) is E f(exp(sigma Z)), Z standard normal."""
    if not sigma >= 0:
        raise ValueError(f"the speed's log-sd must be >= 0, got {sigma}")
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return np.exp(sigma * x), w / w.sum()


def scaled_profile(src, factor: float, dst) -> Path:
    """`src` on a machine `factor` times slower: every time (time_s, p10, p90) times `factor`,
    the metadata kept. The decode rewarm's factors, ratios of its rows, are unchanged."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    t = pq.read_table(src)
    for c in ("time_s", "time_p10_s", "time_p90_s"):
        t = t.set_column(t.schema.get_field_index(c), c, pc.multiply(t[c], float(factor)))
    pq.write_table(t, dst)
    return Path(dst)


def speed_spread(scale: dict, policies, profile, sigma: float, hardware, base: Path,
                 n: int = SPEED_NODES) -> dict:
    """Per policy, the simulation's figures averaged over the machine's speed (`speed_nodes`):
    the profile run at each quadrature factor (runs in base/<policy>/speed/<i>; base/speed.json
    records the factors and weights for `reread`). Latencies are convex in the step time where
    requests queue (a queue's wait grows as 1 / (1 - load)), so runs on a machine whose speed
    moves from one run to the next average above the simulation at its typical speed: with the
    speed's spread as the profile's parts measured it, this is the simulation's prediction of
    the real runs' mean."""
    from sarathi_lab.run import runner
    f, w = speed_nodes(sigma, n)
    base.mkdir(parents=True, exist_ok=True)
    figs = {p: [] for p in policies}
    for i, fi in enumerate(f):
        prof = scaled_profile(profile, fi, base / f"speed_profile_{i}.parquet")
        for p in policies:
            figs[p].append(figures(runner.run(run_config(scale, p, sim_overrides(prof),
                                                         hardware), base / p / "speed" / str(i))))
    (base / "speed.json").write_text(json.dumps({"sigma": sigma, "factors": f.tolist(),
                                                 "weights": w.tolist()}))
    return {p: weighted(v, w) for p, v in figs.items()}


def weighted(figs: list[dict], w) -> dict:
    """The figures' weighted mean, figure by figure."""
    return {k: float(np.dot(w, [x[k] for x in figs])) for k in figs[0]}
