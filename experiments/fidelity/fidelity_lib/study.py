"""The study itself: profile the torch executor in parts between interleaved rounds of real
runs, replay the trace on the simulator on each profile with and without step jitter, price the
real iterations, and write the tables, the bias, the figure and the record of the machine."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
from studies import host_profile

from .bias import RESIDUALS, profile_of, round_levels, variant_bias, verdict
from .jitter import jitter_sigma, real_sigma
from .plots import cdf_plot
from .report import study_markdown
from .residuals import (
    host_table,
    policy_table,
    recording_batches,
    residual_table,
    residuals,
    stream_table,
)
from .runs import CLOCK, POLICIES, SCALES, busy_share, figures, run_config, sim_overrides
from .speed import part_levels, speed_spread


def study(out: Path, toy: bool = False, profile: str | None = None, repeats: int = 5,
          log=print, scale_name: str | None = None, qps: float | None = None,
          policies: list[str] | None = None, num_requests: int | None = None,
          warm: int | None = None) -> pd.DataFrame:
    """The study into `out` (run.py's docstring lists what it writes), at the toy or the full
    scale (`scale_name`, a key of SCALES, overrides both), the trace's `qps` and `num_requests`
    and the `policies` (default all of POLICIES) as given; `profile` reused instead of measured
    in parts; `warm`, the profiler's decode steps before each timed decode batch (default
    sarathi-lab-profile's). Returns the verdict table (fidelity.csv)."""
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
    by_policy = policy_table(res)
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
    (out / "fidelity.json").write_text(json.dumps(info, indent=1, default=str))
    md = study_markdown(info, tables, res_t, res_mean_t, stream_t, by_policy, host)
    (out / "fidelity.md").write_text(md)
    cdf_plot(runs, out)
    log(md)
    return table
