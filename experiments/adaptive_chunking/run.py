"""Adaptive chunking: the best static token budget against the budget controllers (tbt_target,
slack, slo_dp) on one workload under a strict SLO (issue 25, item 4, at toy scale).

    python experiments/adaptive_chunking/run.py [--toy] [--out DIR]
                                                (DIR default: results/adaptive_chunking)

Mistral-7B on one simulated A100-80GB, `trace=mix` (interactive chat, a heavy tenant's long
prompts, a batch summarization job in bursts), SLO `chat-batch` made strict for the interactive
class: TTFT 2.5 s and each request's own P99 TBT 0.1 s (in place of a 0.15 s TPOT). Static
budgets 256 .. 2048; the controllers capped at 2048 (`scheduler.token_budget`), their TBT target
the SLO's. Writes DIR/adaptive_chunking.csv (every run) and DIR/adaptive_chunking.md (per load:
the best static budget by goodput, then each controller).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
from studies import compose  # noqa: E402

STRICT = ["slo=chat-batch", "slo.classes.interactive.tpot=null",
          "slo.classes.interactive.request_p99_tbt=0.1"]
BASE = ["model=mistral-7b", "hardware=a100-80gb", "trace=mix", "progress=false", *STRICT]
STATIC = (256, 512, 1024, 2048)
CONTROLLERS = ("tbt_target", "slack", "slo_dp")
SCALES = {"test": dict(requests=40, loads=(3.0,)),   # the suite's check (tests/test_controllers.py)
          "toy": dict(requests=120, loads=(2.0, 3.0)),
          "full": dict(requests=1000, loads=(1.0, 2.0, 3.0, 4.0))}


def configs():
    """(label, overrides) of every configuration compared."""
    for b in STATIC:
        yield f"static {b}", [f"scheduler.token_budget={b}"]
    for c in CONTROLLERS:
        yield c, ["scheduler.token_budget=2048", f"scheduler.controller={c}"]


def one(overrides: list[str], run_dir: Path) -> dict:
    from sarathi_lab.runner import run
    s = run(compose([*BASE, *overrides]), run_dir)
    return {"attainment": s["slo"]["attainment"], "goodput_rps": s["slo"]["goodput_rps"],
            "p99_tbt_s": s["tbt"]["p99"], "p99_ttft_s": s["ttft"]["p99"],
            "throughput_rps": s["throughput_rps"],
            "relegated": s.get("relegated", {}).get("num_relegated", 0),
            "relegated_finished": s.get("relegated", {}).get("num_finished", 0),
            "max_prefill_tokens": int(pd.read_parquet(run_dir / "iterations.parquet")
                                      ["prefill_tokens"].max())}


def study(out: Path, scale: str = "toy", log=print) -> pd.DataFrame:
    scale = SCALES[scale]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for qps in scale["loads"]:
            for label, ov in configs():
                ov = [*ov, f"trace.num_requests={scale['requests']}", f"trace.qps={qps}"]
                row = {"qps": qps, "config": label,
                       **one(ov, Path(tmp) / f"{qps}_{label.replace(' ', '_')}")}
                log(row)
                rows.append(row)
    df = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "adaptive_chunking.csv", index=False)
    (out / "adaptive_chunking.md").write_text(table(df))
    return df


def table(df: pd.DataFrame) -> str:
    """Per load: the best static budget (by goodput, then attainment), then each controller."""
    lines = ["| load (req/s) | config | goodput (req/s) | attainment | P99 TBT | P99 TTFT | "
             "relegated |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for qps, g in df.groupby("qps"):
        static = g[g["config"].str.startswith("static")]
        best = static.sort_values(["goodput_rps", "attainment"], ascending=False).iloc[:1]
        for _, r in pd.concat([best, g[~g["config"].str.startswith("static")]]).iterrows():
            name = f"best static ({r['config'].split()[1]})" if r["config"].startswith("static") \
                else r["config"]
            lines.append(f"| {qps:g} | {name} | {r['goodput_rps']:.2f} | {r['attainment']:.1%} | "
                         f"{r['p99_tbt_s'] * 1e3:.0f} ms | {r['p99_ttft_s']:.2f} s | "
                         f"{r['relegated']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--toy", action="store_true", help="120 requests at 2 and 3 req/s")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = Path(a.out or ROOT / "results" / "adaptive_chunking")
    study(out, "toy" if a.toy else "full")
    print((out / "adaptive_chunking.md").read_text())
