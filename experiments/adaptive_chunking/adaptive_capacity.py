"""The full scale of experiments/adaptive_chunking: the capacity of each static token budget and
each budget controller, per model, workload, SLO and seed, found by the project's capacity search
(`sarathi_lab.sweeps.capacity.search`) in-process, with goodput, P99 TBT and P99 TTFT at one common load
per (model, workload). Run by `run.py --full`; the README's "Full study" says what it found.

A cell is (model, workload, SLO kind, config, seed): one capacity search plus one run at the
common load. Each finished cell leaves WORK/cells/<key>.json (written last, atomically), so a
rerun skips what is done. Cells run in parallel (joblib, one torch thread per worker).

The setup is experiments/capacity_grid's (`experiment=capacity_grid`: Mistral-7B on one A100 and
Yi-34B on two with tensor parallel 2, context 8,192, a seeded random sample of the trace per
seed, bisection to 3% from 0.25-4 req/s, Sarathi-Serve's strict and relaxed SLOs per model).
The criterion: Sarathi-Serve's (`tbt`: pooled P99 TBT, median scheduling delay <= 2 s, nothing
rejected) on ShareGPT and arXiv; on the mix, whose SLO has per-class targets and no pooled P99
TBT, DistServe's attainment (`attainment`: >= 90% of requests meet their class's targets, the
interactive class's own P99 TBT among them) with the mix's own arrival pattern stretched to each
probed rate (`capacity.arrivals=trace`: its batch bursts kept).
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))

MODELS = {"mistral-7b": 1, "yi-34b": 2}   # model -> tensor parallel (as capacity_grid)
WORKLOADS = ("sharegpt", "arxiv", "mix")
KINDS = ("strict", "relaxed")
STATIC = (256, 512, 1024, 2048)
CONTROLLERS = ("tbt_target", "slack", "slo_dp")
CAP = 2048   # the controllers' largest budget (scheduler.token_budget), the largest static one
# The common load per (model, workload) at which goodput and the P99s are reported: about the
# strict capacity of Sarathi-Serve's budget 512 (capacity_grid's sarathi row for ShareGPT and
# arXiv; for the mix a probe of static 512 at 300 / 500 requests, seed 0), where the static
# budget is at its limit and the controllers' margin shows.
COMMON_QPS = {("mistral-7b", "sharegpt"): 2.5, ("mistral-7b", "arxiv"): 3.0,
              ("mistral-7b", "mix"): 2.0, ("yi-34b", "sharegpt"): 1.2,
              ("yi-34b", "arxiv"): 1.3, ("yi-34b", "mix"): 0.5}
CRITERION = {"sharegpt": "tbt", "arxiv": "tbt", "mix": "attainment"}


def config_overrides(config: str) -> list[str]:
    """`static B` -> that budget every iteration; a controller -> consulted up to CAP tokens."""
    if config.startswith("static "):
        return [f"scheduler.token_budget={int(config.split()[1])}"]
    if config not in CONTROLLERS:
        raise ValueError(f"config {config!r}: neither 'static B' nor one of {CONTROLLERS}")
    # the capacities committed were measured with the oracle (the cost model itself): kept
    # explicit so a rerun reproduces them (run.py --noise compares it with the learned one)
    return [f"scheduler.token_budget={CAP}", f"scheduler.controller={config}",
            "scheduler.predictor=oracle"]


def model_tbt(model: str, kind: str) -> float:
    """Sarathi-Serve's P99 TBT limit of `model` under SLO `kind` (configs/slo/MODEL-KIND.yaml)."""
    import yaml
    return float(yaml.safe_load((ROOT / "configs" / "slo" / f"{model}-{kind}.yaml").read_text())
                 ["p99_tbt"])


def workload_overrides(model: str, workload: str, kind: str) -> list[str]:
    """The trace, SLO and capacity criterion of one workload under one SLO kind."""
    if workload == "mix":
        # chat-batch's interactive class judged by its own P99 TBT at the model's strict or
        # relaxed limit (in place of its 0.15 s TPOT), TTFT 2.5 s; the batch class by E2E 60 s.
        # The mix draws its own samples per seed: capacity_grid's trace.shuffle is not its key.
        return ["trace=mix", "~trace.shuffle", "slo=chat-batch",
                "slo.classes.interactive.tpot=null",
                f"slo.classes.interactive.request_p99_tbt={model_tbt(model, kind)}",
                "capacity.criteria=[attainment]", "capacity.arrivals=trace"]
    if workload not in WORKLOADS:
        raise ValueError(f"workload {workload!r}: not one of {WORKLOADS}")
    return [f"trace={workload}", f"slo={model}-{kind}", "capacity.criteria=[tbt]"]


def cell_key(cell: dict) -> str:
    return (f"{cell['model']}_{cell['workload']}_{cell['slo_kind']}_"
            f"{cell['config'].replace(' ', '')}_s{cell['seed']}")


def cells(models, workloads, kinds, configs, seeds, requests: int) -> list[dict]:
    """Seed by seed: a run stopped early leaves whole seeds of the grid."""
    return [{"model": m, "workload": w, "slo_kind": k, "config": c, "seed": s,
             "requests": requests, "common_qps": COMMON_QPS[m, w]}
            for s in seeds for m in models for w in workloads for k in kinds for c in configs]


def overrides(cell: dict) -> list[str]:
    m = cell["model"]
    return ["experiment=capacity_grid", f"model={m}", f"executor.tensor_parallel={MODELS[m]}",
            "progress=false", f"trace.num_requests={cell['requests']}", f"seed={cell['seed']}",
            *workload_overrides(m, cell["workload"], cell["slo_kind"]),
            *config_overrides(cell["config"])]


def run_cell(cell: dict, work: str) -> dict:
    """One cell's row: its capacity (and the bracket), then goodput, attainment, P99 TBT / TTFT
    and relegations at the common load. Reads WORK/cells/<key>.json when a run finished it."""
    from sarathi_lab.run import rundir
    from sarathi_lab.sweeps import capacity
    key = cell_key(cell)
    done = Path(work) / "cells" / f"{key}.json"
    if done.exists():
        row = json.loads(done.read_text())
        changed = {k: (row.get(k), v) for k, v in cell.items() if row.get(k) != v}
        if changed:   # e.g. another --requests into the same --work: never mix the two
            raise ValueError(f"{done}: a cell finished with other settings (done, now: "
                             f"{changed}); give another --work, or delete the file to redo it")
        return {**row, "resumed": True}
    import pandas as pd
    import torch
    from studies import compose
    torch.set_num_threads(1)   # two workers on two cores: one thread each
    t0 = time.perf_counter()
    c = compose(overrides(cell))
    tmp = Path(work) / "tmp" / key
    shutil.rmtree(tmp, ignore_errors=True)   # an interrupted attempt's leftovers
    res = capacity.search(c, tmp / "search")
    crit = CRITERION[cell["workload"]]
    r = res["criteria"][crit]
    failing = next((p for p in res["probes"] if r["fails_at_qps"] is not None
                    and abs(p["qps"] - r["fails_at_qps"]) <= 1e-9), None)
    # the common load: the same requests and arrival pattern, saved as a run directory to read
    # the relegations and the largest chunk (a probe row has neither)
    q = cell["common_qps"]
    common = capacity.Prober({**c, "capacity": {**c["capacity"], "save_probes": True}},
                             tmp / "common")
    p = common(q, "common")
    run_dir = next((tmp / "common" / "probes").iterdir())
    s = json.loads((run_dir / rundir.SUMMARY).read_text())
    row = {**cell, "criterion": crit,
           "capacity_qps": r["capacity_qps"], "fails_at_qps": r["fails_at_qps"],
           "bracketed": r["bracketed"], "probes": r["probes"], "note": r["note"],
           "missed_at_fail": (failing or {}).get(f"{crit}_missed", ""),
           "num_requests": res["num_requests"], "trace_dropped": res["trace_dropped"],
           "goodput_rps": p["goodput_rps"], "attainment": p["attainment"],
           "p99_tbt_s": p["tbt_p99"], "p99_ttft_s": p["ttft_p99"],
           "meets_criterion": p[capacity.CRITERIA[crit][0]],
           "relegated": s.get("relegated", {}).get("num_relegated", 0),
           "relegated_finished": s.get("relegated", {}).get("num_finished", 0),
           "max_prefill_tokens": int(pd.read_parquet(run_dir / rundir.ITERATIONS)
                                     ["prefill_tokens"].max()),
           "wall_s": round(time.perf_counter() - t0, 2)}
    done.parent.mkdir(parents=True, exist_ok=True)
    rundir.write_json(done, row)
    shutil.rmtree(tmp, ignore_errors=True)   # parquet files and probes: the row holds the figures
    return row


def run_cells(todo: list[dict], work: Path, jobs: int, log=print):
    """Every cell's row, as they finish (done cells first, read back); a progress line each."""
    import pandas as pd
    work = Path(work)
    done = [c for c in todo if (work / "cells" / f"{cell_key(c)}.json").exists()]
    pending = [c for c in todo if c not in done]
    log(f"adaptive_chunking --full: {len(todo)} cells, {len(done)} done before, "
        f"{len(pending)} to run on {jobs} process(es) -> {work}/cells")
    rows = [run_cell(c, str(work)) for c in done]
    if jobs == 1 or len(pending) <= 1:
        results = (run_cell(c, str(work)) for c in pending)
    else:
        from joblib import Parallel, delayed
        results = Parallel(n_jobs=jobs, return_as="generator_unordered")(
            delayed(run_cell)(c, str(work)) for c in pending)
    t0 = time.time()
    for i, row in enumerate(results, 1):
        rows.append(row)
        log(f"  [{i}/{len(pending)} {time.time() - t0:.0f} s] {cell_key(row)}: capacity "
            f"{row['capacity_qps']:.3g} req/s ({row['probes']} probes, {row['wall_s']:.0f} s); "
            f"at {row['common_qps']:g} req/s goodput {row['goodput_rps']:.2f}, "
            f"P99 TBT {row['p99_tbt_s'] * 1e3:.0f} ms")
    return pd.DataFrame(rows)


def with_best_static(df):
    """`df` plus a row set per (model, workload, SLO kind, seed) labelled 'best static': the
    static budget with the highest mean capacity over seeds in that (model, workload, SLO kind),
    its budget in `best_budget`; and `vs_best_static`: each row's capacity over that budget's,
    seed by seed."""
    import pandas as pd
    cell = ["model", "workload", "slo_kind"]
    static = df[df["config"].str.startswith("static ")]
    mean = static.groupby([*cell, "config"], sort=False)["capacity_qps"].mean().reset_index()
    best = mean.loc[mean.groupby(cell, sort=False)["capacity_qps"].idxmax(), [*cell, "config"]]
    best_rows = static.merge(best, on=[*cell, "config"])
    best_rows = best_rows.assign(best_budget=best_rows["config"].str.split().str[1].astype(int),
                                 config="best static")
    out = pd.concat([df, best_rows], ignore_index=True)
    base = best_rows.set_index([*cell, "seed"])["capacity_qps"].rename("best_static_qps")
    out = out.join(base, on=[*cell, "seed"])
    out["vs_best_static"] = out["capacity_qps"] / out["best_static_qps"]
    return out.drop(columns="best_static_qps")


def full_table(df) -> str:
    """Per model, workload and SLO kind: the best static budget (by mean capacity over seeds),
    then each controller: capacity mean [min-max] over seeds, its ratio to the best static's
    (seed by seed), and goodput, attainment, P99 TBT and P99 TTFT at the common load."""
    from studies import mean_range as mr
    from studies import seed_spread
    df = with_best_static(df)
    keys = ["model", "workload", "slo_kind", "config"]
    vals = ["capacity_qps", "vs_best_static", "goodput_rps", "attainment", "p99_tbt_s",
            "p99_ttft_s", "relegated"]
    order = {c: i for i, c in enumerate(["best static", *CONTROLLERS])}
    t = seed_spread(df[df["config"].isin(order)], keys, vals)
    t = t.sort_values(keys, key=lambda s: s.map(order) if s.name == "config" else s,
                      kind="stable")
    best = df[df["config"] == "best static"].groupby(keys[:3])["best_budget"].first()
    lines = ["| model | workload | SLO | config | capacity (req/s) | vs best static | "
             "load (req/s) | goodput (req/s) | attainment | P99 TBT (ms) | P99 TTFT (s) | "
             "relegated |", "|" + " --- |" * 12]
    for _, r in t.iterrows():
        name = (f"best static ({int(best[r['model'], r['workload'], r['slo_kind']])})"
                if r["config"] == "best static" else r["config"])
        lines.append(
            f"| {r['model']} | {r['workload']} | {r['slo_kind']} | {name} | "
            f"{mr(r, 'capacity_qps')} | {mr(r, 'vs_best_static')}x | "
            f"{COMMON_QPS[r['model'], r['workload']]:g} | {mr(r, 'goodput_rps')} | "
            f"{mr(r, 'attainment', 100, 0)}% | {mr(r, 'p99_tbt_s', 1e3, 0)} | "
            f"{mr(r, 'p99_ttft_s', 1, 1)} | {mr(r, 'relegated', 1, 1)} |")
    return "\n".join(lines) + "\n"


def study(out: Path, work: Path, jobs: int = 2, requests: int = 300, seeds=(0, 1, 2),
          models=tuple(MODELS), workloads=WORKLOADS, kinds=KINDS,
          configs=(*(f"static {b}" for b in STATIC), *CONTROLLERS), fresh: bool = False,
          log=print):
    """Every cell (resumed where done; `fresh`: WORK emptied first, all redone: a cell file
    holds figures of the code that wrote it), then OUT/adaptive_chunking_full.csv (a row per
    cell) and .md (the table); returns the rows."""
    from studies import start_info, write_run_info
    start = start_info()
    if fresh:
        shutil.rmtree(work, ignore_errors=True)
    df = run_cells(cells(models, workloads, kinds, configs, seeds, requests), Path(work), jobs,
                   log)
    df = df.drop(columns="resumed", errors="ignore").sort_values(
        ["model", "workload", "slo_kind", "config", "seed"], ignore_index=True)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "adaptive_chunking_full.csv", index=False)
    (out / "adaptive_chunking_full.md").write_text(full_table(df))
    write_run_info(out, start, "experiments/adaptive_chunking/run.py",
                   ["--full", "--jobs", str(jobs), "--requests", str(requests),
                    *(["--fresh"] if fresh else [])])
    return df

