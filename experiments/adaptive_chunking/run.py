"""Adaptive chunking: the best static token budget against the budget controllers (tbt_target,
slack, slo_dp) (issue 25, item 4).

    python experiments/adaptive_chunking/run.py [--toy | --medium | --noise | --full] [--out DIR]
                                                (DIR default: results/adaptive_chunking)

Mistral-7B on one simulated A100-80GB, `trace=mix` (interactive chat, a heavy tenant's long
prompts, a batch summarization job in bursts), SLO `chat-batch` made strict for the interactive
class: TTFT 2.5 s and each request's own P99 TBT 0.1 s (in place of a 0.15 s TPOT). Static
budgets 256 .. 2048; the controllers capped at 2048 (`scheduler.token_budget`), their TBT target
the SLO's. Writes DIR/adaptive_chunking.csv (every run) and DIR/adaptive_chunking.md (per load:
the best static budget by goodput, then each controller). --medium adds seeds 0-2,
`trace=sharegpt` under mistral-7b-strict, and relaxed SLOs (a 0.5 s P99 TBT):
DIR/adaptive_chunking_medium.csv and .md (mean [min-max] over seeds). These and --full run the
controllers with the oracle predictor (the simulator's cost model) and no step noise, as their
committed results were measured. --noise (issue 35): the mix (strict) at 2 and 3 req/s, seeds
0-2, executor.step_jitter 0, 0.05 and 0.1 (told to no predictor), every controller with the
oracle and with the learned predictor: DIR/adaptive_chunking_noise.csv and .md. --full (the
default): the capacity of every configuration, Mistral-7B and Yi-34B TP2, ShareGPT, arXiv and
the mix, strict and relaxed SLOs, 3 seeds (adaptive_capacity.py): DIR/adaptive_chunking_full.csv
and .md.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
from studies import compose, seed_spread  # noqa: E402
from studies import mean_range as mr

sys.path.insert(0, str(Path(__file__).resolve().parent))   # joblib's workers import it by name
import adaptive_capacity  # noqa: E402
from adaptive_capacity import CONTROLLERS, STATIC  # noqa: E402

STRICT = ["slo=chat-batch", "slo.classes.interactive.tpot=null",
          "slo.classes.interactive.request_p99_tbt=0.1"]
BASE = ["model=mistral-7b", "hardware=a100-80gb", "progress=false"]
# workload -> its trace and SLO; relaxed: Sarathi-Serve's 5x the strict P99 TBT
WORKLOADS = {"mix strict": ["trace=mix", *STRICT],
             "mix relaxed": ["trace=mix", "slo=chat-batch", "slo.classes.interactive.tpot=null",
                             "slo.classes.interactive.request_p99_tbt=0.5"],
             "sharegpt strict": ["trace=sharegpt", "slo=mistral-7b-strict"],
             "sharegpt relaxed": ["trace=sharegpt", "slo=mistral-7b-relaxed"]}
ONE = dict(workloads=("mix strict",), seeds=(0,))
# the toy, medium and full scales were measured with the oracle predictor (the simulator's cost
# model) and no step noise, and are kept so; --noise compares it with the learned predictor
ORACLE = dict(jitters=(0,), predictors=("oracle",))
SCALES = {"test": dict(requests=40, loads=(3.0,), **ONE, **ORACLE),   # tests/test_controllers.py
          "toy": dict(requests=120, loads=(2.0, 3.0), **ONE, **ORACLE),
          # more seeds, a second trace and relaxed SLOs: still one model and two loads
          "medium": dict(requests=300, loads=(2.0, 3.0), seeds=(0, 1, 2),
                         workloads=tuple(WORKLOADS), **ORACLE),
          # issue 35: step noise no predictor is told (executor.step_jitter), every controller
          # with the oracle and with the learned predictor, against every static budget
          "noise": dict(requests=300, loads=(2.0, 3.0), seeds=(0, 1, 2),
                        workloads=("mix strict",), jitters=(0, 0.05, 0.1),
                        predictors=("oracle", "learned"))}


METRICS = ["goodput_rps", "attainment", "p99_tbt_s", "p99_ttft_s", "relegated"]


def configs(predictors=("oracle",)):
    """(label, overrides) of every configuration compared; a controller's label names its
    predictor when more than one is compared."""
    for b in STATIC:
        yield f"static {b}", [f"scheduler.token_budget={b}"]
    for c in CONTROLLERS:
        for p in predictors:
            yield (c if len(predictors) == 1 else f"{c} ({p})"), [
                "scheduler.token_budget=2048", f"scheduler.controller={c}",
                f"scheduler.predictor={p}"]


def one(overrides: list[str], run_dir: Path) -> dict:
    from sarathi_lab.run.runner import run
    s = run(compose([*BASE, *overrides]), run_dir)
    return {"attainment": s["slo"]["attainment"], "goodput_rps": s["slo"]["goodput_rps"],
            "p99_tbt_s": s["tbt"]["p99"], "p99_ttft_s": s["ttft"]["p99"],
            "throughput_rps": s["throughput_rps"],
            "relegated": s.get("relegated", {}).get("num_relegated", 0),
            "relegated_finished": s.get("relegated", {}).get("num_finished", 0),
            "max_prefill_tokens": int(pd.read_parquet(run_dir / "iterations.parquet")
                                      ["prefill_tokens"].max())}


def study(out: Path, scale: str = "toy", log=print) -> pd.DataFrame:
    name, scale = scale, SCALES[scale]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        for seed in scale["seeds"]:
            for wl in scale["workloads"]:
                for qps in scale["loads"]:
                    for jitter in scale["jitters"]:
                        noise = [f"executor.step_jitter={jitter}"] if jitter else []
                        for label, ov in configs(scale["predictors"]):
                            ov = [*WORKLOADS[wl], *ov, *noise, f"seed={seed}",
                                  f"trace.num_requests={scale['requests']}", f"trace.qps={qps}"]
                            n += 1
                            row = {"seed": seed, "workload": wl, "qps": qps,
                                   **({"step_jitter": jitter} if name == "noise" else {}),
                                   "config": label, **one(ov, Path(tmp) / f"r{n}")}
                            log(row)
                            rows.append(row)
    df = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    if name in ("medium", "noise"):   # seeds and workloads: their own files, the toy's kept
        df.to_csv(out / f"adaptive_chunking_{name}.csv", index=False)
        (out / f"adaptive_chunking_{name}.md").write_text(
            seed_table(df) if name == "medium" else noise_table(df))
        return df
    df.to_csv(out / "adaptive_chunking.csv", index=False)
    (out / "adaptive_chunking.md").write_text(table(df))
    return df


def best_static_then_controllers(g: pd.DataFrame, by: list[str]):
    """(label, row) of the best static budget of `g` (by the columns `by`, highest first), then
    of each controller, in `g`'s order."""
    static = g["config"].str.startswith("static")
    best = g[static].sort_values(by, ascending=False).iloc[:1]
    for _, r in pd.concat([best, g[~static]]).iterrows():
        yield (f"best static ({r['config'].split()[1]})" if r["config"].startswith("static")
               else r["config"]), r


def seed_table(df: pd.DataFrame) -> str:
    """Per workload and load: the best static budget (by mean goodput over seeds), then each
    controller; mean [min-max] over seeds."""
    cells = seed_spread(df, ["workload", "qps", "config"], METRICS)
    lines = ["| workload | load (req/s) | config | goodput (req/s) | attainment | P99 TBT (ms) | "
             "P99 TTFT (s) | relegated |", "|" + " --- |" * 8]
    for (wl, qps), g in cells.groupby(["workload", "qps"], sort=False):
        for name, r in best_static_then_controllers(g, ["goodput_rps_mean", "attainment_mean"]):
            lines.append(f"| {wl} | {qps:g} | {name} | {mr(r, 'goodput_rps')} | "
                         f"{mr(r, 'attainment', 100, 0)}% | {mr(r, 'p99_tbt_s', 1e3, 0)} | "
                         f"{mr(r, 'p99_ttft_s', 1, 1)} | {mr(r, 'relegated', 1, 1)} |")
    return "\n".join(lines) + "\n"


def noise_table(df: pd.DataFrame) -> str:
    """Per load and step jitter: the best static budget (by mean attainment over seeds, then
    goodput), then each controller with each predictor; mean [min-max] over seeds, and the
    attainment over the best static's, seed by seed."""
    cells = seed_spread(df, ["qps", "step_jitter", "config"], METRICS)
    lines = ["| load (req/s) | step jitter | config | attainment | vs best static (points) | "
             "goodput (req/s) | P99 TBT (ms) | P99 TTFT (s) | relegated |", "|" + " --- |" * 9]
    for (qps, jit), g in cells.groupby(["qps", "step_jitter"], sort=False):
        rows = list(best_static_then_controllers(g, ["attainment_mean", "goodput_rps_mean"]))
        base = df[(df["qps"] == qps) & (df["step_jitter"] == jit)].pivot(
            index="seed", columns="config", values="attainment")
        best = rows[0][1]["config"]
        for name, r in rows:
            diff = (base[r["config"]] - base[best]) * 100
            vs = "" if r["config"] == best else \
                f"{diff.mean():+.1f} [{diff.min():+.1f} to {diff.max():+.1f}]"
            lines.append(f"| {qps:g} | {jit:g} | {name} | {mr(r, 'attainment', 100, 1)}% | {vs} | "
                         f"{mr(r, 'goodput_rps')} | {mr(r, 'p99_tbt_s', 1e3, 0)} | "
                         f"{mr(r, 'p99_ttft_s', 1, 1)} | {mr(r, 'relegated', 1, 1)} |")
    return "\n".join(lines) + "\n"


def table(df: pd.DataFrame) -> str:
    """Per load: the best static budget (by goodput, then attainment), then each controller."""
    lines = ["| load (req/s) | config | goodput (req/s) | attainment | P99 TBT | P99 TTFT | "
             "relegated |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for qps, g in df.groupby("qps"):
        for name, r in best_static_then_controllers(g, ["goodput_rps", "attainment"]):
            lines.append(f"| {qps:g} | {name} | {r['goodput_rps']:.2f} | {r['attainment']:.1%} | "
                         f"{r['p99_tbt_s'] * 1e3:.0f} ms | {r['p99_ttft_s']:.2f} s | "
                         f"{r['relegated']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--toy", action="store_true", help="120 requests at 2 and 3 req/s")
    ap.add_argument("--medium", action="store_true", help="300 requests at 2 and 3 req/s, "
                    "3 seeds, trace=mix and sharegpt, strict and relaxed SLOs")
    ap.add_argument("--noise", action="store_true", help="300 requests at 2 and 3 req/s, "
                    "3 seeds, trace=mix strict, executor.step_jitter 0, 0.05, 0.1, every "
                    "controller with the oracle and the learned predictor (issue 35)")
    ap.add_argument("--full", action="store_true", help="(the default) capacity searches: "
                    "Mistral-7B and Yi-34B TP2 x sharegpt, arxiv, mix x strict, relaxed x 3 "
                    "seeds (adaptive_capacity.py)")
    # 300 requests per probe: the grid (252 searches) in ~40 min on 2 shared cores (README)
    full = {"jobs": 2, "requests": 300, "seeds": [0, 1, 2], "work": None, "fresh": False}
    ap.add_argument("--jobs", type=int, help="--full: parallel processes (2)")
    ap.add_argument("--requests", type=int, help="--full: requests per probe (300)")
    ap.add_argument("--seeds", type=int, nargs="+", help="--full: seeds (0 1 2)")
    ap.add_argument("--work", help="--full: a file per finished cell, which a rerun skips "
                    "(default outputs/adaptive_chunking_full_nREQUESTS)")
    ap.add_argument("--fresh", action="store_true", default=None, help="--full: redo every "
                    "cell (the work directory emptied first; a cell file holds the figures of "
                    "the code that wrote it)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if sum((a.toy, a.medium, a.noise, a.full)) > 1:
        ap.error("choose one of --toy, --medium, --noise, --full")
    given = [f"--{k}" for k in full if getattr(a, k) is not None]
    if (a.toy or a.medium or a.noise) and given:
        ap.error(f"{', '.join(given)}: read by --full only, not by --toy, --medium or --noise")
    for k, v in full.items():
        setattr(a, k, v if getattr(a, k) is None else getattr(a, k))
    if a.jobs < 1 or a.requests < 2 or min(a.seeds) < 0:
        ap.error("--jobs must be >= 1, --requests >= 2 and seeds >= 0")
    out = Path(a.out or ROOT / "results" / "adaptive_chunking")
    if not (a.toy or a.medium or a.noise):
        work = Path(a.work or ROOT / "outputs" / f"adaptive_chunking_full_n{a.requests}")
        adaptive_capacity.study(out, work, a.jobs, a.requests, tuple(a.seeds), fresh=a.fresh)
        print((out / "adaptive_chunking_full.md").read_text())
        sys.exit(0)
    scale = "toy" if a.toy else "medium" if a.medium else "noise"
    study(out, scale)
    print((out / ("adaptive_chunking.md" if scale == "toy" else
                  f"adaptive_chunking_{scale}.md")).read_text())
