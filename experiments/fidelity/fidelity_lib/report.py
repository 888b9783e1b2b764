"""The study's tables in Markdown: the bias table of the simulation variants, the verdict per
policy and figure, and any small DataFrame."""
from __future__ import annotations

import pandas as pd

from .bias import GOAL, LATENCY, bias
from .speed import SPEED_NODES

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


def variant_captions(sigma: float, sigma_real: float, sigma_speed: float | None) -> dict:
    """What each simulation variant is, as its verdict table says: `sigma` the profile's step
    jitter, `sigma_real` the real steps' own (`jitter.real_sigma`), `sigma_speed` the spread of
    the profile parts' speeds (None without parts)."""
    return {"profiled": "profiled cost model, profile of medians",
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


def study_markdown(info: dict, tables: dict, res_t: pd.DataFrame, res_mean_t, stream_t,
                   by_policy: pd.DataFrame, host: pd.DataFrame) -> str:
    """fidelity.md: the bias table over the variants, each variant's verdict (`tables`, by
    variant), the machine and the trace (from `info`, the study's fidelity.json), then the
    residual tables (`residuals`: by composition, against the profile of means where there is
    one, by place in a run of decodes, by policy, and the host time by batch size)."""
    load, scale, repeats = info["load_average_1min"], info["scale"], info["repeats"]
    busy = [b for v in info["busy_share"].values() for b in v]
    what = variant_captions(info["step_jitter"], info["step_jitter_real"], info["speed_sigma"])
    cpus, noise_median = info["cpus"], info["profile_noise_median"]
    f2, pct = ".2f", ".1%"
    summary = bias_summary(info["bias"])
    return (BIAS_HEAD + table_markdown(summary, bias_fmt(summary)) + "\n"
            + "\n".join(verdict_markdown(tables[v], what[v]) for v in tables) +
            f"\nMachine: {cpus} CPUs, 1-minute load average {min(load.values()):.1f}-"
            f"{max(load.values()):.1f} from before the real runs to after the last; the "
            f"profile's repeats spread by a median {noise_median:.0%} ((p90 - p10) / median "
            f"over its rows). {scale['num_requests']} requests at {scale['qps']:g} req/s, "
            f"{repeats} real runs per policy; their iterations ran {min(busy):.0%}-"
            f"{max(busy):.0%} of their span (first arrival to last finish).\n\n"
            "Per-iteration residual of the real runs, by batch composition: measured - "
            "predicted (ms) and measured / predicted, the profiled cost model (profile of "
            "medians) on the very batch each iteration ran; `ratio_of_sums` is what a latency "
            "(a sum of step times) sees:\n\n"
            + table_markdown(res_t, {"time_share": pct, **{
                c: f2 for c in res_t.columns if c.startswith(("resid", "ratio"))}})
            + ("" if res_mean_t is None else "\nThe same against the profile of means:\n\n"
               + table_markdown(res_mean_t, {"time_share": pct, **{
                   c: f2 for c in res_mean_t.columns if c.startswith(("resid", "ratio"))}}))
            + "\nSingle-request decodes by their place in a run of them (1: the first after a "
            "step of another kind), against the profile of medians:\n\n"
            + table_markdown(stream_t, {"ratio_p50": ".3f", "ratio_of_sums": ".3f",
                                        "measured_ms_p50": ".2f"})
            + "\nBy policy (every iteration), and the host time outside the steps (`host_s`: "
            "schedule, update, bookkeeping; recorded, not counted, on the CPU clock) as a "
            "share of the step time:\n\n"
            + table_markdown(by_policy, {"ratio_p50": ".3f", "ratio_of_sums": ".3f",
                                         "host_share": pct})
            + "\nHost time per iteration by requests in the batch:\n\n"
            + table_markdown(host, {"host_us_p50": ".0f", "host_us_p90": ".0f",
                                    "host_share": pct}))
