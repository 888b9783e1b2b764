"""Speculation: acceptance rate x speculation length k x load x token budget on Mistral-7B /
A100 (simulator): where speculative decoding helps, where its verification tokens crowd out
prefill chunks, and whether SLO-aware choice of k (`scheduler.controller=slo_dp`) recovers the
loss (issue 25, item 4).

    python experiments/speculation/run.py [--scale test|full] [--out DIR] [--only slo_dp]
                                          (DIR default: results/speculation)

Sarathi-Serve (`scheduler=sarathi`) at token budgets 256/512/1024, ShareGPT-4, Poisson arrivals
at 1.0/2.5/3.5 req/s, SLO mistral-7b-strict (a request's own P99 TBT <= 100 ms). Drafts: a cost
ratio of 0.05 of the target's decode step (a cheap head, EAGLE/Medusa-like) at acceptance
0.5/0.7/0.9 and k = 1/2/4, and a Llama-3.2-1B draft preset (priced by the roofline) at 0.7;
k = 0 (no speculation) as the baseline; `slo_dp` choosing the chunk and k <= 4 each iteration
(its prior, scheduler.assumed_acceptance, the true acceptance rate; learnt online from there). Seeds vary the arrivals and the acceptance draws. Then the
capacity (mode=capacity, Sarathi-Serve's strict criterion) of a few cells at budget 512.

Writes DIR/runs.csv (every run and seed), DIR/cells.csv (mean/std/min/max over seeds),
DIR/capacity.csv, DIR/speculation.md (the tables) and DIR/speculation.png. `--only slo_dp`
reruns slo_dp's runs and capacity searches alone and puts them in place of its rows in DIR's
runs.csv and capacity.csv (the other rows kept: a change to slo_dp changes no other run).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
from studies import compose, scaled_main, seed_spread  # noqa: E402
from studies import mean_range as mr

BASE = ["model=mistral-7b", "hardware=a100-80gb", "trace=sharegpt", "slo=mistral-7b-strict",
        "progress=false"]
RATIO = 0.05            # a cheap draft (a head on the target): 5% of its decode step
PRESET = "llama-3.2-1b"
K_MAX = 4
SCALES = {"test": dict(requests=40, loads=(3.5,), budgets=(512,), rates=(0.7,), ks=(0, 4),
                       seeds=(0,), preset=False, capacity=()),
          "full": dict(requests=300, loads=(1.0, 2.5, 3.5), budgets=(256, 512, 1024),
                       rates=(0.5, 0.7, 0.9), ks=(0, 1, 2, 4), seeds=(0, 1, 2), preset=True,
                       capacity=((0.7, 0), (0.7, 2), (0.7, 4), (0.7, "slo_dp"), (0.9, 4),
                                 (0.9, "slo_dp")))}
METRICS = ["ttft_p50", "ttft_p99", "tpot_p50", "e2e_p50", "tbt_p99", "sched_delay_p50",
           "attainment", "goodput_rps", "throughput_tok_s", "prefill_tok_per_iter",
           "decode_tok_per_iter", "prefill_tok_backlog", "acceptance", "tokens_per_step",
           "drafts_per_step"]
KEYS = ["qps", "budget", "draft", "p", "config"]


def configs(scale: dict):
    """(draft, p, config label, overrides) of every configuration at one load and budget."""
    yield "none", None, "k=0", []
    drafts = [("ratio", [f"executor.draft_cost_ratio={RATIO}"], scale["rates"])]
    if scale["preset"]:
        drafts.append(("llama-3.2-1b", [f"executor.draft={PRESET}"], (0.7,)))
    for draft, dov, rates in drafts:
        for p in rates:
            spec = [*dov, f"executor.acceptance_rate={p}"]
            for k in scale["ks"]:
                if k:
                    yield draft, p, f"k={k}", [*spec, f"scheduler.num_speculative_tokens={k}"]
            # the oracle predictor (the cost model), as the committed results were measured
            yield draft, p, "slo_dp", [*spec, f"scheduler.num_speculative_tokens={K_MAX}",
                                       "scheduler.controller=slo_dp", "scheduler.predictor=oracle",
                                       f"scheduler.assumed_acceptance={p}"]


def one(overrides: list[str], run_dir: Path) -> dict:
    from sarathi_lab.run.runner import run
    s = run(compose([*BASE, *overrides]), run_dir)
    it = pd.read_parquet(run_dir / "iterations.parquet", columns=["prefill_tokens",
                                                                  "decode_tokens", "num_waiting"])
    backlog = it[it["num_waiting"] > 0]
    spec = s.get("speculation") or {}
    return {"ttft_p50": s["ttft"]["p50"], "ttft_p99": s["ttft"]["p99"],
            "tpot_p50": s["tpot"]["p50"], "e2e_p50": s["e2e"]["p50"], "tbt_p99": s["tbt"]["p99"],
            "sched_delay_p50": s["scheduling_delay"]["p50"],
            "attainment": s["slo"]["attainment"], "goodput_rps": s["slo"]["goodput_rps"],
            "throughput_tok_s": s["throughput_tok_s"],
            # what the budget went to: verification tokens count in decode_tokens
            "prefill_tok_per_iter": it["prefill_tokens"].mean(),
            "decode_tok_per_iter": it["decode_tokens"].mean(),
            # the chunk a prompt gets while others queue: what verification tokens crowd out
            "prefill_tok_backlog": backlog["prefill_tokens"].mean() if len(backlog) else None,
            "acceptance": spec.get("acceptance_rate"),
            "tokens_per_step": spec.get("tokens_per_step"),
            "drafts_per_step": spec.get("drafts_per_step")}


def capacity(overrides: list[str], out_dir: Path) -> dict:
    from sarathi_lab.sweeps.capacity import search
    res = search(compose([*BASE, "mode=capacity", *overrides]), out_dir)
    r = res["criteria"]["tbt"]
    return {"capacity_qps": r["capacity_qps"], "fails_at_qps": r.get("fails_at_qps")}


def study(out: Path, scale_name: str = "full", log=print, only: str | None = None
          ) -> pd.DataFrame:
    scale = SCALES[scale_name]
    rows, caps = [], []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        for seed in scale["seeds"]:
            for qps in scale["loads"]:
                for b in scale["budgets"]:
                    for draft, p, label, ov in configs(scale):
                        if only is not None and label != only:
                            continue
                        ov = [*ov, f"scheduler.token_budget={b}", f"trace.qps={qps}",
                              f"trace.num_requests={scale['requests']}", f"seed={seed}",
                              *([f"executor.acceptance_seed={seed}"] if p is not None else [])]
                        n += 1
                        row = {"seed": seed, "qps": qps, "budget": b, "draft": draft, "p": p,
                               "config": label, **one(ov, Path(tmp) / f"r{n}")}
                        log({k: row[k] for k in ("seed", "qps", "budget", "draft", "p", "config",
                                                 "ttft_p99", "tpot_p50", "attainment")})
                        rows.append(row)
        for p, k in scale["capacity"]:
            if only is not None and k != only:
                continue
            ov = [f"executor.draft_cost_ratio={RATIO}", f"executor.acceptance_rate={p}",
                  f"scheduler.num_speculative_tokens={K_MAX if k == 'slo_dp' else k}",
                  *(["scheduler.controller=slo_dp", "scheduler.predictor=oracle",
                     f"scheduler.assumed_acceptance={p}"] if k == "slo_dp" else [])] if k else []
            n += 1
            cap = {"p": p if k else None, "config": k if k == "slo_dp" else f"k={k}",
                   **capacity([*ov, "scheduler.token_budget=512",
                               f"trace.num_requests={scale['requests']}"], Path(tmp) / f"c{n}")}
            log(cap)
            caps.append(cap)
    runs = pd.DataFrame(rows)
    if only is not None:   # in place of `only`'s rows of the last full run
        runs = in_place(pd.read_csv(out / "runs.csv"), runs, ["seed", *KEYS])
        if caps or (out / "capacity.csv").exists():   # the test scale searches none
            caps = in_place(pd.read_csv(out / "capacity.csv"), pd.DataFrame(caps),
                            ["p", "config"]).to_dict("records")
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / "runs.csv", index=False)
    cells = seed_spread(runs, KEYS, METRICS)
    cells.to_csv(out / "cells.csv", index=False)
    if caps:
        pd.DataFrame(caps).to_csv(out / "capacity.csv", index=False)
    (out / "speculation.md").write_text(report(cells, pd.DataFrame(caps), scale_name,
                                               time.time() - t0, only))
    if scale_name != "test":
        plot(cells, out / "speculation.png")
    return runs


def in_place(old: pd.DataFrame, new: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """`old` with each row whose `keys` match a row of `new` replaced by it, in old's order;
    a `new` row that matches none is an error (the rerun's grid must be the old one's)."""
    def key(r):
        return tuple(None if pd.isna(r[k]) else r[k] for k in keys)
    fresh = {key(r): r for _, r in new.iterrows()}
    rows = [fresh.pop(key(r), r) for _, r in old.iterrows()]
    if fresh:
        raise ValueError(f"rerun rows not in the previous results: {list(fresh)[:3]}; rerun "
                         "the whole study")
    return pd.DataFrame(rows).reset_index(drop=True)


def _backlog(r) -> str:
    """Prefill tokens per iteration while prompts queue (the chunk verification crowds)."""
    return "" if pd.isna(r["prefill_tok_backlog_mean"]) else mr(r, "prefill_tok_backlog", 1, 0)


def report(cells: pd.DataFrame, caps: pd.DataFrame, scale: str, wall: float,
           only: str | None = None) -> str:
    """Per budget, per load: every configuration's means over seeds [min-max]."""
    rerun = f" of the rerun of {only}'s rows alone (the others from the run before)" if only \
        else ""
    lines = [f"Scale `{scale}`; {int(cells['ttft_p50_seeds'].max())} seed(s); wall time{rerun} "
             f"{wall:.0f} s on a shared 2-core machine (load average {os.getloadavg()[0]:.1f} at "
             "the end).", ""]
    head = ("| load | draft | p | config | TPOT p50 (ms) | E2E p50 (s) | TTFT p50 (s) | "
            "TTFT p99 (s) | P99 TBT (ms) | attainment | prefill tok/iter (backlog) | drafts/step |")
    for b, gb in cells.groupby("budget"):
        lines += [f"### token budget {b}", "", head, "|" + " --- |" * 12]
        for _, r in gb.iterrows():
            lines.append(
                f"| {r['qps']:g} | {r['draft']} | {'' if pd.isna(r['p']) else r['p']} | "
                f"{r['config']} | {mr(r, 'tpot_p50', 1e3, 1)} | {mr(r, 'e2e_p50')} | "
                f"{mr(r, 'ttft_p50')} | {mr(r, 'ttft_p99')} | {mr(r, 'tbt_p99', 1e3, 0)} | "
                f"{mr(r, 'attainment')} | {_backlog(r)} | "
                f"{'' if pd.isna(r['drafts_per_step_mean']) else f'{r.drafts_per_step_mean:.2f}'}"
                " |")
        lines.append("")
    if len(caps):
        lines += ["### capacity at budget 512 (strict: P99 TBT <= 100 ms, median scheduling "
                  "delay <= 2 s; seed 0; draft ratio 0.05)", "",
                  "| p | config | capacity (req/s) |", "| --- | --- | --- |"]
        lines += [f"| {'' if pd.isna(r['p']) else r['p']} | {r['config']} | "
                  f"{r['capacity_qps']:.2f} |" for _, r in caps.iterrows()]
    return "\n".join(lines) + "\n"


def plot(cells: pd.DataFrame, path: Path) -> None:
    """Budget 512, ratio draft: TPOT p50, E2E p50 and TTFT p99 against k, a line per acceptance
    rate, a column per load; slo_dp as a marker at k = 'dp'."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = cells[(cells["budget"] == 512) & cells["draft"].isin(["none", "ratio"])]
    loads = sorted(d["qps"].unique())
    mets = [("tpot_p50", "TPOT p50 (ms)", 1e3), ("e2e_p50", "E2E p50 (s)", 1),
            ("ttft_p99", "TTFT p99 (s)", 1)]
    fig, axes = plt.subplots(len(mets), len(loads), figsize=(4 * len(loads), 3 * len(mets)),
                             squeeze=False)
    base = d[d["config"] == "k=0"].set_index("qps")
    for j, q in enumerate(loads):
        for i, (m, label, s) in enumerate(mets):
            ax = axes[i][j]
            for p, g in d[(d["qps"] == q) & d["p"].notna()].groupby("p"):
                ks = g[g["config"].str.startswith("k=")]
                x = [0, *ks["config"].str[2:].astype(int)]
                y = [base.loc[q, f"{m}_mean"] * s, *(ks[f"{m}_mean"] * s)]
                line, = ax.plot(x, y, marker="o", label=f"p={p}")
                dp = g[g["config"] == "slo_dp"]
                ax.scatter([K_MAX + 1], dp[f"{m}_mean"] * s, marker="*", s=120,
                           color=line.get_color())
            ax.set_xticks([0, 1, 2, 4, K_MAX + 1], ["0", "1", "2", "4", "slo_dp"])
            ax.set_title(f"{q:g} req/s" if i == 0 else "")
            ax.set_ylabel(label)
            if i == len(mets) - 1:
                ax.set_xlabel("speculation length k")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Mistral-7B, A100, ShareGPT-4, Sarathi budget 512, draft 5% of a decode step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    out = scaled_main(__doc__, "speculation", SCALES, study, lambda ap: ap.add_argument(
        "--only", choices=["slo_dp"], default=None, help="rerun slo_dp's rows alone"))
    print(f"commit {commit()}")
    print((out / "speculation.md").read_text())
