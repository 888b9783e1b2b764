"""This simulator against Vidur (Agrawal et al., MLSys 2024) on the same requests: wall time and
peak memory of one whole command each, side by side.

The requests are bench_sim.py's: 10,000 from the Azure conversation trace (total length capped
at 4,096), re-timed to 1 QPS, exported with their arrival times and lengths as a Vidur
trace-replay file (arrived_at, num_prefill_tokens, num_decode_tokens). Both simulate
Llama-2-70B with tensor parallelism 2 on A100s, batch cap 128, sarathi's chunk 512, vLLM's
4,096 batched tokens; Vidur predicts with its random forests trained on the measured operator
profiles in shared/profiles/vidur (the ones it ships), we with the roofline model. Vidur runs
from a checkout of its repository in a virtual environment of its own (its requirements.txt:
numpy, pandas, scikit-learn, ...; plots and its Chrome trace off, as `sarathi-lab` draws none
either). Its first run trains and caches the predictor (minutes; reported apart), every
measured run after that loads it.

    python experiments/bench/bench_vidur.py --vidur /path/to/vidur --vidur-python VENV/bin/python \\
        [--profiles /work/shared/profiles/vidur] [--policies sarathi,vllm] [--repeats 3] \\
        [--work DIR] [--new VENV]

`--new` is the virtual environment whose `sarathi-lab` is timed (default: the one running this
script); the README's plain install has none of Hydra's launcher plug-ins, which Hydra imports
at every start of a development install. Each repeat runs Vidur's command and ours alternately
(the order flipped every repeat); medians, ratios (Vidur / ours) and each side's count of
finished requests are printed. Ours runs once untimed per policy first, as Vidur's first run
is untimed. `--bytecode cached` gives each side a bytecode cache of its own
(PYTHONPYCACHEPREFIX, filled by those first runs), as an installed package has, where the
machine sets PYTHONDONTWRITEBYTECODE (this one does: both Vidur's checkout and an editable
install then recompile every module at each start).
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench_cli_compare import bytecode_env, bytecode_label, command, timed_run

VIDUR_POLICY = {   # ours -> Vidur's scheduler and its settings for the same batch rules
    "sarathi": ["--replica_scheduler_config_type", "sarathi",
                "--sarathi_scheduler_config_chunk_size", "512",
                "--sarathi_scheduler_config_batch_size_cap", "128"],
    "vllm": ["--replica_scheduler_config_type", "vllm",
             "--vllm_scheduler_config_batch_size_cap", "128",
             "--vllm_scheduler_config_max_tokens_in_batch", "4096"],
    "orca": ["--replica_scheduler_config_type", "orca",
             "--orca_scheduler_config_batch_size_cap", "128"],
    "request_level": ["--replica_scheduler_config_type", "faster_transformer",
                      "--faster_transformer_scheduler_config_batch_size_cap", "128"],
}


def export_trace(path: Path, requests: int, qps: float) -> int:
    from sarathi_lab.traces import load_trace
    df = load_trace("azure_conv", num_requests=requests, qps=qps, max_total_tokens=4096, seed=0)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        # repr: every float digit, so that Vidur reads the very same arrival times
        w.writerows((repr(float(t)), int(p), int(o)) for t, p, o in zip(
            df.arrival_time, df.num_prompt_tokens, df.num_output_tokens))
    return len(df)


def vidur_command(python: str, policy: str, trace: Path, out: Path) -> list[str]:
    return [python, "-m", "vidur.main", "--replica_config_device", "a100",
            "--replica_config_model_name", "meta-llama/Llama-2-70b-hf",
            "--replica_config_tensor_parallel_size", "2", "--cluster_config_num_replicas", "1",
            "--request_generator_config_type", "trace_replay",
            "--trace_request_generator_config_trace_file", str(trace),
            "--trace_request_generator_config_max_tokens", "4096", *VIDUR_POLICY[policy],
            "--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace",
            "--metrics_config_output_dir", str(out)]


def vidur_finished(out: Path) -> int | None:
    """Requests in Vidur's request metrics (one row each), or None if it wrote none."""
    files = list(out.rglob("request_metrics.csv"))
    if not files:
        return None
    with open(files[0]) as f:
        return sum(1 for _ in f) - 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vidur", type=Path, required=True, help="a checkout of microsoft/vidur")
    ap.add_argument("--vidur-python", required=True, help="python of Vidur's own environment")
    ap.add_argument("--profiles", type=Path, default=Path("/work/shared/profiles/vidur"),
                    help="Vidur's data/profiling folder (compute/, network/)")
    ap.add_argument("--new", type=Path, default=Path(sys.prefix),
                    help="the environment with sarathi-lab (default: this one)")
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--qps", type=float, default=1.0)
    ap.add_argument("--policies", default="sarathi,vllm")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bytecode", choices=("env", "cached"), default="env",
                    help="env: as the environment says; cached: a bytecode cache per side")
    ap.add_argument("--work", type=Path, help="working folder, kept (Vidur's trained predictor "
                    "is cached in its cache/: a second run skips the training); default: new")
    args = ap.parse_args()
    work = args.work.absolute() if args.work else Path(tempfile.mkdtemp(prefix="bench_vidur_"))
    (work / "data").mkdir(parents=True, exist_ok=True)
    link = work / "data" / "profiling"
    if not link.exists():
        link.symlink_to(args.profiles.absolute())
    trace = work / "trace.csv"
    n = export_trace(trace, args.requests, args.qps)
    vidur_env = bytecode_env({**os.environ, "PYTHONPATH": str(args.vidur.absolute()),
                              "WANDB_MODE": "disabled"}, args.bytecode, work, "vidur")
    ours_env = bytecode_env({**os.environ, "WANDB_MODE": "disabled"}, args.bytecode, work, "ours")
    print(f"{n} requests -> {trace}; Vidur {args.vidur} ({args.vidur_python}), "
          f"ours {args.new.absolute()}; {args.repeats} repeats; bytecode: "
          + bytecode_label(args.bytecode, "a cache per side"))
    policies = args.policies.split(",")
    for policy in policies:   # trains (or loads) Vidur's predictor: its cache is in `work`
        wall, rss, _ = timed_run(vidur_command(args.vidur_python, policy, trace, work / "warm"),
                              vidur_env, str(work))
        print(f"Vidur {policy} first run (predictor trained or loaded): {wall:.1f} s, "
              f"{rss:.0f} MiB", flush=True)
        wall, rss, _ = timed_run(command(args.new.absolute(), policy, args.requests, args.qps,
                                         str(work / "warm-ours")), ours_env, str(work))
        print(f"ours {policy} first run: {wall:.1f} s, {rss:.0f} MiB", flush=True)
    res = {(p, k): {"wall": [], "rss": []} for p in policies for k in ("vidur", "ours")}
    done = {}
    for i in range(args.repeats):
        for policy in policies:
            for kind in (("vidur", "ours") if i % 2 == 0 else ("ours", "vidur")):
                out = Path(tempfile.mkdtemp(dir=work))
                if kind == "vidur":
                    cmd, env = vidur_command(args.vidur_python, policy, trace, out), vidur_env
                else:
                    cmd, env = command(args.new.absolute(), policy, args.requests, args.qps,
                                       str(out)), ours_env
                wall, rss, _ = timed_run(cmd, env, str(work))
                res[policy, kind]["wall"].append(wall)
                res[policy, kind]["rss"].append(rss)
                if i == 0:
                    if kind == "vidur":
                        done[policy, kind] = vidur_finished(out)
                    else:
                        import json
                        s = json.loads((out / "summary.json").read_text())
                        done[policy, kind] = s["num_finished"]
        print(f"repeat {i + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    print(f"\nmedians over {args.repeats} repeats: whole command wall s, peak RSS MiB; "
          "ratio Vidur / ours")
    print(f"{'policy':<14}{'Vidur s':>9}{'ours s':>9}{'x faster':>10}{'Vidur MiB':>11}"
          f"{'ours MiB':>10}{'x less':>8}   requests done (Vidur, ours)")
    for policy in policies:
        v, o = res[policy, "vidur"], res[policy, "ours"]
        vw, ow = statistics.median(v["wall"]), statistics.median(o["wall"])
        vr, orss = statistics.median(v["rss"]), statistics.median(o["rss"])
        print(f"{policy:<14}{vw:>9.2f}{ow:>9.2f}{vw / ow:>10.1f}{vr:>11.0f}{orss:>10.0f}"
              f"{vr / orss:>8.1f}   {done.get((policy, 'vidur'))}, {done.get((policy, 'ours'))}")
    print("min-max wall: " + "; ".join(
        f"{p} Vidur {min(res[p, 'vidur']['wall']):.2f}-{max(res[p, 'vidur']['wall']):.2f}, "
        f"ours {min(res[p, 'ours']['wall']):.2f}-{max(res[p, 'ours']['wall']):.2f}"
        for p in policies))


if __name__ == "__main__":
    main()
