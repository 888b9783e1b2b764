"""paging: KV reservation against paging at the same KV memory, and prefix caching on a shared
system prompt (experiments/paging/README.md).

    python experiments/paging/run.py                       # ~5 min on 2 shared cores
    python experiments/paging/run.py --root /tmp/x --out /tmp/x/out --requests 40 \
        --prefix-requests 30 --seeds 0

Mistral-7B on one simulated A100-80GB; every arm gets the same KV cache, what fits beside the
weights (28,982 blocks of 16 tokens) and a quarter of it (`--kv-fractions`, standing for a model
with 4x the KV per token), and `max_num_seqs` 256 (vLLM's default), so what limits a batch is
memory (or, for Sarathi, its token budget).

1. Reservation vs paging: a random sample of ShareGPT-4 (`trace.shuffle`, one per seed) arriving
   far faster than any policy serves it (`--qps`), so every policy runs as full as its KV cache
   lets it. Arms: request_level and orca reserve each request's maximum length at admission;
   orca_pow2 and orca_oracle are orca with each request's `max_tokens` set to the next power of
   two of its output length and to the output length itself (the vLLM paper's Orca (Pow2) and
   Orca (Oracle)); vllm and sarathi page. Figures: the share of the KV cache holding tokens
   (`kv.token_share_mean`), of the allocated blocks holding tokens (1 - `kv.internal_waste_mean`),
   the blocks in use, the batch size (`batch.requests_mean`), throughput, preemptions; and over
   the iterations during which requests wait (`saturated`, from iterations.parquet: the arrivals
   stop after 1,000 requests and the run's tail drains), the token share, the batch size and
   the decode tokens per second.
2. Prefix caching: the same sample behind a shared system prompt of `--system-prompt` tokens
   (random ids, distinct past it), at `--prefix-qps`, vllm and sarathi with caching off and on:
   hit rate, prompt blocks served from the cache, blocks in use, prefill tokens computed, TTFT.

Every run's directory is under ROOT/paging/; in --out: `reservation_runs.csv`,
`reservation.csv` (mean, std, min, max over seeds), `prefix_runs.csv`, `prefix.csv`,
`paging.png`, `run_info.json`.
"""
from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments"))
from studies import compose, seed_spread, show, start_info, write_run_info  # noqa: E402

VOCAB = 32000   # Mistral-7B's vocabulary: the ids only need to be distinct, not meaningful
ARMS = {   # label: (policy, max_tokens rule)
    "request_level": ("request_level", None),
    "orca": ("orca", None),
    "orca_pow2": ("orca", "pow2"),
    "orca_oracle": ("orca", "oracle"),
    "vllm": ("vllm", None),
    "sarathi": ("sarathi", None),
}
RESERVATION = ["kv_token_share", "kv_slot_fill", "kv_blocks_used_mean", "batch_requests_mean",
               "batch_requests_max", "saturated_share", "kv_token_share_saturated",
               "batch_requests_saturated", "decode_tok_s_saturated", "throughput_rps",
               "throughput_tok_s", "preemptions", "ttft_p50", "tbt_p99"]
PREFIX = ["hit_rate", "cached_blocks", "kv_blocks_used_mean", "prefill_tokens", "ttft_p50",
          "ttft_p99", "tbt_p99", "throughput_rps"]


def full_cache_blocks() -> int:
    """KV blocks of the A100 beside Mistral-7B's weights (the same for every policy)."""
    from sarathi_lab.run.runner import build
    policy, _ = build(config("vllm", 0, 2, 1.0))
    return policy.kv.num_blocks


def config(policy: str, seed: int, n: int, qps: float, extra=()) -> dict:
    return compose([f"scheduler={policy}", "model=mistral-7b", "hardware=a100-80gb",
                    "trace=sharegpt", "trace.shuffle=true", f"trace.num_requests={n}",
                    f"trace.qps={qps}", f"seed={seed}", "scheduler.max_num_seqs=256",
                    "scheduler.max_model_len=8192", "progress=false", *extra])


def max_tokens(output: np.ndarray, rule: str | None):
    """Each request's max_tokens: none, its output length (oracle), or the next power of two."""
    if rule is None:
        return [None] * len(output)
    out = np.maximum(output, 1)
    return (out if rule == "oracle" else 2 ** np.ceil(np.log2(out)).astype(np.int64)).tolist()


def saturated(it, blocks: int, block_size: int) -> dict:
    """The iterations during which requests wait (the cache, not the arrivals, limits the batch):
    their share of the run's time, the KV token share and batch size over them, and the decode
    tokens they computed per second."""
    w = it[it["num_waiting"] > 0]
    busy, total = float(w["duration"].sum()), float(it["duration"].sum())
    if w.empty:
        return {"saturated_share": 0.0, "kv_token_share_saturated": None,
                "batch_requests_saturated": None, "decode_tok_s_saturated": None}
    return {"saturated_share": busy / total if total > 0 else 0.0,
            "kv_token_share_saturated": float(w["kv_tokens_stored"].mean()) / (blocks * block_size),
            "batch_requests_saturated": float(w["num_requests"].mean()),
            "decode_tok_s_saturated": float(w["decode_tokens"].sum()) / busy if busy else None}


def reservation_run(root: str, arm: str, seed: int, n: int, qps: float, blocks: int,
                    fraction: float) -> dict:
    import pandas as pd

    from sarathi_lab.run.runner import run
    from sarathi_lab.traces import build_trace, to_requests
    policy, rule = ARMS[arm]
    c = config(policy, seed, n, qps, [f"scheduler.num_kv_blocks={blocks}"])
    df = build_trace(c["trace"])
    reqs = to_requests(df)
    for r, m in zip(reqs, max_tokens(df["num_output_tokens"].to_numpy(), rule)):
        r.max_tokens = m
    d = Path(root) / "paging" / "reservation" / f"{arm}_kv{fraction:g}_seed{seed}"
    s = run(c, d, requests=reqs)
    kv = s["kv"]
    it = pd.read_parquet(d / "iterations.parquet")
    return {"arm": arm, "policy": policy, "max_tokens": rule or "none", "kv_fraction": fraction,
            "seed": seed,
            "num_requests": s["num_requests"], "num_finished": s["num_finished"],
            "kv_blocks_total": kv["blocks_total"],
            "kv_token_share": kv["token_share_mean"],
            "kv_slot_fill": 1 - kv["internal_waste_mean"],
            "kv_blocks_used_mean": kv["utilization_mean"] * kv["blocks_total"],
            "batch_requests_mean": s["batch"]["requests_mean"],
            "batch_requests_max": s["batch"]["requests_max"],
            "throughput_rps": s["throughput_rps"], "throughput_tok_s": s["throughput_tok_s"],
            "preemptions": s["preemptions"], "ttft_p50": s["ttft"]["p50"],
            "tbt_p99": s["tbt"]["p99"],
            **saturated(it, kv["blocks_total"], c["scheduler"]["block_size"])}


def prefix_run(root: str, policy: str, caching: bool, seed: int, n: int, qps: float,
               system_prompt: int) -> dict:
    import pandas as pd

    from sarathi_lab.run.runner import run
    from sarathi_lab.traces import attach_prompt_ids, build_trace, to_requests
    # the system prompt lengthens every prompt: room for it beyond the trace's 8k
    c = config(policy, seed, n, qps, [f"scheduler.max_model_len={8192 + system_prompt}",
                                      f"scheduler.enable_prefix_caching={str(caching).lower()}"])
    df = build_trace(c["trace"])
    df = df.assign(num_prompt_tokens=df["num_prompt_tokens"] + system_prompt)
    reqs = to_requests(attach_prompt_ids(df, VOCAB, seed=seed, shared_prefix_len=system_prompt))
    d = Path(root) / "paging" / "prefix" / f"{policy}_{'cache' if caching else 'nocache'}_seed{seed}"
    s = run(c, d, requests=reqs)
    it = pd.read_parquet(d / "iterations.parquet", columns=["prefill_tokens"])
    pc = s.get("prefix_cache") or {"hit_rate": None, "hit_tokens": 0}
    kv = s["kv"]
    return {"policy": policy, "prefix_caching": caching, "seed": seed,
            "num_requests": s["num_requests"], "num_finished": s["num_finished"],
            "hit_rate": pc["hit_rate"] if caching else 0.0,
            "cached_blocks": pc["hit_tokens"] // c["scheduler"]["block_size"],
            "kv_blocks_used_mean": kv["utilization_mean"] * kv["blocks_total"],
            "prefill_tokens": int(it["prefill_tokens"].sum()),
            "ttft_p50": s["ttft"]["p50"], "ttft_p99": s["ttft"]["p99"],
            "tbt_p99": s["tbt"]["p99"], "throughput_rps": s["throughput_rps"]}


def prefix_effect(prefix):
    """Per policy and seed, caching on against off: prefill tokens and blocks saved, TTFT
    change; then their mean and spread over seeds."""
    import pandas as pd
    on = prefix[prefix["prefix_caching"]].set_index(["policy", "seed"])
    off = prefix[~prefix["prefix_caching"]].set_index(["policy", "seed"])
    d = pd.DataFrame({
        "hit_rate": on["hit_rate"], "cached_blocks": on["cached_blocks"],
        "prefill_tokens_saved": 1 - on["prefill_tokens"] / off["prefill_tokens"],
        "kv_blocks_used_saved": 1 - on["kv_blocks_used_mean"] / off["kv_blocks_used_mean"],
        "ttft_p50_off": off["ttft_p50"], "ttft_p50_on": on["ttft_p50"],
        "ttft_p50_ratio": on["ttft_p50"] / off["ttft_p50"],
        "ttft_p99_ratio": on["ttft_p99"] / off["ttft_p99"],
        "throughput_ratio": on["throughput_rps"] / off["throughput_rps"]}).reset_index()
    return seed_spread(d, ["policy"], [c for c in d.columns if c not in ("policy", "seed")])


def plot(res, out: Path) -> Path:
    """While requests wait: the share of the KV cache holding tokens and the batch size; and the
    run's throughput; per arm (mean over seeds, bars = min-max), a row per cache size."""
    from matplotlib.figure import Figure

    from sarathi_lab.plots import series_colors
    colors = series_colors(res.assign(series=res["arm"]))
    fractions = list(dict.fromkeys(res["kv_fraction"]))
    fig = Figure(figsize=(9, 3.2 * len(fractions)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(fractions), 3, squeeze=False))
    for row, f in zip(axes, fractions):
        d = res[res["kv_fraction"] == f]
        x = np.arange(len(d))
        for ax, (col, label) in zip(row, [
                ("kv_token_share_saturated", "share of the KV cache holding tokens"),
                ("batch_requests_saturated", "requests per batch"),
                ("throughput_tok_s", "output tokens/s (whole run)")]):
            mean = d[f"{col}_mean"].to_numpy(float)
            err = np.vstack([mean - d[f"{col}_min"], d[f"{col}_max"] - mean])
            ax.bar(x, mean, 0.7, yerr=err, capsize=2, color=[colors[a] for a in d["arm"]])
            ax.set_xticks(x, d["arm"], rotation=40, ha="right", fontsize=8)
            ax.set_title(f"{label}, KV cache x{f:g}", fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Mistral-7B, one A100, ShareGPT-4 at saturation; share and batch while requests "
                 "wait (mean over seeds, bars = min-max)", fontsize=9)
    path = out / "paging.png"
    fig.savefig(path, dpi=130)
    return path


def run_study(root: Path, out: Path, seeds, requests: int, qps: float, prefix_requests: int,
              prefix_qps: float, system_prompt: int, jobs: int, fractions=(1.0,)):
    import pandas as pd
    full = full_cache_blocks()
    calls = [(reservation_run, (str(root), arm, s, requests, qps, max(1, round(f * full)), f))
             for f in fractions for arm in ARMS for s in seeds]
    calls += [(prefix_run, (str(root), p, on, s, prefix_requests, prefix_qps, system_prompt))
              for p in ("vllm", "sarathi") for on in (False, True) for s in seeds]
    if jobs == 1:   # in this process (a module loaded from its file cannot be sent to workers)
        rows = [fn(*args) for fn, args in calls]
    else:
        with ProcessPoolExecutor(jobs) as pool:
            rows = [f.result() for f in [pool.submit(fn, *args) for fn, args in calls]]
    n = len(ARMS) * len(seeds) * len(fractions)
    res, pre = pd.DataFrame(rows[:n]), pd.DataFrame(rows[n:])
    out.mkdir(parents=True, exist_ok=True)
    res_cells = seed_spread(res, ["kv_fraction", "arm", "policy", "max_tokens"], RESERVATION)
    pre_cells = seed_spread(pre, ["policy", "prefix_caching"], PREFIX)
    effect = prefix_effect(pre)
    res.to_csv(out / "reservation_runs.csv", index=False)
    res_cells.to_csv(out / "reservation.csv", index=False)
    pre.to_csv(out / "prefix_runs.csv", index=False)
    pre_cells.to_csv(out / "prefix.csv", index=False)
    effect.to_csv(out / "prefix_effect.csv", index=False)
    plot(res_cells, out)
    return res, res_cells, pre, effect


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(REPO / "outputs"), help="where the run directories go")
    ap.add_argument("--out", default=str(REPO / "results" / "paging"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--requests", type=int, default=1000, help="requests per reservation run")
    ap.add_argument("--qps", type=float, default=20.0, help="arrival rate: above any capacity")
    ap.add_argument("--prefix-requests", type=int, default=500)
    ap.add_argument("--prefix-qps", type=float, default=1.0)
    ap.add_argument("--system-prompt", type=int, default=2048, help="shared prefix, tokens")
    ap.add_argument("--kv-fractions", type=float, nargs="+", default=[1.0, 0.25],
                    help="KV cache sizes, as shares of what the A100 holds beside the weights")
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel")
    a = ap.parse_args(argv)
    if min(a.seeds) < 0 or a.requests < 2 or a.prefix_requests < 2 or a.system_prompt < 1 \
            or a.qps <= 0 or a.prefix_qps <= 0 or a.jobs < 1 \
            or not all(0 < f <= 1 for f in a.kv_fractions):
        ap.error("seeds >= 0, requests >= 2, system prompt >= 1, rates > 0, jobs >= 1, "
                 "KV fractions in (0, 1]")
    start = start_info()
    out = Path(a.out)
    _, res, _, effect = run_study(Path(a.root).resolve(), out, a.seeds, a.requests, a.qps,
                                  a.prefix_requests, a.prefix_qps, a.system_prompt, a.jobs,
                                  a.kv_fractions)
    write_run_info(out, start, "experiments/paging/run.py", argv or sys.argv[1:])
    show(res, effect)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
