"""sarathi-lab-plan on the steady-state rule (issue 35): a load no probe can represent is
refused, an undetermined probe is never feasible, a cut-short result.json names itself, the
cost per 1M output tokens by hand with the GPU count, and the long check of the cheapest."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sarathi_lab.plan import cli as plan_cli
from sarathi_lab.plan import search
from sarathi_lab.sweeps.bookkeeping import compose_config

TESTS = Path(__file__).resolve().parent
OUT = 100   # every request's output tokens (a fixed length: the mean by hand)
# 150 measured requests a probe (the default 1,000 makes the long check 10 x 1,468 requests;
# 150 also fits the 200-request cap below)
BASE = ["model=llama-3-8b", "trace=synthetic", "trace.num_requests=50",
        f"trace.output_len={OUT}", "trace.prompt_len=200", "capacity.min_requests=150"]
SPACE = ["plan.space.hardware=[a100-80gb]", "plan.space.layout.tensor_parallel=[2]",
         "plan.space.policy=[sarathi]", "plan.space.token_budget=[512]",
         "plan.space.max_replicas=2", "plan.backend=serial"]


def plan_cmd(*args, tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-c", "from sarathi_lab.plan.cli import console; console()",
         *BASE, *SPACE, f"results_root={tmp_path}", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow   # a CLI subprocess
def test_a_load_the_trace_cannot_represent_is_refused_through_the_cli(tmp_path):
    r = plan_cmd("plan.load_qps=1e9", "trace.num_requests=30", tmp_path=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "plan.load_qps=1e+09" in r.stderr and "capacity.max_requests" in r.stderr
    assert not list(tmp_path.rglob("plan.parquet"))


@pytest.mark.slow   # a CLI subprocess
def test_an_undetermined_probe_is_never_feasible_through_the_cli(tmp_path):
    # every probe too short to tell (1,000 latencies asked, no lengthening): no candidate is
    # feasible, and the table says why
    r = plan_cmd("plan.load_qps=1", "capacity.time_constants=1000", "capacity.max_extensions=0",
                 "capacity.max_requests=200", tmp_path=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    df = pd.read_parquet(next(tmp_path.rglob("plan.parquet")))
    assert (df["status"] != "feasible").all()
    evals = [json.loads(p.read_text()) for p in tmp_path.rglob("units=*.json")]
    assert evals and all(not e["passes"] and e["probe"]["stability"] == "undetermined"
                         for e in evals)


def test_a_cut_short_result_names_its_file(tmp_path, capsys):
    args = BASE + SPACE + ["plan.load_qps=2", f"results_root={tmp_path}"]
    c = compose_config(args, "plan")
    base = [a for a in args if not a.startswith(plan_cli.PLAN_KEYS)]
    jobs, _ = search.prepare(c["plan"], base, plan_cli.plan_dir(c), log=lambda *a: None)
    path = Path(jobs[0]["dir"]) / "result.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"status": "feasi')
    assert plan_cli.main(args) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "not a complete JSON file" in err


@pytest.mark.slow   # one candidate's searches and its long check (~1 min)
def test_cost_per_million_tokens_by_hand_with_the_gpu_count(tmp_path, capsys):
    load, price = 2.0, 1.5   # req/s; $/GPU-hour (plan.price_overrides)
    args = BASE + SPACE + [f"plan.load_qps={load}", f"+plan.price_overrides.a100-80gb={price}",
                           f"results_root={tmp_path}"]
    assert plan_cli.main(args) == 0
    out = capsys.readouterr().out
    df = pd.read_parquet(next(tmp_path.rglob("plan.parquet")))
    row = df[df["status"] == "feasible"].iloc[0]
    # TP2: two GPUs a replica
    assert row["gpus"] == 2 * row["replicas"] and row["gpus"] >= 2
    # $ per 1M output tokens = price x GPUs / 3600 s / (load x output tokens a request) x 1e6
    by_hand = price * row["gpus"] / 3600 / (load * OUT) * 1e6
    assert row["usd_per_1m_output_tokens"] == pytest.approx(by_hand, rel=1e-12)
    assert row["usd_per_hour"] == pytest.approx(price * row["gpus"])
    # the default judge has a TTFT target, said in the SLO's name and in every command
    assert "slo.ttft=2.0" in row["command"] and "+ttft2s" in row["command"]
    assert row["ttft_p99"] > 0
    # the long check: 10 x the requests of the probe that passed at the load, held, printed
    assert row["check_factor"] == 10 and row["check_requests"] == 10 * row["probe_requests"]
    assert row["probe_stability"] == "stable" and bool(row["check_held"])
    assert "trace.num_requests=" in row["check_command"] and "mode=run" in row["check_command"]
    assert row["check_command"] in out and "held" in out
