"""Sim vs server in one command: replay one trace against `sarathi-lab-serve` (the real executor
behind HTTP) with `sarathi-lab-replay`, simulate the same configuration (policy, budget, model,
KV cache, the same requests) on a profile of the same model measured here, and report the
simulation's error against what the client measured, beside the server's own view.

    python experiments/serve_check/run.py                 # ~4 min on a quiet 2-core CPU
    python experiments/serve_check/run.py --policy vllm --qps 6
    python experiments/serve_check/run.py --profile results/serve_check/profile.parquet
    python experiments/serve_check/run.py --toy           # seconds; tests/test_serve_check.py

Outputs in --out (results/serve_check): serve_check.md and .csv (per metric: the client's
value, the server's, the simulation's, and the errors), profile.parquet, and the three run
directories (replay/, served/, sim/). For another server (vLLM, SGLang) see the README.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from sarathi_lab.serve.launch import wait_for_address

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# the compared figures: (summary key, statistic)
METRICS = [(m, q) for m in ("ttft", "tbt", "e2e") for q in ("p50", "p90", "p99")] + \
    [("throughput_tok_s", None)]

SCALES = {
    # a ~5M-parameter Llama (as experiments/fidelity): compute and per-step costs both in play
    "full": dict(model=["model=tiny-llama", "model.name=serve-check-llama", "model.num_layers=4",
                        "model.hidden_size=256", "model.intermediate_size=768",
                        "model.num_heads=4", "model.num_kv_heads=2", "model.head_dim=64",
                        "model.vocab_size=4096", "model.max_model_len=1024"],
                 grid="cpu", repeats=3, requests=100, qps=4.0, prompt=(32, 512),
                 output=(8, 64), kv_blocks=2048),
    "toy": dict(model=["model=tiny-llama", "model.max_model_len=512"], grid="tiny", repeats=2,
                requests=12, qps=20.0, prompt=(16, 96), output=(2, 8), kv_blocks=256),
}

POLICIES = {"sarathi": ["scheduler=sarathi"], "vllm": ["scheduler=vllm"],
            "orca": ["scheduler=orca"], "request_level": ["scheduler=request_level"]}


def trace_overrides(s: dict, qps: float, requests: int, seed: int) -> list[str]:
    """The same requests for the client and the simulator: a generated trace (lengths and
    Poisson arrivals drawn from `seed`)."""
    (pl, ph), (ol, oh) = s["prompt"], s["output"]
    return ["trace=synthetic", f"trace.num_requests={requests}", f"trace.qps={qps}",
            "trace.prompt_len.dist=uniform", f"trace.prompt_len.low={pl}",
            f"trace.prompt_len.high={ph}", "trace.output_len.dist=uniform",
            f"trace.output_len.low={ol}", f"trace.output_len.high={oh}", f"seed={seed}"]


def model_value(model: list[str], key: str, default):
    for o in model:
        if o.startswith(f"model.{key}="):
            return o.split("=", 1)[1]
    return default


def run(argv: list[str], log: Path, **kw) -> None:
    with open(log, "w") as f:
        r = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode:
        raise SystemExit(f"serve_check: {' '.join(argv[:2])} failed (exit {r.returncode}); "
                         f"its output: {log}\n{log.read_text()[-2000:]}")


class Server:
    """`sarathi-lab-serve` in a subprocess on a free 127.0.0.1 port; `stop()` ends it with
    SIGINT (which writes its run directory) and returns that directory."""

    def __init__(self, overrides: list[str], out: Path, env: dict, timeout: float = 300):
        self.log = out / "served.log"
        self.proc = subprocess.Popen(
            [str(BIN / "sarathi-lab-serve"), "serve.port=0", "serve.host=127.0.0.1",
             f"hydra.run.dir={out / 'served'}", *overrides],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            self.url, _, self.lines = wait_for_address(self.proc, timeout)
        except RuntimeError as e:
            raise SystemExit(f"serve_check: the server did not start: {e}") from None

    def stop(self, timeout: float = 300) -> Path:
        self.proc.send_signal(signal.SIGINT)
        rest, _ = self.proc.communicate(timeout=timeout)
        text = "".join(self.lines) + rest
        Path(self.log).write_text(text)
        if self.proc.returncode:
            raise SystemExit(f"serve_check: the server exited {self.proc.returncode}:\n"
                             f"{text[-2000:]}")
        return Path(text.rsplit("run directory: ", 1)[1].split()[0])


def figures(run_dir: Path) -> dict:
    s = json.loads((run_dir / "summary.json").read_text())
    return {f"{m}_{q}" if q else m: (s[m][q] if q else s[m]) for m, q in METRICS}


def compare(client: dict, server: dict, sim: dict) -> pd.DataFrame:
    """Per metric: the three values; the simulation's and the server's relative error against
    what the client measured (the server's error is the serving path the client sees: HTTP,
    streaming, the event loop)."""
    rows = []
    for name in client:
        c, sv, sm = client[name], server[name], sim[name]
        rows.append({"metric": name, "client": c, "server": sv, "sim": sm,
                     "sim_error": sm / c - 1 if c else float("nan"),
                     "server_error": sv / c - 1 if c else float("nan")})
    return pd.DataFrame(rows)


def _kinds(it: pd.DataFrame, max_batch: int) -> dict:
    """An iterations table's steps by batch composition."""
    dec = (it["prefill_tokens"] == 0)
    pre = (it["decode_tokens"] == 0)
    out = {f"decode x{b}": it[dec & (it["num_requests"] == b)] for b in range(1, max_batch)}
    out[f"decode x{max_batch}+"] = it[dec & (it["num_requests"] >= max_batch)]
    out["prefill only"] = it[pre & ~dec]
    out["mixed"] = it[~pre & ~dec]
    return out


def steps(served: Path, sim: Path, max_batch: int = 4, offline: Path | None = None
          ) -> pd.DataFrame:
    """The served steps against the same steps offline, by batch composition: median duration
    of decode-only steps of 1, 2, ... requests, of prefill-only and of mixed steps, on each
    side, and the served one's excess (the goal of the engine process: within 5%). `offline`:
    the real executor's run of the same trace without the server (the same engine, model and
    requests; its steps measured in the same minutes); `sim`: the simulation's (the
    profile's)."""
    sides = {"served": served, **({"offline": offline} if offline else {}), "sim": sim}
    parts = {k: _kinds(pd.read_parquet(d / "iterations.parquet"), max_batch)
             for k, d in sides.items()}
    rows = []
    for k in parts["served"]:
        row = {"steps": k}
        for side, kinds in parts.items():
            d = kinds[k]["duration"]
            row[f"n_{side}"] = len(d)
            row[f"{side}_ms"] = d.median() * 1e3 if len(d) else float("nan")
            # the fastest tenth: what a step takes when nothing else took its core (a loaded
            # machine's preemptions lengthen the median, not this)
            row[f"{side}_p10_ms"] = d.quantile(0.1) * 1e3 if len(d) else float("nan")
        rows.append(row)
    t = pd.DataFrame(rows)
    for side in sides:
        if side != "served":
            t[f"served_vs_{side}"] = t["served_ms"] / t[f"{side}_ms"] - 1
            t[f"served_vs_{side}_p10"] = t["served_p10_ms"] / t[f"{side}_p10_ms"] - 1
    return t


def decode_gaps(run_dir: Path) -> pd.Series:
    """The time between two back-to-back decode-only steps (the later one's start minus the
    earlier one's end) of the same number of requests: nobody arrived or left between them,
    so the engine did not wait for work; what it did there is its own bookkeeping (the
    scheduling and update, `host_s`) and, served, the hand-off of the step's tokens."""
    it = pd.read_parquet(run_dir / "iterations.parquet")
    dec = (it["prefill_tokens"] == 0).to_numpy()
    n = it["num_requests"].to_numpy()
    gap = it["start"].to_numpy()[1:] - (it["start"] + it["duration"]).to_numpy()[:-1]
    same = dec[1:] & dec[:-1] & (n[1:] == n[:-1])
    return pd.Series(gap[same])


def steps_markdown(t: pd.DataFrame) -> str:
    if "offline_ms" not in t:
        return ("\n\nMedian step duration, served against the simulation (the profile):\n\n"
                "| steps | served (ms) | simulation (ms) | served vs sim | n served / sim |\n"
                "|---|---|---|---|---|\n" +
                "".join(f"| {r.steps} | {r.served_ms:.3f} | {r.sim_ms:.3f} | "
                        f"{r.served_vs_sim:+.1%} | {r.n_served} / {r.n_sim} |\n"
                        for r in t.itertuples()))
    return ("\n\nMedian step duration, served against the same engine offline (the real "
            "executor, no server) and the simulation (the profile); P10: the fastest tenth's "
            "bound, which a loaded machine's preemptions move less:\n\n"
            "| steps | served (ms) | offline (ms) | served vs offline | P10 served vs offline "
            "| simulation (ms) | served vs sim | n served / offline / sim |\n"
            "|---|---|---|---|---|---|---|---|\n" +
            "".join(f"| {r.steps} | {r.served_ms:.3f} | {r.offline_ms:.3f} | "
                    f"{r.served_vs_offline:+.1%} | {r.served_vs_offline_p10:+.1%} | "
                    f"{r.sim_ms:.3f} | {r.served_vs_sim:+.1%} | "
                    f"{r.n_served} / {r.n_offline} / {r.n_sim} |\n" for r in t.itertuples()))


def markdown(t: pd.DataFrame, info: dict) -> str:
    head = ("| metric | client (replay) | server | simulation | sim vs client | server vs "
            "client |\n|---|---|---|---|---|---|\n")
    def num(x, f):   # no server-side view of a server of the user's own
        return "—" if pd.isna(x) else format(x, f)
    body = "".join(f"| {r.metric} | {r.client:.4g} | {num(r.server, '.4g')} | {r.sim:.4g} | "
                   f"{r.sim_error:+.1%} | {num(r.server_error, '+.1%')} |\n"
                   for r in t.itertuples())
    return (f"# serve_check: {info['policy']}, {info['requests']} requests at {info['qps']} "
            f"req/s\n\nTimes in seconds (throughput in output tokens/s). Load average "
            f"{info['load_before']} before, {info['load_after']} after; {info['wall_s']:.0f} s."
            f"\n\n" + head + body)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--toy", action="store_true", help="a tiny model and trace (seconds)")
    ap.add_argument("--policy", choices=list(POLICIES), default="sarathi")
    ap.add_argument("--budget", type=int, default=128, help="sarathi's token budget")
    ap.add_argument("--qps", type=float, default=None)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", help="reuse a profile of the model (.parquet) instead of "
                    "measuring one")
    ap.add_argument("--out", default=str(REPO / "results" / "serve_check"))
    ap.add_argument("--base-url", help="an OpenAI-compatible endpoint of your own (vLLM, "
                    "SGLang, ...) instead of starting sarathi-lab-serve; needs --served-model, "
                    "--profile and the overrides that make the simulator like it (README)")
    ap.add_argument("--served-model", help="with --base-url: the model name it serves")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the simulator (and the "
                    "server started here), after the study's own, e.g. model.path=DIR "
                    "model.name=smollm2 scheduler.max_num_seqs=64")
    a = ap.parse_args(argv)
    if a.base_url and not (a.served_model and a.profile):
        ap.error("--base-url needs --served-model NAME and --profile PATH (a profile of that "
                 "model on that GPU: sarathi-lab-profile --grid gpu)")
    s = SCALES["toy" if a.toy else "full"]
    qps = a.qps if a.qps is not None else s["qps"]
    requests = a.requests if a.requests is not None else s["requests"]
    if qps <= 0 or requests < 1:
        ap.error("--qps must be > 0 and --requests >= 1")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for d in ("replay", "served", "offline", "sim"):   # a rerun replaces the previous runs
        shutil.rmtree(out / d, ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
           "HF_HUB_OFFLINE": "1"}
    if any(o.startswith("model=") for o in a.overrides):   # the user's model, not the study's
        s = {**s, "model": []}
    policy = [*POLICIES[a.policy], *([f"scheduler.token_budget={a.budget}"]
                                      if a.policy == "sarathi" else [])]
    # the same engine for the server and the simulator: model, policy, KV cache, one thread
    engine = [*s["model"], *policy, f"scheduler.num_kv_blocks={s['kv_blocks']}",
              "num_threads=1", "progress=false", *a.overrides]
    load_before = os.getloadavg()[0]
    loads = {}   # the 1-minute load average before and after each phase (a loaded machine's
    # figures are not a quiet one's: they are reported beside each other)

    def phase(name: str, before: float) -> None:
        loads[name] = [round(before, 2), round(os.getloadavg()[0], 2)]
    t0 = time.monotonic()
    profile = Path(a.profile) if a.profile else out / "profile.parquet"
    if not a.profile:
        before = os.getloadavg()[0]
        # on the wall clock, as the server's steps are timed (executor.clock=wall below)
        run([str(BIN / "sarathi-lab-profile"), *s["model"], "executor.clock=wall",
             "--grid", s["grid"],
             "--repeats", str(s["repeats"]), "--threads", "1", "--no-progress",
             "--out", str(profile)], out / "profile.log", env=env)
        phase("profile", before)
    trace = trace_overrides(s, qps, requests, a.seed)
    model = [*s["model"], *a.overrides]
    replay = [str(BIN / "sarathi-lab-replay"), "--model",
              a.served_model or model_value(model, "name", "tiny-llama"),
              "--vocab-size", model_value(model, "vocab_size", "512"),
              "--out", str(out / "replay"), *trace]
    if a.base_url:   # the user's own server: nothing started, no server-side view
        run([*replay, "--base-url", a.base_url], out / "replay.log", env=env)
        served = None
    else:
        before = os.getloadavg()[0]
        server = Server([*engine, "executor.clock=wall"], out, env)
        try:
            run([*replay, "--base-url", server.url], out / "replay.log", env=env)
        finally:
            served = server.stop()
        phase("served", before)
        # the same engine on the same requests without the server, right after: its steps
        # are the served steps' reference (the profile is measured on other batches)
        before = os.getloadavg()[0]
        run([str(BIN / "sarathi-lab"), *engine, "executor=torch", "executor.clock=wall",
             *trace, f"hydra.run.dir={out / 'offline'}"], out / "offline.log", env=env)
        phase("offline", before)
    # the profile was measured on this CPU: a hardware preset named as its device (the profiled
    # cost model prices every operator from the profile; KV is sized by num_kv_blocks above)
    run([str(BIN / "sarathi-lab"), *engine, "executor=sim", "executor.cost_model=profiled",
         f"executor.profile={profile}", "hardware=h200", "hardware.name=cpu", *trace,
         f"hydra.run.dir={out / 'sim'}"],
        out / "sim.log", env=env)
    client = figures(out / "replay")
    table = compare(client, figures(served) if served else dict.fromkeys(client, float("nan")),
                    figures(out / "sim"))
    info = {"policy": " ".join(policy), "requests": requests, "qps": qps,
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
            "wall_s": time.monotonic() - t0, "loads": loads,
            "served_dir": os.path.relpath(served, out) if served else None,
            "endpoint": a.base_url or "sarathi-lab-serve (started here)",
            "overrides": a.overrides}
    table.to_csv(out / "serve_check.csv", index=False)
    text = markdown(table, info)
    if served:   # the steps, where the server is ours
        st = steps(served, out / "sim", offline=out / "offline")
        st.to_csv(out / "steps.csv", index=False)
        gaps = {k: decode_gaps(d) for k, d in (("served", served), ("offline", out / "offline"))}
        info["decode_gap_ms"] = {k: {"median": g.median() * 1e3, "n": len(g)}
                                 for k, g in gaps.items()}
        text += steps_markdown(st) + (
            "\nBetween two back-to-back decode steps (median): served "
            f"{gaps['served'].median() * 1e3:.3f} ms (n={len(gaps['served'])}), offline "
            f"{gaps['offline'].median() * 1e3:.3f} ms (n={len(gaps['offline'])}).\n"
            f"\nLoad average (1 min) before and after: served (with the replay client) "
            f"{loads['served'][0]} -> {loads['served'][1]}, offline {loads['offline'][0]} -> "
            f"{loads['offline'][1]}.\n")
    (out / "serve_check.md").write_text(text)
    (out / "serve_check.json").write_text(json.dumps(info, indent=1))
    print(text)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
