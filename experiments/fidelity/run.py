"""Fidelity of the simulator against real runs on this machine.

    python experiments/fidelity/run.py [--toy] [--profile PATH] [--repeats 5] [--out DIR]
        [--qps R] [--policies a,b] [--requests N]
    python experiments/fidelity/run.py --bias DIR    # the bias table of a kept study, again

1. Profiles the real (torch) executor here with `sarathi-lab-profile`'s code (or reuses --profile),
   in parts spread over the real runs, each part giving a profile of medians and one of means
   from the same rounds.
2. Replays one trace with `executor=torch` (`--repeats` times, interleaved over the policies),
   recording every step's batch, and with `executor=sim executor.cost_model=profiled` on each
   profile, with and without step jitter, under request_level, orca, vllm and sarathi at two
   token budgets, on the same KV cache size.
3. Writes, in DIR (default results/fidelity, or results/fidelity/toy with --toy): fidelity.csv
   (per policy and figure: the real runs' mean and 90% t-interval of the mean, the simulated
   value, its error against the mean, inside or not), fidelity.md (the verdict tables, the bias
   and spread over figures, the residuals and host time), residuals.csv / residuals_mean.csv
   (measured - predicted per iteration, on the very batch each real iteration ran, by batch
   composition), decode_streams.csv (single-request decodes by their place in a run of them),
   host_time.csv (the iterations' host_s by batch size), fidelity.json, cdfs.png,
   profile.parquet, profile_mean.parquet and profile_check.csv.

Noise control: one torch thread (OMP_NUM_THREADS=1 set before torch loads; a 2-core machine shared
with other jobs swings by 3-4x with two); the profile and the real runs timed on the thread's CPU
time (`executor.clock=cpu`: a real run's clock is the engine's virtual clock, advanced by each
step's measured duration, so every token time is a sum of measured step times, and time other
jobs hold the core is in none of them; the host time around the steps is recorded as host_s and
not counted); the real runs repeated in interleaved rounds so that a slow period touches every
policy alike.

The study's library is fidelity_lib/ beside this script (its __init__ lists the modules), shared
with the scripts that read a kept study again (pooled.py, speed_spread.py, noise_memory.py); this
file is the command line alone.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

<<<<<<< HEAD
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
from studies import compose, host_profile  # noqa: E402

# A random Llama (about 5M parameters) whose real runs of a few hundred requests take seconds each
# on one CPU thread, with both compute (prefills of a few hundred tokens: tens of ms) and per-step
# overheads (a decode step: a few ms) in play.
MODEL = ["model=tiny-llama", "model.name=fidelity-llama", "model.num_layers=4",
         "model.hidden_size=256", "model.intermediate_size=768", "model.num_heads=4",
         "model.num_kv_heads=2", "model.head_dim=64", "model.vocab_size=4096",
         "model.max_model_len=1024"]

POLICIES = {
    "request_level": ["scheduler=request_level"],
    "orca": ["scheduler=orca"],
    "vllm": ["scheduler=vllm"],
    "sarathi-128": ["scheduler=sarathi", "scheduler.token_budget=128"],
    "sarathi-512": ["scheduler=sarathi", "scheduler.token_budget=512"],
}

# what the profile and the real runs time: the thread's CPU time (see the docstring)
CLOCK = "executor.clock=cpu"

SCALES = {
    # prompts of ~50-768 tokens (chunked under both budgets), outputs of ~5-200
    # 7 req/s keeps the real runs busy about 80% of their span on a quiet 2-core CPU (steps of
    # ~23 s of CPU for 200 requests): below capacity, where latency follows the steps and not
    # an ever-growing queue (Vidur's comparisons stop at ~85% of capacity); --qps 10 is at it
    "full": dict(model=MODEL, grid="cpu", profile_repeats=5, num_requests=200, qps=7.0,
                 prompt_len={"dist": "lognormal", "mean": 256, "sigma": 0.6},
                 output_len={"dist": "lognormal", "mean": 32, "sigma": 0.7},
                 max_prompt_tokens=768, max_total_tokens=1024, num_kv_blocks=2048),
    "toy": dict(model=["model=tiny-llama", "model.max_model_len=512"], grid="tiny",
                profile_repeats=3, num_requests=16, qps=200.0,
                prompt_len={"dist": "uniform", "low": 16, "high": 160},
                output_len={"dist": "uniform", "low": 2, "high": 12},
                max_prompt_tokens=160, max_total_tokens=200, num_kv_blocks=256),
}

# (summary key, statistic) of each compared figure
METRICS = [(m, q) for m in ("ttft", "tbt", "e2e") for q in ("p50", "p90", "p99")] + \
    [("throughput_tok_s", None), ("num_iterations", None)]


def metric_name(m, q):
    return f"{m}_{q}" if q else m


def run_config(scale: dict, policy: str, executor: list[str], hardware: dict | None) -> dict:
    c = compose([*scale["model"], *POLICIES[policy], *executor, "trace=synthetic",
                 f"scheduler.num_kv_blocks={scale['num_kv_blocks']}", "progress=false"])
    c["trace"].update(num_requests=scale["num_requests"], qps=scale["qps"],
                      prompt_len=scale["prompt_len"], output_len=scale["output_len"],
                      max_prompt_tokens=scale["max_prompt_tokens"],
                      max_total_tokens=scale["max_total_tokens"], seed=0)
    if hardware is not None:
        c["hardware"] = hardware
    return c


def sim_overrides(profile) -> list[str]:
    """The simulator on `profile`, as a run's overrides."""
    return ["executor=sim", "executor.cost_model=profiled", f"executor.profile={profile}"]


def figures(summary: dict) -> dict:
    return {metric_name(m, q): (summary[m][q] if q else summary[m]) for m, q in METRICS}


# Student's t, 95th percentile, by degrees of freedom 1-30 (a 90% two-sided interval)
T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782,
       1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711,
       1.708, 1.706, 1.703, 1.701, 1.699, 1.697)


def t95(df: int) -> float:
    """The t distribution's 95th percentile: the table to 30 degrees of freedom, beyond it the
    Cornish-Fisher series about the normal's 1.6449 (within 1e-4 there)."""
    if df < 1:
        raise ValueError(f"an interval of the mean needs at least 2 runs (got {df + 1})")
    if df <= len(T95):
        return T95[df - 1]
    z = 1.6448536
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def mean_interval(vals) -> tuple[float, float, float]:
    """(mean, low, high): the 90% t-interval of the mean of the runs, mean +- t95(n - 1) s /
    sqrt(n), s the sample standard deviation. Of the mean, not of one run: the simulation
    predicts a figure's expected value, and the question is whether the runs' mean differs from
    it by more than their number can resolve (an empirical 5-95% of five runs would be their
    minimum and maximum, which hold a sixth run with probability 4/6, not 0.9)."""
    v = np.asarray(vals, dtype=float)
    m = float(v.mean())
    h = t95(len(v) - 1) * float(v.std(ddof=1)) / np.sqrt(len(v))
    return m, m - h, m + h


# the figures the bias is taken over: latency percentiles (not throughput or counts, which the
# arrival rate and the trace fix while the system keeps up)
LATENCY = [metric_name(m, q) for m, q in METRICS if q]
# the issue's goal: these inside the real runs' interval
GOAL = ["ttft_p50", "ttft_p99", "tbt_p50", "tbt_p99"]


def verdict(real: dict[str, list[dict]], sim: dict[str, dict]) -> pd.DataFrame:
    """Per policy and figure: the real runs' mean and 90% interval (`mean_interval`), their
    spread (max - min) / mean, the simulated value, its error against the mean and whether it
    lies inside the interval."""
    rows = []
    for policy, runs in real.items():
        for name in (metric_name(m, q) for m, q in METRICS):
            vals = [r[name] for r in runs]
            m, lo, hi = mean_interval(vals)
            s = float(sim[policy][name])
            rows.append({"policy": policy, "metric": name, "real_mean": m, "real_lo": lo,
                         "real_hi": hi, "half_width": (hi - m) / m if m else np.nan,
                         "real_spread": (max(vals) - min(vals)) / m if m else np.nan,
                         "sim": s, "error": s / m - 1 if m else np.nan,
                         "inside": bool(lo <= s <= hi), "repeats": len(vals)})
    return pd.DataFrame(rows)


def bias(table: pd.DataFrame, metrics=None) -> dict:
    """Over the latency figures (`metrics`, default all of LATENCY) of `verdict`'s table: the
    bias (mean signed error), the spread of the errors about it (their standard deviation), the
    mean |error|, the figures inside the real runs' interval, and the real runs' own spread
    (the median interval half-width, relative to the mean)."""
    t = table[table["metric"].isin(metrics or LATENCY)]
    e = t["error"].to_numpy(dtype=float)
    return {"figures": len(t), "bias": float(e.mean()), "error_sd": float(e.std(ddof=1)),
            "mean_abs_error": float(np.abs(e).mean()), "inside": int(t["inside"].sum()),
            "half_width_median": float(t["half_width"].median())}


def bias_interval(real: dict[str, list[dict]], sim: dict[str, dict], metrics=None) -> dict:
    """The bias's own 90% interval: can five rounds of real runs tell it from 0? The runs of one
    round (repeat i of every policy, back to back) share the machine's state, and that state
    moves every figure of a run together (a figure's runs differ by more than its steps'
    noise would make them), so the figures' errors are not independent and the spread of the
    errors over figures says nothing of the bias's uncertainty. Per round i: the mean over
    policies and `metrics` (default LATENCY) of sim / run_i - 1; the half-width of the
    t-interval of the rounds' biases (`mean_interval`) about the bias (`bias`'s, against the
    runs' means: the rounds' own mean is higher by Jensen's inequality, 1 / x being convex)."""
    ms = metrics or LATENCY
    rounds = {len(r) for r in real.values()}
    if len(rounds) != 1:
        raise ValueError(f"every policy needs as many rounds of real runs, got {sorted(rounds)}")
    per = [float(np.mean([sim[p][m] / real[p][i][m] - 1 for p in real for m in ms]))
           for i in range(rounds.pop())]
    m, lo, _ = mean_interval(per)
    b = float(np.mean([sim[p][m] / np.mean([r[m] for r in real[p]]) - 1
                       for p in real for m in ms]))
    return {"per_round": per, "bias": b, "half_width": m - lo, "lo": b - (m - lo),
            "hi": b + (m - lo)}


def round_levels(res: pd.DataFrame) -> list[float]:
    """Per round of real runs (repeat i of every policy: runs named real-<i>), its steps'
    measured time over what the profile predicts for them (`residuals`, a ratio of sums, which
    is what a latency sees): how slow the machine ran that round against the profile."""
    rep = res["run"].str.extract(r"real-(\d+)$")[0]
    if rep.isna().any():
        raise ValueError("round_levels: every run's folder must be named real-<i>")
    g = res.groupby(rep.astype(int))
    return (g["measured_s"].sum() / g["predicted_s"].sum()).sort_index().tolist()


def matched_bias(per_round, levels) -> dict:
    """The bias at the profile's own speed. A round whose machine ran slower than the profile
    has every figure's error lower by about the same share, so a study's bias is mostly its
    rounds' speed (on this machine 0.85-1.17 of the profile from one round to the next), not
    the simulation's. The per-round biases (`bias_interval`'s) against the log of the rounds'
    levels (`round_levels`), a least-squares line: its intercept, the bias of a round whose
    steps took in sum what the profile predicts, with its 90% t-interval (n - 2 degrees of
    freedom), the slope (the bias per unit of log level) and the correlation."""
    x, y = np.log(np.asarray(levels, dtype=float)), np.asarray(per_round, dtype=float)
    n = len(y)
    if n != len(x) or n < 3:
        raise ValueError(f"matched_bias: needs as many levels as rounds, >= 3 (got {n} "
                         f"rounds, {len(x)} levels)")
    if np.ptp(x) == 0:
        raise ValueError("matched_bias: every round ran at the same level; no line through them")
    a = np.c_[np.ones(n), x]
    coef = np.linalg.lstsq(a, y, rcond=None)[0]
    resid = y - a @ coef
    cov = float(resid @ resid) / (n - 2) * np.linalg.inv(a.T @ a)
    h = t95(n - 2) * float(np.sqrt(cov[0, 0]))
    return {"bias": float(coef[0]), "lo": float(coef[0] - h), "hi": float(coef[0] + h),
            "slope": float(coef[1]), "r": float(np.corrcoef(x, y)[0, 1]), "rounds": n}


def bias_rows(real: dict, sim: dict, **label) -> list[dict]:
    """The goal's and all latency figures' bias of `sim` against the real runs, a row each
    (with `label`'s columns first): bias, its 90% interval, the errors' sd, figures inside."""
    vb, rows = variant_bias(real, sim), []
    for g in ("goal", "latency"):
        b, iv = vb[g], vb[g]["interval"]
        rows.append({**label, "figures": g, "bias": b["bias"],
                     "bias_90": f"{iv['lo']:+.1%} to {iv['hi']:+.1%}",
                     "error_sd": b["error_sd"], "inside": b["inside"], "of": b["figures"]})
    return rows


# every real iteration priced on each profile (`residuals`), kept in a study's runs/ folder
RESIDUALS = {"median": "residuals.parquet", "mean": "residuals_mean.parquet"}


def profile_of(variant: str) -> str:
    """Which profile a simulation variant runs on: the rounds' speeds are taken against it."""
    return "mean" if variant.startswith("mean") else "median"


def variant_bias(real: dict, sim: dict, levels=None) -> dict:
    """{"latency" | "goal": `bias` over those figures, its "interval" (`bias_interval`) and,
    given the rounds' levels (>= 3 rounds), its "matched" bias (`matched_bias`)}."""
    t = verdict(real, sim)
    out = {}
    for g, ms in (("latency", None), ("goal", GOAL)):
        iv = bias_interval(real, sim, ms)
        out[g] = {**bias(t, ms), "interval": iv}
        if levels is not None and len(levels) >= 3:
            out[g]["matched"] = matched_bias(iv["per_round"], levels)
    return out

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


def real_sigma(res: pd.DataFrame) -> float:
    """The log-sd of the real steps about the model, as `jitter_sigma` reads a profile's:
    (p90 - p10) / 2.5632 of ln(measured / predicted), each iteration's taken about the median
    of its composition (what the model misses by composition is not spread)."""
    lr = np.log(res["measured_s"] / res["predicted_s"])
    lr = lr - lr.groupby(res["composition"]).transform("median")
    return float((lr.quantile(0.9) - lr.quantile(0.1)) / (2 * 1.2816))


def jitter_sigma(profile) -> float:
    """The log-sd of a step's time around its median, from the profile's repeats: per row
    ln(p90 / p10) / (2 x 1.2816), as a lognormal has it; the median over the rows."""
    prof = pd.read_parquet(profile)
    ok = (prof["time_p10_s"] > 0) & (prof["time_p90_s"] >= prof["time_p10_s"])
    r = np.log(prof.loc[ok, "time_p90_s"] / prof.loc[ok, "time_p10_s"]) / (2 * 1.2816)
    if not len(r):
        raise ValueError(f"{profile}: no row with a measured spread (p10 > 0)")
    return float(np.median(r))


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


BIAS_HEAD = ("Bias (mean signed error of the simulation against the real runs' mean), the "
             "bias's own 90% interval over the rounds of real runs (`bias_interval`: per "
             "round, the mean error against that round's runs) and the spread of the errors "
             "(sd), over the goal's 4 figures per policy (P50/P99 TTFT and TBT) and over all 9 "
             "latency figures per policy; `inside`: figures inside the real runs' 90% "
             "t-interval of the mean; with 3 or more rounds, `bias_goal_at_profile_speed`: the "
             "goal's bias in a round whose steps took in sum what the profile predicts "
             "(`matched_bias`: the rounds' biases against their machine's speed, the line's "
             "intercept and its 90% interval):\n\n")


def bias_summary(biases: dict) -> pd.DataFrame:
    """One row per simulation variant from `{variant: {"goal"|"latency": bias() + interval}}`
    (`variant_bias`); the bias at the profile's speed blank where it was not taken."""
    t = pd.DataFrame([{"simulation": v, **{
        k: val for g in ("goal", "latency") for k, val in (
            (f"bias_{g}", b[g]["bias"]),
            (f"bias_{g}_90", f"{b[g]['interval']['lo']:+.1%} to {b[g]['interval']['hi']:+.1%}"),
            (f"error_sd_{g}", b[g]["error_sd"]), (f"inside_{g}", b[g]["inside"]))},
        **({"bias_goal_at_profile_speed": matched_text(b["goal"]["matched"])}
           if "matched" in b["goal"] else {})}
        for v, b in biases.items()])
    if "bias_goal_at_profile_speed" in t:
        t["bias_goal_at_profile_speed"] = t["bias_goal_at_profile_speed"].fillna("")
    return t


def matched_text(m: dict) -> str:
    return f"{m['bias']:+.1%} ({m['lo']:+.1%} to {m['hi']:+.1%})"


def bias_fmt(summary: pd.DataFrame) -> dict:
    return {c: "+.1%" if c.startswith("bias") and not c.endswith(("_90", "_speed")) else
            (".1%" if c.startswith("error") else "") for c in summary.columns}


def verdict_markdown(table: pd.DataFrame, what: str) -> str:
    """The simulation's error against the real runs' mean per policy (rows) and figure
    (columns), the interval's half-width beside it, **out** where it lies outside; then the
    bias and spread over the latency figures, and over the goal's four (P50/P99 TTFT and TBT)."""
    names = list(dict.fromkeys(table["metric"]))
    head = "| policy | " + " | ".join(names) + " |\n|---|" + "---|" * len(names) + "\n"
    body = ""
    for policy, d in table.groupby("policy", sort=False):
        d = d.set_index("metric")
        cells = [f"{d.loc[n, 'error']:+.1%} (±{d.loc[n, 'half_width']:.1%})"
                 + ("" if d.loc[n, "inside"] else " **out**") for n in names]
        body += f"| {policy} | " + " | ".join(cells) + " |\n"
    lines = []
    for label, ms in (("all latency figures", LATENCY), ("P50/P99 TTFT and TBT", GOAL)):
        b = bias(table, ms)
        lines.append(f"- {label} ({b['figures']}): bias (mean signed error) **{b['bias']:+.1%}**, "
                     f"spread of the errors (sd) {b['error_sd']:.1%}, mean |error| "
                     f"{b['mean_abs_error']:.1%}; inside the real runs' interval: "
                     f"**{b['inside']} of {b['figures']}**; the interval's median half-width "
                     f"{b['half_width_median']:.1%}")
    return (f"Error of the simulation ({what}) against the mean of the real runs; in brackets "
            "the half-width of the real runs' 90% t-interval of the mean, relative to it; "
            "**out**: outside it.\n\n" + head + body + "\n" + "\n".join(lines) + "\n")


def table_markdown(df: pd.DataFrame, fmt: dict) -> str:
    """A small DataFrame as a Markdown table, columns formatted by `fmt` (format specs)."""
    cols = list(df.columns)
    out = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    for r in df.to_dict("records"):
        out += "| " + " | ".join(format(r[c], fmt.get(c, "")) for c in cols) + " |\n"
    return out


@contextmanager
def recording_batches():
    """Every real step's batch as the cost model reads it ((chunk, context) prefills, decode
    contexts, sampled: `costmodels.base.batch_shape`), appended to the yielded list, one per
    iteration in order. Recorded after the step returns, between the executor's clock reads and
    the engine's (`Engine.step`), so that neither the step's duration nor its host_s holds it."""
    from sarathi_lab.costmodels.base import batch_shape
    from sarathi_lab.executors.torch_exec import TorchExecutor
    shapes, execute = [], TorchExecutor.execute

    def recorded(self, out):
        res = execute(self, out)
        shapes.append(batch_shape(out.reqs, out.num_new_tokens))
        return res
    TorchExecutor.execute = recorded
    try:
        yield shapes
    finally:
        TorchExecutor.execute = execute


# decode batch sizes (requests) and prefill chunk sizes (tokens) the residuals are grouped by
DECODE_BINS = ((1, 1), (2, 4), (5, 8), (9, 10 ** 9))
CHUNK_BINS = ((1, 128), (129, 512), (513, 10 ** 9))


def _bin(lo, hi) -> str:
    return f"{lo}" if lo == hi else (f"{lo}+" if hi >= 10 ** 9 else f"{lo}-{hi}")


def composition(shape) -> str:
    """A batch's kind: decode-only by requests, prefill-only by tokens, or mixed."""
    prefills, decodes, _ = shape
    if prefills and decodes:
        return "mixed"
    n, bins, kind = ((len(decodes), DECODE_BINS, "decode b=") if decodes else
                     (sum(c for c, _ in prefills), CHUNK_BINS, "prefill c="))
    return kind + next(_bin(lo, hi) for lo, hi in bins if lo <= n <= hi)


def residuals(run_dirs, shapes, cost_model) -> pd.DataFrame:
    """One row per real iteration: its composition, measured duration and host time, and the
    cost model's prediction on the very batch it ran (free of the feedback through the queue),
    times the factor of its place after the run's last prompt step where the profile has
    decode_rewarm rows, as the simulation prices it (`costmodels.rewarm`)."""
    frames = []
    for d, sh in zip(run_dirs, shapes):
        warmth = cost_model.rewarm.track() if cost_model.rewarm is not None else None
        factor = [warmth.step(sum(c for c, _ in x[0])) if warmth else 1.0 for x in sh]
        it = pd.read_parquet(Path(d) / "iterations.parquet")
        if len(it) != len(sh):
            raise ValueError(f"{d}: {len(it)} iterations but {len(sh)} recorded batches")
        comp = [composition(x) for x in sh]
        frames.append(pd.DataFrame({
            "run": str(d), "composition": comp, "stream_pos": stream_positions(comp),
            "requests": it["num_requests"].to_numpy(), "measured_s": it["duration"].to_numpy(),
            "host_s": it["host_s"].to_numpy(),
            "predicted_s": [cost_model.iteration_time(*x) * f for x, f in zip(sh, factor)],
            "rewarm_factor": factor,
            "prefill_tokens": [sum(c for c, _ in x[0]) for x in sh],
            "prefill_context": [sum(k for _, k in x[0]) for x in sh],
            "decodes": [len(x[1]) for x in sh],
            "decode_context": [float(np.mean(x[1])) if x[1] else 0.0 for x in sh]}))
    return pd.concat(frames, ignore_index=True)


def stream_positions(comps) -> list[int]:
    """Per iteration of a run (its compositions in order): its place in a run of consecutive
    single-request decodes (1: the first after a step of another kind), 0 for other steps."""
    out, n = [], 0
    for c in comps:
        n = n + 1 if c == "decode b=1" else 0
        out.append(n)
    return out


# places in a run of single-request decodes the residuals are grouped by
STREAM_BINS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 10 ** 9))


def stream_table(res: pd.DataFrame) -> pd.DataFrame:
    """Single-request decodes by their place in a run of them: iterations, measured / predicted
    median and ratio of sums, the measured median (ms). A decode gets faster over the first steps
    of such a run on a CPU (experiments/fidelity/decode_warmth.py); a profile that times its
    decodes in another state misses them by where they fall."""
    rows = []
    for lo, hi in STREAM_BINS:
        g = res[(res["stream_pos"] >= lo) & (res["stream_pos"] <= hi)]
        if len(g):
            rows.append({"place": _bin(lo, hi), "iterations": len(g),
                         "ratio_p50": (g["measured_s"] / g["predicted_s"]).median(),
                         "ratio_of_sums": g["measured_s"].sum() / g["predicted_s"].sum(),
                         "measured_ms_p50": g["measured_s"].median() * 1e3})
    return pd.DataFrame(rows)


def residual_table(res: pd.DataFrame) -> pd.DataFrame:
    """Per composition: iterations, share of the measured step time, the residual (measured -
    predicted, ms) median and p10/p90, the ratio measured / predicted median and p10/p90, and
    the ratio of the sums (what a latency, a sum of step times, sees)."""
    rows = []
    for comp, g in res.groupby("composition"):
        r = (g["measured_s"] - g["predicted_s"]) * 1e3
        q = g["measured_s"] / g["predicted_s"]
        rows.append({"composition": comp, "iterations": len(g),
                     "time_share": g["measured_s"].sum() / res["measured_s"].sum(),
                     "resid_ms_p10": r.quantile(0.1), "resid_ms_p50": r.median(),
                     "resid_ms_p90": r.quantile(0.9), "ratio_p10": q.quantile(0.1),
                     "ratio_p50": q.median(), "ratio_p90": q.quantile(0.9),
                     "ratio_of_sums": g["measured_s"].sum() / g["predicted_s"].sum()})
    order = {c: i for i, c in enumerate(
        [f"decode b={_bin(*b)}" for b in DECODE_BINS] + [f"prefill c={_bin(*b)}"
                                                          for b in CHUNK_BINS] + ["mixed"])}
    return pd.DataFrame(rows).sort_values("composition", key=lambda c: c.map(order),
                                          ignore_index=True)


def host_table(res: pd.DataFrame) -> pd.DataFrame:
    """Host time per iteration (the iterations' host_s) by requests in the batch: median and
    p90 (µs), and its share of the step time over those iterations."""
    rows = []
    for lo, hi in DECODE_BINS:
        g = res[(res["requests"] >= lo) & (res["requests"] <= hi)]
        if len(g):
            rows.append({"requests": _bin(lo, hi), "iterations": len(g),
                         "host_us_p50": g["host_s"].median() * 1e6,
                         "host_us_p90": g["host_s"].quantile(0.9) * 1e6,
                         "host_share": g["host_s"].sum() / g["measured_s"].sum()})
    return pd.DataFrame(rows)


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


def busy_share(run_dir) -> float:
    """The share of a run's span (first arrival to last finish) that its iterations ran."""
    it = pd.read_parquet(Path(run_dir) / "iterations.parquet")
    req = pd.read_parquet(Path(run_dir) / "requests.parquet", columns=["arrival_time",
                                                                        "finish_time"])
    span = req["finish_time"].max() - req["arrival_time"].min()
    return float(it["duration"].sum() / span) if span > 0 else float("nan")


def study(out: Path, toy: bool = False, profile: str | None = None, repeats: int = 5,
          log=print, scale_name: str | None = None, qps: float | None = None,
          policies: list[str] | None = None, num_requests: int | None = None,
          warm: int | None = None) -> pd.DataFrame:
    import torch

    from sarathi_lab.run import runner
    torch.set_num_threads(1)
    if repeats < 2:
        raise ValueError(f"--repeats={repeats}: the interval of the real runs' mean needs >= 2")
    scale = dict(SCALES[scale_name or ("toy" if toy else "full")])
    if qps is not None:
        scale["qps"] = qps
    if num_requests is not None:
        scale["num_requests"] = num_requests
    unknown = sorted(set(policies or ()) - set(POLICIES))
    if unknown:
        raise ValueError(f"--policies: {', '.join(unknown)} not among {', '.join(POLICIES)}")
    chosen = policies or list(POLICIES)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # Without --profile the profile is measured in parts, one before each round of real runs
    # and one after the last, and merged point by point (median of the parts): this machine's
    # speed drifts by ~10% over minutes (two profiles taken 10 minutes apart on a quiet machine
    # predicted the same runs 12% apart), so a profile taken at one time misses runs taken at
    # another by that much, whatever the cost model.
    # Each part gives two profiles from the same rounds: of medians (each step at its typical
    # time: the "before") and of means (the "after": a latency is a sum of steps, whose
    # expectation is the sum of their means; `profiler.measure.STATISTICS`).
    parts = [] if profile is None else None
    mean_parts = []
    t_profile = 0.0

    def profile_part(i: int) -> None:
        nonlocal t_profile
        from sarathi_lab import profiler
        t = time.perf_counter()
        log(f"profiling the torch executor (grid {scale['grid']}, part {i + 1} of "
            f"{repeats + 1}) ...")
        part_dir = out / "runs" / "profile_parts" / str(i)
        mean_parts.append(part_dir / "profile_mean.parquet")
        parts.append(profiler.profile(
            [*scale["model"], "executor.device=cpu", "executor.dtype=float32", CLOCK],
            part_dir / "profile.parquet", scale["grid"], scale["profile_repeats"], 1, threads=1,
            progress=not toy, also={"mean": mean_parts[-1]},
            **({} if warm is None else {"warm": warm})))
        t_profile += time.perf_counter() - t

    load = {"before_runs": os.getloadavg()[0]}
    torch_ex = ["executor=torch", "executor.device=cpu", "executor.dtype=float32", CLOCK]
    if parts is None:
        profile, meta, hardware = host_profile(scale["model"], out, scale["grid"],
                                               scale["profile_repeats"], profile=profile)
        # a profile made for another model or machine fails here, before the real runs
        runner.build(run_config(scale, chosen[0], sim_overrides(profile), hardware))
    runs = {p: {"real": [], "sim": None} for p in chosen}
    real = {p: [] for p in chosen}
    shapes = {p: [] for p in chosen}
    walls = []
    for rep in range(repeats):          # interleaved rounds: drift touches every policy alike
        if parts is not None:
            profile_part(rep)
        for policy in chosen:
            d = out / "runs" / policy / f"real-{rep}"
            w = time.perf_counter()
            with recording_batches() as sh:
                s = runner.run(run_config(scale, policy, torch_ex, None), d)
            walls.append(time.perf_counter() - w)
            load[f"{policy}#{rep}"] = os.getloadavg()[0]
            real[policy].append(figures(s))
            runs[policy]["real"].append(d)
            shapes[policy].append(sh)
            log(f"real {policy} #{rep}: {s['num_finished']} finished, {s['num_iterations']} "
                f"iterations, {walls[-1]:.1f} s")
    if parts is not None:
        from sarathi_lab import profiler
        profile_part(repeats)
        merged = profiler.merge(parts, out / "profile.parquet")
        mean_profile = profiler.merge(mean_parts, out / "profile_mean.parquet")
        profile, meta, hardware = host_profile(scale["model"], out, scale["grid"],
                                               scale["profile_repeats"], profile=merged)
    sim_ex = sim_overrides(profile)
    # and again with each step's time drawn around its prediction, with the spread the profile
    # measured (executor.step_jitter): the real runs' P99s come from their steps' slow tail
    sigma = jitter_sigma(profile)
    jitter = f"executor.step_jitter={sigma!r}"
    variants = {"profiled": sim_ex, "jitter": [*sim_ex, jitter]}
    if parts is not None:
        variants.update(mean=sim_overrides(mean_profile),
                        mean_jitter=[*sim_overrides(mean_profile), jitter])
    # the residuals: the profiled model on the batches the real runs ran
    from sarathi_lab.costmodels.profiled import ProfiledConfig, ProfiledCostModel
    cm = ProfiledCostModel(run_config(scale, chosen[0], sim_ex, hardware)["model"], hardware, 1,
                           ProfiledConfig(profile=str(profile)))
    res = pd.concat([residuals(runs[p]["real"], shapes[p], cm).assign(policy=p)
                     for p in chosen], ignore_index=True)
    res_t = residual_table(res)
    levels = {"median": round_levels(res)}   # the rounds' speeds, against each profile
    res_t.to_csv(out / "residuals.csv", index=False)
    stream_t = stream_table(res)
    stream_t.to_csv(out / "decode_streams.csv", index=False)
    res.to_parquet(out / "runs" / RESIDUALS["median"])   # every iteration, for a closer look
    res_mean_t = None
    if parts is not None:
        cm_mean = ProfiledCostModel(run_config(scale, chosen[0], sim_ex, hardware)["model"],
                                    hardware, 1, ProfiledConfig(profile=str(mean_profile)))
        res_mean = pd.concat([residuals(runs[p]["real"], shapes[p], cm_mean)
                              for p in chosen], ignore_index=True)
        res_mean_t = residual_table(res_mean)
        res_mean_t.to_csv(out / "residuals_mean.csv", index=False)
        res_mean.to_parquet(out / "runs" / RESIDUALS["mean"])
        levels["mean"] = round_levels(res_mean)
    # A diagnostic, not a prediction: jitter with the spread the real runs' own steps showed
    # about the model (`real_sigma`), fitted to these very runs. If it closes the bias, the
    # missing term is the steps' variability, which queueing and the tail percentiles turn into
    # longer latencies than steps of their typical time would give.
    sigma_real = real_sigma(res)
    variants["jitter_real"] = [*sim_ex, f"executor.step_jitter={sigma_real!r}"]
    sims = {v: {} for v in variants}
    for policy in chosen:
        for v, ex in variants.items():
            d = out / "runs" / policy / ("sim" if v == "profiled" else f"sim_{v}")
            sims[v][policy] = figures(runner.run(run_config(scale, policy, ex, hardware), d))
        runs[policy]["sim"] = out / "runs" / policy / "sim"
    # The machine's speed moves between runs, and where requests queue a latency is convex in
    # the step time: the real runs' mean lies above the simulation at the typical speed. The
    # profile's parts, minutes apart, measure how far the speed moves (`part_levels`); the
    # simulation averaged over that spread (`speed_spread`) predicts the runs' mean from the
    # profile alone.
    speeds = sigma_speed = None
    if parts is not None:
        speeds = part_levels(parts)
        sigma_speed = float(np.std(speeds, ddof=1))
        sims["speed"] = speed_spread(scale, chosen, profile, sigma_speed, hardware,
                                     out / "runs")
    tables = {v: verdict(real, sims[v]) for v in sims}
    table = tables["profiled"]
    for v in list(tables)[1:]:
        for c in ("sim", "error", "inside"):
            table[f"{c}_{v}"] = tables[v][c].to_numpy()
    table.to_csv(out / "fidelity.csv", index=False)
    by_policy = pd.DataFrame([
        {"policy": p, "iterations": len(g),
         "ratio_p50": (g["measured_s"] / g["predicted_s"]).median(),
         "ratio_of_sums": g["measured_s"].sum() / g["predicted_s"].sum(),
         "host_share": g["host_s"].sum() / g["measured_s"].sum()}
        for p, g in res.groupby("policy", sort=False)])
    host = host_table(res)
    host.to_csv(out / "host_time.csv", index=False)
    prof = pd.read_parquet(profile)
    noise = (prof["time_p90_s"] - prof["time_p10_s"]) / prof["time_s"].where(prof["time_s"] > 0)
    load["after_runs"] = os.getloadavg()[0]
    info = {"profile": str(profile), "profile_meta": meta, "profile_s": t_profile,
            "profile_noise_median": float(noise.median()), "step_jitter": sigma,
            "step_jitter_real": sigma_real,
            "speed_levels": None if speeds is None else [float(x) for x in speeds],
            "speed_sigma": sigma_speed,
            "load_average_1min": load, "cpus": os.cpu_count(), "policies": chosen,
            "real_run_s": walls, "repeats": repeats, "scale": scale,
            "torch_threads": torch.get_num_threads(), "clock": CLOCK.split("=")[1],
            "busy_share": {p: [busy_share(d) for d in r["real"]] for p, r in runs.items()},
            "round_levels": levels,
            "bias": {v: variant_bias(real, sims[v], levels.get(profile_of(v)))
                     for v in tables},
            "study_s": time.perf_counter() - t0}
    busy = [b for v in info["busy_share"].values() for b in v]
    f2, pct = ".2f", ".1%"
    what = {"profiled": "profiled cost model, profile of medians",
            "jitter": "profile of medians, each step's time times a lognormal factor of median "
                      f"1 and log-sd {sigma:.3f} from the profile's spread: executor.step_jitter",
            "mean": "profiled cost model, profile of means",
            "mean_jitter": f"profile of means, with step jitter (log-sd {sigma:.3f})",
            "jitter_real": f"diagnostic: profile of medians with step jitter of log-sd "
                           f"{sigma_real:.3f}, the real runs' own steps' spread about the model "
                           "(fitted to these runs: not a prediction)",
            "speed": f"profile of medians, averaged over the machine's speed: log-sd "
                     f"{sigma_speed or 0:.3f}, the spread of the profile parts' speeds "
                     f"(part_levels; Gauss-Hermite, {SPEED_NODES} speeds)"}
    summary = bias_summary(info["bias"])
    md = (BIAS_HEAD + table_markdown(summary, bias_fmt(summary)) + "\n"
          + "\n".join(verdict_markdown(tables[v], what[v]) for v in tables) +
        f"\nMachine: {os.cpu_count()} CPUs, 1-minute load average {min(load.values()):.1f}-"
        f"{max(load.values()):.1f} from before the real runs to after the last; the profile's "
        f"repeats spread by a median {float(noise.median()):.0%} ((p90 - p10) / median over its "
        f"rows). {scale['num_requests']} requests at {scale['qps']:g} req/s, {repeats} real "
        f"runs per policy; their iterations ran {min(busy):.0%}-{max(busy):.0%} of their span "
        "(first arrival to last finish).\n\n"
        "Per-iteration residual of the real runs, by batch composition: measured - predicted "
        "(ms) and measured / predicted, the profiled cost model (profile of medians) on the "
        "very batch each iteration ran; `ratio_of_sums` is what a latency (a sum of step "
        "times) sees:\n\n"
        + table_markdown(res_t, {"time_share": pct, **{c: f2 for c in res_t.columns
                                                        if c.startswith(("resid", "ratio"))}})
        + ("" if res_mean_t is None else "\nThe same against the profile of means:\n\n"
           + table_markdown(res_mean_t, {"time_share": pct, **{
               c: f2 for c in res_mean_t.columns if c.startswith(("resid", "ratio"))}}))
        + "\nSingle-request decodes by their place in a run of them (1: the first after a "
        "step of another kind), against the profile of medians:\n\n"
        + table_markdown(stream_t, {"ratio_p50": ".3f", "ratio_of_sums": ".3f",
                                    "measured_ms_p50": ".2f"})
        + "\nBy policy (every iteration), and the host time outside the steps (`host_s`: "
        "schedule, update, bookkeeping; recorded, not counted, on the CPU clock) as a share "
        "of the step time:\n\n" + table_markdown(by_policy, {"ratio_p50": ".3f",
                                                                "ratio_of_sums": ".3f",
                                                                "host_share": pct})
        + "\nHost time per iteration by requests in the batch:\n\n"
        + table_markdown(host, {"host_us_p50": ".0f", "host_us_p90": ".0f",
                                "host_share": pct}))
    (out / "fidelity.json").write_text(json.dumps(info, indent=1, default=str))
    (out / "fidelity.md").write_text(md)
    cdf_plot(runs, out)
    log(md)
    return table
=======
sys.path.insert(0, str(Path(__file__).resolve().parent))
# (importing fidelity_lib sets one torch thread before anything loads torch)
from fidelity_lib import ROOT  # noqa: E402
from fidelity_lib.kept import reread_bias  # noqa: E402
from fidelity_lib.runs import POLICIES, SCALES  # noqa: E402
from fidelity_lib.study import study  # noqa: E402
>>>>>>> fidelity


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--toy", action="store_true", help="seconds: a tiny model and trace")
    p.add_argument("--profile", help="reuse this profile instead of measuring one")
    p.add_argument("--repeats", type=int, default=5, help="real runs per policy (>= 2)")
    p.add_argument("--out", help="default: results/fidelity (results/fidelity/toy with --toy)")
    p.add_argument("--qps", type=float, help="arrival rate, req/s (default: the scale's, "
                   f"{SCALES['full']['qps']:g} for the full study)")
    p.add_argument("--policies", help=f"comma-separated subset of {','.join(POLICIES)}")
    p.add_argument("--requests", type=int, help="requests in the trace (default: the scale's, "
                   f"{SCALES['full']['num_requests']} for the full study)")
    p.add_argument("--warm-steps", type=int, help="the profiler's decode steps before each timed "
                   "decode batch (default: sarathi-lab-profile's; 0: the profiles before it)")
    p.add_argument("--bias", metavar="DIR", help="print the bias table of the study kept in "
                   "DIR (its runs/ folder), recomputed from its runs' summaries, and stop")
    a = p.parse_args(argv)
    if a.bias:
        print(reread_bias(Path(a.bias)))
        return
    if a.warm_steps is not None and a.warm_steps < 0:
        sys.exit(f"--warm-steps={a.warm_steps}: must be >= 0")
    if a.warm_steps is not None and a.profile:
        sys.exit("--warm-steps: read only when the study measures its profile (not with "
                 "--profile)")
    if a.repeats < 2:
        sys.exit(f"--repeats={a.repeats}: must be >= 2 (the interval of the real runs' mean)")
    if a.qps is not None and not a.qps > 0:
        sys.exit(f"--qps={a.qps}: must be > 0")
    if a.requests is not None and a.requests < 1:
        sys.exit(f"--requests={a.requests}: must be >= 1")
    out = Path(a.out) if a.out else ROOT / "results" / "fidelity" / ("toy" if a.toy else "")
    study(out, a.toy, a.profile, a.repeats, qps=a.qps,
          policies=a.policies.split(",") if a.policies else None, num_requests=a.requests,
          warm=a.warm_steps)


if __name__ == "__main__":
    main()
