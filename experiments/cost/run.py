"""cost: dollars per 1M output tokens at capacity, per policy and SLO, with and without prefix
caching, for requests that share a 2,048-token system prompt (experiments/cost/README.md).

    python experiments/cost/run.py                       # ~4 min on 2 (shared) cores
    python experiments/cost/run.py --root /tmp/x --out /tmp/x/report --requests 40 \
        --system-prompt 64 capacity.max_probes=3 ...     # extra Hydra overrides

1. A JSONL trace: the first --requests ShareGPT-4 requests, each prompt a shared system prompt
   of --system-prompt tokens followed by the request's own prompt (random token ids, seeded:
   only the system prompt is common to all requests).
2. `sarathi-lab -m experiment=cost trace.path=THAT`: capacity searches of the four policies
   under the strict and relaxed SLOs, prefix caching off.
3. The same for vllm and sarathi with `scheduler.enable_prefix_caching=true` (orca and
   request_level reserve each request's KV up front: a reserving KV manager has no prefix cache).
4. `sarathi-lab-report` over both, and `cost.csv`: capacity and $/1M output tokens side by side.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments"))
from studies import short, sweep  # noqa: E402

VOCAB = 32000   # Mistral-7B's vocabulary: the ids only need to be distinct, not meaningful


def write_trace(path: Path, num_requests: int, system_prompt: int, seed: int = 0) -> Path:
    """ShareGPT-4 requests behind a common system prompt, as JSONL with prompt token ids."""
    from sarathi_lab.traces import attach_prompt_ids, load_trace
    # arrivals are not written: each capacity probe makes its own
    df = load_trace("sharegpt", num_requests=num_requests, qps=1.0, seed=seed)
    df = df.assign(num_prompt_tokens=df["num_prompt_tokens"] + system_prompt)
    df = attach_prompt_ids(df, VOCAB, seed=seed, shared_prefix_len=system_prompt)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for ids, out in zip(df["prompt_token_ids"], df["num_output_tokens"]):
            f.write(json.dumps({"prompt_token_ids": ids, "output_len": int(out)}) + "\n")
    return path


def cost_table(cap):
    """One row per (policy, SLO): capacity and $/1M output tokens without and with caching."""
    import pandas as pd
    cap = cap.assign(prefix_caching=cap["scheduler.enable_prefix_caching"].fillna(False)
                     .astype(bool) if "scheduler.enable_prefix_caching" in cap else False)
    rows = []
    for (policy, slo), g in cap.groupby(["policy", "slo"], sort=False):
        row = {"policy": policy, "slo": slo}
        for on, name in ((False, "no_cache"), (True, "prefix_cache")):
            r = g[g["prefix_caching"] == on]
            row[f"capacity_qps_{name}"] = r["capacity_qps"].iloc[0] if len(r) else None
            row[f"usd_per_1m_{name}"] = r["usd_per_1m_output_tokens"].iloc[0] if len(r) else None
            row[f"bracketed_{name}"] = bool(r["bracketed"].iloc[0]) if len(r) else None
        rows.append(row)
    return pd.DataFrame(rows)


def run_study(root: Path, out: Path, requests: int, system_prompt: int, overrides: list[str]):
    """The trace, both sweeps, the report and cost.csv; returns (the report, the cost table)."""
    trace = short(write_trace(root / "cost" / f"sharegpt_sys{system_prompt}.jsonl", requests,
                               system_prompt))
    common = [f"trace.path={trace}", f"trace.name=sharegpt+sys{system_prompt}",
              f"trace.num_requests={requests}", *overrides]
    plain = sweep("cost", root, "cost_no_cache", common)
    cached = sweep("cost", root, "cost_prefix_cache", [*common, "scheduler=vllm,sarathi",
                                               "scheduler.enable_prefix_caching=true"])
    from sarathi_lab.report import make_report
    rep = make_report([plain, cached], out)
    t = cost_table(rep.capacity)
    t.to_csv(out / "cost.csv", index=False)
    return rep, t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(REPO / "outputs"), help="results_root of the sweeps")
    ap.add_argument("--out", default=str(REPO / "results" / "cost"))
    ap.add_argument("--requests", type=int, default=500, help="requests per probe")
    ap.add_argument("--system-prompt", type=int, default=2048, help="shared prefix, tokens")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for both sweeps")
    a = ap.parse_args(argv)
    if a.requests < 2 or a.system_prompt < 0:
        ap.error("--requests must be >= 2 and --system-prompt >= 0")
    _, t = run_study(Path(a.root).resolve(), Path(a.out), a.requests, a.system_prompt,
                     a.overrides)
    import pandas as pd
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(t.to_string(index=False, float_format="%.3g"))
    print(f"-> {a.out}")


if __name__ == "__main__":
    main()
