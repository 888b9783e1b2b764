"""Chunking overhead: the time to prefill one long prompt split into chunks of c tokens, relative
to prefilling it in one piece, measured on this CPU and predicted by both cost models.

    python experiments/chunk_overhead/run.py [--toy] [--repeats 7] [--profile PATH]
                                             [--vidur DIR] [--out DIR]

One request (P prompt tokens, one output token) is driven through the `Engine` under
`scheduler=sarathi scheduler.token_budget=c`, for c = 64 ... P; its prefill time is the sum of
the durations of the iterations that carry its prompt. Sources:
  measured   the real torch executor on this CPU (one thread), `--repeats` rounds over the
             chunk sizes (every other round in reverse order, so that a linear drift touches
             every size alike) after a warm-up run; the ratio is taken within each round, then
             the median over rounds (the lowest and highest rounds' beside it);
  roofline   `executor=sim`: the CPU model (on A100 numbers: the roofline has no CPU preset), and
             Mistral-7B, Yi-34B TP2 and Llama-2-70B TP2 on A100; Mistral also with the fixed
             per-iteration, per-request and per-layer terms set to 0 (what is left: the
             operators' own FLOPs and bytes);
  profiled   `executor.cost_model=profiled`: a profile of the same CPU model made here by
             `sarathi-lab-profile`'s code (its `cpu` grid plus long chunks and contexts, so that
             nothing is extrapolated), and Vidur's measured Llama-2-70B TP2 A100 profiles.
Writes, in DIR (default results/chunk_overhead, or results/chunk_overhead/toy with --toy):
chunk_overhead.csv (chunk x source: prefill seconds, ratio to one piece, iterations; min and
spread for the measured rows), runs.csv (every run; the measured ones by round), per_chunk.csv
(the predicted duration of each chunk at its context), chunk_overhead.md (ratios side by side),
chunk_overhead.png, chunk_overhead.json (machine, load, settings) and profile.parquet.
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
from studies import compose  # noqa: E402

VIDUR_REL = Path("profiles/vidur/compute/a100/meta-llama/Llama-2-70b-hf")
VIDUR_TOY = ROOT / "tests" / "data" / "vidur" / "a100" / "meta-llama" / "Llama-2-70b-hf"

# experiments/fidelity's random Llama (about 5M parameters): a 4k-token prefill takes about a
# second on one thread, so every chunk size can be repeated; SmolLM2-135M would take ~30x longer.
CPU_MODEL = ["model=tiny-llama", "model.name=chunk-llama", "model.num_layers=4",
             "model.hidden_size=256", "model.intermediate_size=768", "model.num_heads=4",
             "model.num_kv_heads=2", "model.head_dim=64", "model.vocab_size=4096"]

SCALES = {
    "full": dict(model=CPU_MODEL, prompt=4096, chunks=(64, 128, 256, 512, 1024, 2048, 4096),
                 grid="cpu", profile_repeats=5,
                 # long chunks and contexts beside the cpu grid's (which stops at 1024)
                 extra_linear=(3072, 4096),
                 extra_prefill=((64, 2048), (64, 4032), (256, 2048), (256, 3840), (512, 3584),
                                (1024, 2048), (1024, 3072), (2048, 0), (2048, 2048),
                                (4096, 0))),
    "toy": dict(model=["model=tiny-llama"], prompt=256, chunks=(32, 64, 128, 256), grid="tiny",
                profile_repeats=2, extra_linear=(256,), extra_prefill=((256, 0), (32, 224))),
}


def sources(scale: dict, profile: Path, vidur: Path) -> dict[str, tuple[str, list[str], bool]]:
    """name -> (kind, overrides, host hardware?) of every source of the table."""
    a100, long = ["hardware=a100-80gb"], ["model.max_model_len=8192"]
    roof = ["executor=sim", "executor.cost_model=roofline"]
    prof = ["executor=sim", "executor.cost_model=profiled"]
    fixed0 = ["executor.iteration_overhead_s=0", "executor.request_overhead_s=0",
              "executor.layer_overhead_s=0"]
    return {
        "measured cpu (torch)": ("measured", [*scale["model"], "executor=torch",
                                              "executor.device=cpu",
                                              "executor.dtype=float32"], False),
        "profiled cpu": ("profiled", [*scale["model"], *prof, f"executor.profile={profile}"],
                         True),
        "roofline cpu model on a100": ("roofline", [*scale["model"], *roof, *a100], False),
        "roofline mistral-7b a100": ("roofline", ["model=mistral-7b", *roof, *a100], False),
        "roofline mistral-7b a100, fixed terms 0": ("roofline", ["model=mistral-7b", *roof,
                                                                 *a100, *fixed0], False),
        "roofline yi-34b tp2 a100": ("roofline", ["model=yi-34b", *long, *roof, *a100,
                                                  "executor.tensor_parallel=2"], False),
        "roofline llama-2-70b tp2 a100": ("roofline", ["model=llama-2-70b", *long, *roof, *a100,
                                                       "executor.tensor_parallel=2"], False),
        "profiled llama-2-70b tp2 a100 (vidur)": ("profiled", [
            "model=llama-2-70b", *long, *prof, *a100, "executor.tensor_parallel=2",
            f"executor.profile={vidur}"], False),
    }


def prefill_time(overrides: list[str], prompt: int, chunk: int, host: dict | None) -> tuple:
    """(seconds, durations) of prefilling one `prompt`-token request under sarathi with a token
    budget of `chunk`: the sum of the durations of the iterations that carry prompt tokens, and
    those durations, chunk after chunk."""
    from sarathi_lab.engine import Engine
    from sarathi_lab.metrics import iterations_table
    from sarathi_lab.run.config import resolve
    from sarathi_lab.run.runner import build
    from sarathi_lab.traces import build_trace, to_requests
    c = compose([*overrides, "scheduler=sarathi", f"scheduler.token_budget={chunk}",
                 f"scheduler.num_kv_blocks={prompt // 16 + 16}", "trace=synthetic",
                 "progress=false"])
    c["trace"].update(num_requests=1, qps=1.0, prompt_len=prompt, output_len=1, seed=0)
    if host is not None:
        c["hardware"] = host
    policy, executor = build(c, resolve(c))
    trace = executor.prepare_trace(build_trace(c["trace"]), c["trace"])
    requests = to_requests(trace)
    engine = Engine(policy, executor, fast_forward=False)
    engine.run(requests)
    it = iterations_table(engine.iterations())
    pre = it[it["prefill_tokens"] > 0]
    if int(pre["prefill_tokens"].sum()) != prompt or requests[0].num_computed_tokens < prompt:
        raise RuntimeError(f"chunk {chunk}: {int(pre['prefill_tokens'].sum())} of {prompt} "
                           "prompt tokens were prefilled")
    return float(pre["duration"].sum()), pre["duration"].tolist()


def make_profile(scale: dict, out: Path, progress: bool) -> Path:
    """`sarathi-lab-profile`'s measurement of the CPU model over its named grid plus the
    scale's long points, with one torch thread."""
    from sarathi_lab import profiler
    g = profiler.GRIDS[scale["grid"]]
    grid = profiler.Grid(linear=tuple(sorted(set(g.linear) | set(scale["extra_linear"]))),
                         prefill=tuple(g.prefill) + tuple(scale["extra_prefill"]),
                         decode=g.decode, mixed=g.mixed)
    executor, model = profiler.build_executor([*scale["model"], "executor.device=cpu",
                                               "executor.dtype=float32"])
    rows = profiler.measure(profiler.Harness(executor), grid, scale["profile_repeats"], 1,
                            progress, "median")
    meta = profiler.metadata(executor, model, f"{scale['grid']}+long", scale["profile_repeats"],
                             1, "median")
    return profiler.write(rows, meta, out / "profile.parquet")


def find_vidur(toy: bool) -> Path:
    if toy:
        return VIDUR_TOY
    for base in (ROOT.parent / "shared", ROOT.parent.parent / "shared"):
        if (base / VIDUR_REL / "attention.csv").exists():
            return base / VIDUR_REL
    raise FileNotFoundError(f"Vidur's Llama-2-70B profiles ({VIDUR_REL}) not found beside the "
                            "repository; pass --vidur DIR")


def table(rows: list[dict], prompt: int) -> pd.DataFrame:
    """Per source and chunk: the prefill time and its ratio to the same source's one-piece time.
    Measured sources ran in rounds (`round`): the ratio is taken within each round (chunked run /
    that round's one-piece run, so a slow or quiet period that spans a round cancels), then the
    median over rounds, with the lowest and highest rounds' ratios beside it."""
    df = pd.DataFrame(rows)
    if "round" not in df:
        df["round"] = 0
    df["round"] = df["round"].fillna(0)
    one = df[df["chunk"] >= prompt].set_index(["source", "round"])["seconds"]
    own = one.loc[list(zip(df["source"], df["round"]))].to_numpy()
    df["ratio"] = df["seconds"].to_numpy() / own
    out = []
    for (src, chunk), d in df.groupby(["source", "chunk"], sort=False):
        t, r = d["seconds"].to_numpy(), d["ratio"].to_numpy()
        med = float(np.median(t))
        out.append({"source": src, "kind": d["kind"].iloc[0], "chunk": chunk,
                    "iterations": int(d["iterations"].iloc[0]), "seconds": med,
                    "seconds_min": float(t.min()), "spread": float((t.max() - t.min()) / med),
                    "ratio": float(np.median(r)), "ratio_lo": float(r.min()),
                    "ratio_hi": float(r.max()), "repeats": len(t)})
    return pd.DataFrame(out)


def markdown(t: pd.DataFrame) -> str:
    srcs = list(dict.fromkeys(t["source"]))
    head = "| chunk | " + " | ".join(srcs) + " |\n|---|" + "---|" * len(srcs) + "\n"
    body = ""
    for chunk, d in t.groupby("chunk"):
        d = d.set_index("source")
        cells = []
        for s in srcs:
            r = d.loc[s]
            cell = f"{r['ratio']:.3f}"
            if r["kind"] == "measured":
                cell += f" ({r['ratio_lo']:.2f}-{r['ratio_hi']:.2f}; ±{r['spread']:.0%})"
            cells.append(cell)
        body += f"| {chunk} | " + " | ".join(cells) + " |\n"
    one = t[t["chunk"] == t["chunk"].max()].set_index("source")["seconds"]
    foot = "| one piece (s) | " + " | ".join(f"{one[s]:.4g}" for s in srcs) + " |\n"
    return ("Total prefill time of one prompt split into chunks / the same prompt in one piece. "
            "Measured: the median over rounds of each round's ratio (in brackets: the lowest "
            "and highest round's ratio, and the spread (max - min) / median of the runs' "
            "seconds).\n\n" + head + body + foot)


def plot(t: pd.DataFrame, out: Path) -> Path:
    from matplotlib.figure import Figure
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    style = {"measured": dict(color="k", lw=2.4, marker="o"),
             "roofline": dict(ls="--", marker="s", ms=4), "profiled": dict(ls="-", marker="^")}
    for src, d in t.groupby("source", sort=False):
        kind = d["kind"].iloc[0]
        ax.plot(d["chunk"], d["ratio"], label=src, **style[kind])
        if kind == "measured":
            ax.fill_between(d["chunk"], d["ratio_lo"], d["ratio_hi"], color="k", alpha=0.12,
                            lw=0, label="measured: lowest-highest round")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")    # the tiny model on an A100 is all fixed costs: tens of x
    ax.set_xticks(list(t["chunk"].unique()), [str(c) for c in t["chunk"].unique()])
    ax.set_yticks([1, 1.25, 1.5, 2, 3, 5, 10, 20, 40], ["1", "1.25", "1.5", "2", "3", "5", "10",
                                                        "20", "40"])
    ax.set_xlabel("chunk size (tokens)")
    ax.set_ylabel("prefill time / one piece")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"Chunking overhead, one {int(t['chunk'].max())}-token prompt", fontsize=10)
    path = out / "chunk_overhead.png"
    fig.savefig(path, dpi=110)
    return path


def study(out: Path, toy: bool = False, repeats: int = 3, profile: str | None = None,
          vidur: str | None = None, log=print) -> pd.DataFrame:
    import torch

    from sarathi_lab import profiler
    torch.set_num_threads(1)
    scale = SCALES["toy" if toy else "full"]
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if profile is None:
        log("profiling the torch executor ...")
        profile = make_profile(scale, out, progress=not toy)
    profile = Path(profile)
    t_profile = time.perf_counter() - t0
    host = profiler.host_hardware(profiler.profile_meta(profile)["device"])
    vidur = Path(vidur) if vidur else find_vidur(toy)
    P, chunks = scale["prompt"], scale["chunks"]
    srcs = sources(scale, profile, vidur)
    rows, load, per_chunk = [], [], []
    measured = {k: v for k, v in srcs.items() if v[0] == "measured"}
    for name, (kind, ov, _) in measured.items():
        prefill_time(ov, P, chunks[-1], None)     # warm-up: first-call allocations, caches
        for rep in range(repeats):
            for c in (chunks if rep % 2 == 0 else chunks[::-1]):
                s, d = prefill_time(ov, P, c, None)
                rows.append(dict(source=name, kind=kind, chunk=c, seconds=s, iterations=len(d),
                                 round=rep))
                load.append(os.getloadavg()[0])
            log(f"{name} round {rep}: " + ", ".join(f"{r['chunk']}: {r['seconds']:.3f} s"
                                                   for r in rows[-len(chunks):]))
    for name, (kind, ov, on_host) in srcs.items():
        if kind == "measured":
            continue
        for c in chunks:
            s, d = prefill_time(ov, P, c, host if on_host else None)
            rows.append(dict(source=name, kind=kind, chunk=c, seconds=s, iterations=len(d)))
            per_chunk += [dict(source=name, chunk=c, context=i * c, seconds=x)
                          for i, x in enumerate(d)]
    pd.DataFrame(rows).to_csv(out / "runs.csv", index=False)
    pd.DataFrame(per_chunk).to_csv(out / "per_chunk.csv", index=False)
    t = table(rows, P)
    t.to_csv(out / "chunk_overhead.csv", index=False)
    md = markdown(t)
    info = {"prompt_tokens": P, "chunks": list(chunks), "repeats": repeats,
            "profile": str(profile), "profile_meta": profiler.profile_meta(profile),
            "profile_s": t_profile, "vidur": str(vidur), "cpus": os.cpu_count(),
            "load_average_1min": [min(load, default=np.nan), max(load, default=np.nan)],
            "torch_threads": torch.get_num_threads(), "wall_s": time.perf_counter() - t0,
            "sources": {k: v[1] for k, v in srcs.items()}}
    md += (f"\nOne {P}-token prompt, one output token; {repeats} measured rounds on "
           f"{os.cpu_count()} CPUs, one torch thread, 1-minute load average "
           f"{info['load_average_1min'][0]:.1f}-{info['load_average_1min'][1]:.1f}.\n")
    (out / "chunk_overhead.md").write_text(md)
    (out / "chunk_overhead.json").write_text(json.dumps(info, indent=1, default=str))
    plot(t, out)
    log(md)
    return t


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--toy", action="store_true", help="seconds: a tiny model, a short prompt")
    p.add_argument("--repeats", type=int, default=7, help="measured rounds over the chunk sizes")
    p.add_argument("--profile", help="reuse this CPU profile instead of measuring one")
    p.add_argument("--vidur", help="Vidur's Llama-2-70b-hf A100 profile directory")
    p.add_argument("--out", help="default: results/chunk_overhead (.../toy with --toy)")
    a = p.parse_args(argv)
    if a.repeats < 1:
        sys.exit("--repeats must be >= 1")
    out = Path(a.out) if a.out else ROOT / "results" / "chunk_overhead" / ("toy" if a.toy else "")
    study(out, a.toy, a.repeats, a.profile, a.vidur)


if __name__ == "__main__":
    main()
