"""planning: the cheapest deployment of Llama-3-70B and Mixtral-8x7B on A100 or H100, for a chat
and a summarization workload, under each model's strict and relaxed SLO (issue 26, item 5;
experiments/planning/README.md).

    python experiments/planning/run.py                       # ~15-20 min on 2 shared cores
    python experiments/planning/run.py --requests 40 --models mixtral-8x7b --workloads chat \
        --slos strict --hardware a100-80gb --out /tmp/p/out --root /tmp/p/plans   # toy scale

Each case (model x workload x SLO) is one `sarathi-lab-plan` space, searched with the planner's
own functions (`sarathi_lab.plan.search`): hardware {A100, H100} x the model's layouts x
{colocated, disaggregated 1:1} x {sarathi at budgets 512 and 2048, vllm}, the fewest replicas
that serve the case's load within the SLO and that deployment's capacity. Every case's
candidates go to one joblib pool. Mixtral's layouts are two products (tensor parallel alone;
expert parallel with TP 1 or 2), so its space is the union of two plans. In `--out`:

- `<case>/ranked.csv`: every candidate, ranked by $ per 1M output tokens (feasible first; the
  infeasible and pruned with the reason), with the `sarathi-lab` command of each feasible row;
  `<case>/pareto.png`: cost against P99 TTFT and P99 TBT at the load (the planner's plot);
- `cheapest.csv`: per case and hardware (and `any`), the cheapest deployment: GPUs, layout,
  colocated or disaggregated, policy, budget, $/1M output tokens, $/h, capacity (a lower bound
  where `capacity_bracketed` is false: no probe failed), binding criterion, P99 TTFT and TBT at
  the load; for the case's cheapest (`any`), whether its long check held (`--check`: 10 x its
  probe's requests, one ordinary run, its command in `check_command`);
- `policy.csv`: per case, the cheapest row of each policy/budget and of each split, and the
  cheapest vllm row's cost over the cheapest sarathi row's;
- `summary.md`: both tables as Markdown; `run_info.json` (commit, load, wall time).

The resumable state (each candidate's searches) is under `--root`/<case>/evals: a rerun with
the same root redoes nothing.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments"))
from studies import show, start_info, write_run_info  # noqa: E402

# model -> its layout spaces (each a product of executor settings; the space is their union)
LAYOUTS = {
    "llama-3-70b": [{"tensor_parallel": [2, 4, 8]}],
    "mixtral-8x7b": [{"tensor_parallel": [1, 2, 4, 8]},
                     {"tensor_parallel": [1, 2], "expert_parallel": [2, 4]}],
}
# workload -> trace overrides and the load (req/s) planned for; the same load for both models,
# so that their costs compare at the same traffic (see the README for why these loads)
WORKLOADS = {
    "chat": (["trace=azure_conv"], 16.0),
    "summarization": (["trace=arxiv"], 4.0),
}
SLOS = ("strict", "relaxed")
HARDWARE = ("a100-80gb", "h100-sxm")
POLICIES = ("sarathi", "vllm")
BUDGETS = (512, 2048)
SPLITS = ("colocated", "1:1")
# Llama-3-70B's context is 8,192 tokens: none of the first 250 requests of either trace is
# longer (arXiv's longest is 4,074), but a larger --requests may reach longer ones; the cap gives
# both models the same requests (the capacity search logs how many it dropped)
MAX_TOTAL_TOKENS = 8192
CASE = ["model", "workload", "slo"]
CHECKED = ["check_held", "check_requests", "check_ttft_p99", "check_missed", "check_command"]
SHOWN = ["hardware", "gpus", "replicas", "layout", "split", "policy", "token_budget",
         "usd_per_1m_output_tokens", "usd_per_hour", "capacity_qps", "capacity_bracketed",
         "binds", "binds_missed", "ttft_p99", "tbt_p99"]


def case_name(model: str, workload: str, slo: str) -> str:
    return f"{model}_{workload}_{slo}"


def layout_label(r) -> str:
    tp = int(r["tensor_parallel"])
    ep = r.get("expert_parallel")
    ep = 1 if ep is None or ep != ep else int(ep)   # NaN: a layout without the key
    return f"TP{tp}" + (f" EP{ep}" if ep > 1 else "")


def case_jobs(model, workload, slo, args, root: Path):
    """(jobs, pruned rows) of one case: the union of its layout spaces' plans."""
    from sarathi_lab.plan.search import prepare
    from sarathi_lab.sweeps.bookkeeping import compose_config
    trace, load = WORKLOADS[workload]
    base = [f"model={model}", *trace, f"trace.num_requests={args.requests}",
            f"trace.max_total_tokens={MAX_TOTAL_TOKENS}", f"slo={model}-{slo}",
            f"capacity.precision={args.precision}", *args.overrides]
    p = compose_config(base, "plan")["plan"]
    jobs, pruned = [], []
    for layout in LAYOUTS[model]:
        p["space"].update(hardware=list(args.hardware), layout=layout, split=list(SPLITS),
                          policy=list(POLICIES), token_budget=list(BUDGETS),
                          max_replicas=args.max_replicas)
        p.update(load_qps=args.load.get(workload, load), backend="joblib", n_jobs=args.n_jobs)
        j, r = prepare(p, base, root / case_name(model, workload, slo), log=print)
        jobs += j
        pruned += r
    tag = {"model": model, "workload": workload, "slo": slo}
    for j in jobs:
        j["row"].update(tag)
    for r in pruned:
        r.update(tag)
    return jobs, pruned, p


def cheapest_table(all_rows):
    """Per case and hardware (and over both: `any`), the cheapest feasible deployment."""
    import pandas as pd
    f = all_rows[all_rows["status"] == "feasible"]
    out = []
    for key, g in f.groupby(CASE, sort=False):
        for hw, gg in [("any", g), *g.groupby("hardware", sort=False)]:
            # the order of `table.ranked` (and of the long check's pick)
            best = gg.sort_values(["usd_per_1m_output_tokens", "gpus", "capacity_qps",
                                   "candidate"], ascending=[True, True, False, True]).iloc[0]
            out.append({**dict(zip(CASE, key)), "on": hw, "load_qps": best["load_qps"],
                        **{c: best[c] for c in SHOWN}, "feasible": len(gg),
                        # the long check (--check) of the case's cheapest row: did it hold?
                        **{c: best.get(c) for c in CHECKED}})
    return pd.DataFrame(out)


def policy_table(all_rows):
    """Per case: the cheapest row of each policy/budget and of each split (NaN: none feasible),
    and vllm's cheapest cost over sarathi's."""
    import pandas as pd
    f = all_rows[all_rows["status"] == "feasible"].copy()
    f["choice"] = [p if b != b or b is None else f"{p}/{int(b)}"
                   for p, b in zip(f["policy"], f["token_budget"])]
    out = []
    for key, g in all_rows.groupby(CASE, sort=False):
        gf = f[(f[CASE] == pd.Series(dict(zip(CASE, key)))).all(axis=1)]
        row = dict(zip(CASE, key))

        def best(d):
            return d["usd_per_1m_output_tokens"].min() if len(d) else float("nan")
        for ch in [f"sarathi/{b}" for b in BUDGETS] + ["vllm"]:
            row[f"{ch}"] = best(gf[gf["choice"] == ch])
        for s in SPLITS:
            row[f"split {s}"] = best(gf[gf["split"] == s])
        row["vllm_over_sarathi"] = row["vllm"] / best(gf[gf["policy"] == "sarathi"])
        out.append(row)
    return pd.DataFrame(out)


def markdown(df) -> str:
    cols = list(df.columns)
    fmt = [(lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)) for _ in cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(f(r[c]) for f, c in zip(fmt, cols)) + " |")
    return "\n".join(lines)


RANKED_COLS = ["rank", "candidate", "status", "hardware", "layout", "split", "policy",
               "token_budget", "units", "replicas", "gpus", "usd_per_1m_output_tokens",
               "usd_per_hour", "capacity_qps", "capacity_bracketed", "binds", "binds_missed",
               "unit_capacity_qps", "ttft_p99", "tbt_p99", "load_qps", "simulations",
               "probe_requests", "reason", "command", *CHECKED]


def run_study(args) -> tuple:
    import pandas as pd

    from sarathi_lab.plan import table
    from sarathi_lab.plan.search import check_cheapest, dispatch
    root, out = Path(args.root), Path(args.out)
    jobs, rows, plan = [], [], None
    for model in args.models:
        for workload in args.workloads:
            for slo in args.slos:
                j, r, plan = case_jobs(model, workload, slo, args, root)
                jobs += j
                rows += r
    for i, row in enumerate(dispatch(jobs, plan), 1):
        rows.append(row)
        if i % 20 == 0 or i == len(jobs):
            print(f"  [{i}/{len(jobs)}] evaluated", flush=True)
    if args.check:   # each case's cheapest answer, re-run long (sarathi-lab-plan's plan.check)
        for key in dict.fromkeys(tuple(r[c] for c in CASE) for r in rows):
            case = [r for r in rows if tuple(r[c] for c in CASE) == key]
            check_cheapest(case, [j for j in jobs if tuple(j["row"][c] for c in CASE) == key],
                           args.check)
    all_rows = pd.DataFrame(rows)
    all_rows["layout"] = [layout_label(r) for _, r in all_rows.iterrows()]
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for key, g in all_rows.groupby(CASE, sort=False):
        name = case_name(*key)
        df = table.ranked(g.to_dict("records"))
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        df[[c for c in RANKED_COLS if c in df]].to_csv(d / "ranked.csv", index=False)
        if (df["status"] == "feasible").any():
            table.plot(df, d / "pareto.png")
        parts.append(df.assign(**dict(zip(CASE, key))))
    ranked = pd.concat(parts, ignore_index=True)
    cheapest, policy = cheapest_table(ranked), policy_table(ranked)
    cheapest.to_csv(out / "cheapest.csv", index=False)
    policy.to_csv(out / "policy.csv", index=False)
    (out / "summary.md").write_text(
        "# Cheapest deployment per case (and per hardware)\n\n" + markdown(cheapest)
        + "\n\n# $ per 1M output tokens of the cheapest row per policy/budget and split\n\n"
        + markdown(policy) + "\n")
    return ranked, cheapest, policy


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600,
                    help="requests per unit (a deployment of k units replays k x as many)")
    ap.add_argument("--precision", type=float, default=0.1,
                    help="capacity searches stop within this fraction (capacity.precision)")
    ap.add_argument("--models", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--slos", nargs="+", default=list(SLOS), choices=list(SLOS))
    ap.add_argument("--hardware", nargs="+", default=list(HARDWARE))
    ap.add_argument("--load", nargs="*", default=[], metavar="WORKLOAD=QPS",
                    help="replace a workload's load (e.g. chat=8)")
    ap.add_argument("--max-replicas", type=int, default=16)
    ap.add_argument("--check", type=int, default=10,
                    help="re-run each case's cheapest answer at the load with this many times "
                         "its probe's requests (plan.check); 0: no check")
    ap.add_argument("--n-jobs", type=int, default=2, help="joblib processes")
    ap.add_argument("--root", default=str(REPO / "outputs" / "planning"),
                    help="the plans' directories (resumable state)")
    ap.add_argument("--out", default=str(REPO / "results" / "planning"))
    ap.add_argument("overrides", nargs="*", help="extra sarathi-lab overrides for every run")
    args = ap.parse_args(argv)
    loads = {}
    for item in args.load:
        w, _, q = item.partition("=")
        if w not in WORKLOADS:
            ap.error(f"--load {item}: {w!r} is not a workload ({', '.join(WORKLOADS)})")
        try:
            loads[w] = float(q)
        except ValueError:
            ap.error(f"--load {item}: {q!r} is not a rate (req/s)")
        if loads[w] <= 0:
            ap.error(f"--load {item}: must be > 0 req/s")
    args.load = loads
    start = start_info()
    t0 = time.perf_counter()
    ranked, cheapest, policy = run_study(args)
    info = write_run_info(Path(args.out), start, "experiments/planning/run.py",
                          sys.argv[1:] if argv is None else argv)
    show(cheapest, policy)
    print(f"{len(ranked)} configurations in {time.perf_counter() - t0:.0f} s; "
          f"load average at the end {info['load_average']}")


if __name__ == "__main__":
    main()
