"""Fidelity of the simulator against real runs on this machine.

    python experiments/fidelity/run.py [--toy] [--profile PATH] [--repeats 3] [--out DIR]

1. Profiles the real (torch) executor here with `sarathi-lab-profile`'s code (or reuses --profile).
2. Replays one trace with `executor=torch` (`--repeats` times, interleaved over the policies, for
   the run-to-run spread) and once with `executor=sim executor.cost_model=profiled`, under
   request_level, orca, vllm and sarathi at two token budgets, on the same KV cache size.
3. Writes, in DIR (default results/fidelity, or results/fidelity/toy with --toy): fidelity.csv
   (per policy and metric: the real runs' median, min, max, spread, the simulated value and its
   relative error), fidelity.md (the same as a table), decode_ratios.csv (decode-only iterations
   of the real runs: measured / predicted, p10/p50/p90 per policy), cdfs.png (simulated-vs-real CDFs of TTFT,
   TBT and E2E per policy), profile.parquet and profile_check.csv (held-out mixed iterations).

Noise control: one torch thread (OMP_NUM_THREADS=1 set before torch loads; a 2-core machine shared
with other jobs swings by 3-4x with two); the profile and the real runs timed on the thread's CPU
time (`executor.clock=cpu`: a real run's clock is the engine's virtual clock, advanced by each
step's measured duration, so every token time is a sum of measured step times, and time other
jobs hold the core is in none of them); the profile's medians over rounds, and the real runs
repeated in interleaved rounds so that a slow period touches every policy alike.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

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


def compare(real: dict[str, list[dict]], sim: dict[str, dict]) -> pd.DataFrame:
    """Per policy and metric: the real runs' median, min, max and spread ((max - min) / median),
    the simulated value and its relative error against the real median."""
    rows = []
    for policy, runs in real.items():
        for name in (metric_name(m, q) for m, q in METRICS):
            vals = np.array([r[name] for r in runs], dtype=float)
            med = float(np.median(vals))
            s = float(sim[policy][name])
            rows.append({"policy": policy, "metric": name, "real_median": med,
                         "real_min": float(vals.min()), "real_max": float(vals.max()),
                         "real_spread": (vals.max() - vals.min()) / med if med else np.nan,
                         "sim": s, "error": s / med - 1 if med else np.nan,
                         "repeats": len(vals)})
    return pd.DataFrame(rows)


def jitter_sigma(profile) -> float:
    """The log-sd of a step's time around its median, from the profile's repeats: per row
    ln(p90 / p10) / (2 x 1.2816), as a lognormal has it; the median over the rows."""
    prof = pd.read_parquet(profile)
    ok = (prof["time_p10_s"] > 0) & (prof["time_p90_s"] >= prof["time_p10_s"])
    r = np.log(prof.loc[ok, "time_p90_s"] / prof.loc[ok, "time_p10_s"]) / (2 * 1.2816)
    if not len(r):
        raise ValueError(f"{profile}: no row with a measured spread (p10 > 0)")
    return float(np.median(r))


def markdown(table: pd.DataFrame, error: str = "error", what: str = "") -> str:
    """Error of the simulation per policy (rows) and metric (columns), the real runs' spread
    beside it."""
    names = list(dict.fromkeys(table["metric"]))
    head = "| policy | " + " | ".join(names) + " |\n|---|" + "---|" * len(names) + "\n"
    body = ""
    for policy, d in table.groupby("policy", sort=False):
        d = d.set_index("metric")
        cells = [f"{d.loc[n, error]:+.1%} ({d.loc[n, 'real_spread']:.1%})" for n in names]
        body += f"| {policy} | " + " | ".join(cells) + " |\n"
    return (f"Relative error of the simulation (profiled cost model{what}) against the median of "
            "the real runs; in brackets, the real runs' spread ((max - min) / median).\n\n"
            + head + body)


def decode_ratios(run_dirs, cost_model, with_batch: bool = False):
    """Measured / predicted duration of every decode-only iteration of the runs: the cost model
    against the real executor on the batches the real runs actually ran, free of the feedback
    through queueing. A decode-only batch of b requests stores sum(context + 1) KV tokens after
    it, which gives their mean context."""
    out, sizes = [], []
    for d in run_dirs:
        it = pd.read_parquet(Path(d) / "iterations.parquet")
        dec = it[it["prefill_tokens"] == 0]
        for b, stored, dur in zip(dec["num_requests"], dec["kv_tokens_stored"], dec["duration"]):
            k = int(round(stored / b)) - 1
            out.append(dur / cost_model.iteration_time([], [k] * int(b), int(b)))
            sizes.append(int(b))
    return (np.array(out), np.array(sizes)) if with_batch else np.array(out)


# decode batch sizes the ratios are also given for (requests in the batch)
BATCH_BINS = ((1, 1), (2, 4), (5, 8), (9, 10 ** 9))


def ratio_table(real_dirs: dict, cost_model) -> pd.DataFrame:
    """Per policy: the decode-only ratios' p10/p50/p90, and their median by batch size."""
    rows = []
    for policy, dirs in real_dirs.items():
        r, b = decode_ratios(dirs, cost_model, with_batch=True)
        if len(r):
            p10, p50, p90 = np.percentile(r, [10, 50, 90])
            row = {"policy": policy, "decode_iterations": len(r), "p10": p10, "p50": p50,
                   "p90": p90}
            for lo, hi in BATCH_BINS:
                sel = (b >= lo) & (b <= hi)
                row[_bin(lo, hi)] = float(np.median(r[sel])) if sel.any() else np.nan
            rows.append(row)
    return pd.DataFrame(rows)


def _bin(lo, hi) -> str:
    return f"p50_b{lo}" if lo == hi else (f"p50_b{lo}+" if hi >= 10 ** 9 else f"p50_b{lo}-{hi}")


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


def study(out: Path, toy: bool = False, profile: str | None = None, repeats: int = 3,
          log=print, scale_name: str | None = None, qps: float | None = None) -> pd.DataFrame:
    import torch
    from sarathi_lab import runner
    torch.set_num_threads(1)
    scale = SCALES[scale_name or ("toy" if toy else "full")]
    if qps is not None:
        scale = {**scale, "qps": qps}
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # Without --profile the profile is measured in parts, one before each round of real runs
    # and one after the last, and merged point by point (median of the parts): this machine's
    # speed drifts by ~10% over minutes (two profiles taken 10 minutes apart on a quiet machine
    # predicted the same runs 12% apart), so a profile taken at one time misses runs taken at
    # another by that much, whatever the cost model.
    parts = [] if profile is None else None
    t_profile = 0.0

    def profile_part(i: int) -> None:
        nonlocal t_profile
        t = time.perf_counter()
        log(f"profiling the torch executor (grid {scale['grid']}, part {i + 1} of "
            f"{repeats + 1}) ...")
        part_dir = out / "runs" / "profile_parts" / str(i)
        parts.append(host_profile(scale["model"], part_dir, scale["grid"],
                                  scale["profile_repeats"], executor=(CLOCK,),
                                  progress=not toy)[0])
        t_profile += time.perf_counter() - t

    load = {"before_runs": os.getloadavg()[0]}
    torch_ex = ["executor=torch", "executor.device=cpu", "executor.dtype=float32", CLOCK]
    if parts is None:
        profile, meta, hardware = host_profile(scale["model"], out, scale["grid"],
                                               scale["profile_repeats"], profile=profile)
        # a profile made for another model or machine fails here, before the real runs
        runner.build(run_config(scale, next(iter(POLICIES)), sim_overrides(profile), hardware))
    runs = {p: {"real": [], "sim": None} for p in POLICIES}
    real = {p: [] for p in POLICIES}
    sim, walls = {}, []
    for rep in range(repeats):          # interleaved rounds: drift touches every policy alike
        if parts is not None:
            profile_part(rep)
        for policy in POLICIES:
            d = out / "runs" / policy / f"real-{rep}"
            w = time.perf_counter()
            s = runner.run(run_config(scale, policy, torch_ex, None), d)
            walls.append(time.perf_counter() - w)
            load[f"{policy}#{rep}"] = os.getloadavg()[0]
            real[policy].append(figures(s))
            runs[policy]["real"].append(d)
            log(f"real {policy} #{rep}: {s['num_finished']} finished, {s['num_iterations']} "
                f"iterations, {walls[-1]:.1f} s")
    if parts is not None:
        from sarathi_lab import profiler
        profile_part(repeats)
        merged = profiler.merge(parts, out / "profile.parquet")
        profile, meta, hardware = host_profile(scale["model"], out, scale["grid"],
                                               scale["profile_repeats"], profile=merged)
    sim_ex = sim_overrides(profile)
    # and again with each step's time drawn around its prediction, with the spread the profile
    # measured (executor.step_jitter): the real runs' P99s come from their steps' slow tail
    sigma = jitter_sigma(profile)
    sim_j = {}
    for policy in POLICIES:
        d = out / "runs" / policy / "sim"
        s = runner.run(run_config(scale, policy, sim_ex, hardware), d)
        sim[policy] = figures(s)
        runs[policy]["sim"] = d
        s = runner.run(run_config(scale, policy, [*sim_ex, f"executor.step_jitter={sigma!r}"],
                                  hardware), out / "runs" / policy / "sim_jitter")
        sim_j[policy] = figures(s)
    table = compare(real, sim)
    tj = compare(real, sim_j)
    table["sim_jitter"], table["error_jitter"] = tj["sim"].to_numpy(), tj["error"].to_numpy()
    table.to_csv(out / "fidelity.csv", index=False)
    from sarathi_lab.costmodels.profiled import ProfiledConfig, ProfiledCostModel
    cm = ProfiledCostModel(run_config(scale, "orca", sim_ex, hardware)["model"], hardware, 1,
                           ProfiledConfig(profile=str(profile)))
    ratios = ratio_table({p: r["real"] for p, r in runs.items()}, cm)
    ratios.to_csv(out / "decode_ratios.csv", index=False)
    prof = pd.read_parquet(profile)
    noise = (prof["time_p90_s"] - prof["time_p10_s"]) / prof["time_s"].where(prof["time_s"] > 0)
    info = {"profile": str(profile), "profile_meta": meta, "profile_s": t_profile,
            "profile_noise_median": float(noise.median()), "step_jitter": sigma,
            "load_average_1min": load, "cpus": os.cpu_count(),
            "real_run_s": walls, "repeats": repeats, "scale": {k: v for k, v in scale.items()},
            "torch_threads": torch.get_num_threads(), "clock": CLOCK.split("=")[1],
            "busy_share": {p: [busy_share(d) for d in r["real"]] for p, r in runs.items()}}
    busy = [b for v in info["busy_share"].values() for b in v]
    bins = [_bin(lo, hi) for lo, hi in BATCH_BINS]
    md = markdown(table) + "\n" + markdown(
        table, "error_jitter", f", each step's time times a lognormal factor of median 1 and "
        f"log-sd {sigma:.3f} from the profile's spread: executor.step_jitter") + (
        f"\nMachine: {os.cpu_count()} CPUs, 1-minute load average {min(load.values()):.1f}-"
        f"{max(load.values()):.1f} during the real runs; the profile's repeats spread by a median "
        f"{float(noise.median()):.0%} ((p90 - p10) / median over its rows). Arrivals at "
        f"{scale['qps']:g} req/s; the real runs' iterations ran {min(busy):.0%}-{max(busy):.0%} "
        "of their span (first arrival to last finish).\n\n"
        "Decode-only iterations of the real runs, measured / predicted duration (the cost model on "
        "the batches the real runs ran), and its median by requests in the batch:\n\n"
        "| policy | iterations | p10 | p50 | p90 | " + " | ".join(bins) + " |\n"
        "|---|---|---|---|---|" + "---|" * len(bins) + "\n" + "".join(
            f"| {r['policy']} | {r['decode_iterations']} | {r['p10']:.2f} | {r['p50']:.2f} | "
            f"{r['p90']:.2f} | " + " | ".join(f"{r[c]:.2f}" for c in bins) + " |\n"
            for r in ratios.to_dict("records")))
    (out / "fidelity.json").write_text(json.dumps(info, indent=1, default=str))
    (out / "fidelity.md").write_text(md)
    cdf_plot(runs, out)
    log(md)
    return table


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--toy", action="store_true", help="seconds: a tiny model and trace")
    p.add_argument("--profile", help="reuse this profile instead of measuring one")
    p.add_argument("--repeats", type=int, default=3, help="real runs per policy")
    p.add_argument("--out", help="default: results/fidelity (results/fidelity/toy with --toy)")
    p.add_argument("--qps", type=float, help="arrival rate, req/s (default: the scale's, "
                   f"{SCALES['full']['qps']:g} for the full study)")
    a = p.parse_args(argv)
    if a.repeats < 1:
        sys.exit("--repeats must be >= 1")
    if a.qps is not None and not a.qps > 0:
        sys.exit(f"--qps={a.qps}: must be > 0")
    out = Path(a.out) if a.out else ROOT / "results" / "fidelity" / ("toy" if a.toy else "")
    study(out, a.toy, a.profile, a.repeats, qps=a.qps)


if __name__ == "__main__":
    main()
