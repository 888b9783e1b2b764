"""Model context limits in capacity searches (never a silent capacity of 0), a random sample of a
trace (`trace.shuffle`), and a capacity multirun over policies that read different settings."""
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from helpers import patience

from sarathi_lab.run.config import without_unread
from sarathi_lab.settings import ConfigError
from sarathi_lab.sweeps.capacity import check_context, never_served
from sarathi_lab.traces import load_trace, parse_trace_config

CLI = [sys.executable, "-c", "from sarathi_lab.cli.main import main; main()"]
ENV = {**os.environ, "WANDB_MODE": "disabled"}


def test_never_served_follows_the_engine_rules():
    prompt, output = np.array([10, 15, 16, 12, 14]), np.array([5, 1, 0, 5, 0])
    # max_model_len 16: 16 + 1 leaves no room for a token (rejected even with overlong=cap);
    # 12 + 5 = 17 > 16 is rejected only with overlong=reject; an output of 0 runs as 1 token
    assert never_served(prompt, output, 16, "reject").tolist() == [False, False, True, True,
                                                                   False]
    assert never_served(prompt, output, 16, "cap").tolist() == [False, False, True, False, False]


def compose(overrides):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "experiments"))
    try:
        from studies import compose as study_compose
    finally:
        sys.path.pop(0)
    return study_compose(overrides)


def test_capacity_refuses_requests_beyond_the_context_and_says_what_to_do():
    from sarathi_lab.traces import build_trace
    c = compose(["mode=capacity", "model=yi-34b", "executor.tensor_parallel=2",
                 "slo=yi-34b-strict", "trace.num_requests=100"])
    trace = build_trace(c["trace"])
    total = trace["num_prompt_tokens"] + trace["num_output_tokens"]
    over = int((total > 4096).sum())
    assert over > 0    # the head of ShareGPT-4 holds requests beyond Yi-34B's 4,096 tokens
    with pytest.raises(ConfigError) as e:
        check_context(c, trace)
    msg = str(e.value)
    assert f"{over} of the 100 requests" in msg and "max_model_len=4096" in msg
    for remedy in ("model.max_model_len", "trace.max_total_tokens=4096", "overlong=cap"):
        assert remedy in msg
    # raising the context lets the search go ahead
    check_context(compose(["mode=capacity", "model=yi-34b", "executor.tensor_parallel=2",
                           "model.max_model_len=8192", "trace.num_requests=100"]), trace)
    # overlong=cap serves the overlong ones cut short: only prompts with no room stay refused
    cap = compose(["mode=capacity", "model=yi-34b", "executor.tensor_parallel=2",
                   "trace.num_requests=100", "overlong=cap"])
    no_room = int((trace["num_prompt_tokens"] + 1 > 4096).sum())
    assert 0 < no_room < over
    with pytest.raises(ConfigError, match=f"{no_room} of the 100 requests"):
        check_context(cap, trace)


@pytest.mark.slow   # a CLI subprocess
def test_capacity_search_from_the_cli_fails_fast_and_records_drops(tmp_path):
    base = [*CLI, "mode=capacity", "model=yi-34b", "executor.tensor_parallel=2",
            "slo=yi-34b-strict", "trace.num_requests=40", "capacity.max_probes=2",
            f"results_root={tmp_path}"]
    r = subprocess.run([*base, f"hydra.run.dir={tmp_path}/a"], env=ENV, capture_output=True,
                       text=True, timeout=patience(300))
    assert r.returncode == 1
    assert "do not fit max_model_len=4096" in r.stderr and "trace.max_total_tokens" in r.stderr
    assert not (tmp_path / "a" / "capacity.json").exists()
    # dropping them: the search runs, on 40 requests that fit, and says how many were dropped
    r = subprocess.run([*base, f"hydra.run.dir={tmp_path}/b", "trace.max_total_tokens=4096"],
                       env=ENV, capture_output=True, text=True, timeout=patience(300))
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "b" / "capacity.json").read_text())
    head = load_trace("sharegpt", num_requests=None, qps=1.0)
    total = (head["num_prompt_tokens"] + head["num_output_tokens"]).to_numpy()
    # steady-state probes draw lengths from the whole trace: every request that fits, and the
    # whole trace's longer ones dropped
    assert res["rule"] == "steady"
    assert res["num_requests"] == int((total <= 4096).sum())
    assert res["trace_dropped"] == int((total > 4096).sum()) > 0
    assert f"{res['trace_dropped']} longer ones dropped" in r.stdout


def rows(df):
    return sorted(zip(df["num_prompt_tokens"], df["num_output_tokens"]))


def test_shuffle_takes_a_seeded_random_sample(tmp_path):
    path = tmp_path / "lengths.csv"
    pd.DataFrame({"num_prefill_tokens": [10, 20, 30, 40, 50, 60],
                  "num_decode_tokens": [1, 2, 3, 4, 5, 6]}).to_csv(path, index=False)
    head = load_trace(path, num_requests=3, qps=1.0)
    assert head["num_prompt_tokens"].tolist() == [10, 20, 30]
    orders = {tuple(load_trace(path, qps=1.0, shuffle=True, seed=s)["num_prompt_tokens"])
              for s in range(6)}
    # every seed gives all six rows (each prompt with its own output), in its own order
    for order in orders:
        assert sorted(order) == [10, 20, 30, 40, 50, 60]
    assert len(orders) > 1
    a = load_trace(path, num_requests=3, qps=1.0, shuffle=True, seed=4)
    b = load_trace(path, num_requests=3, qps=1.0, shuffle=True, seed=4)
    pd.testing.assert_frame_equal(a, b)                        # same seed, same sample
    assert all(p == 10 * o for p, o in rows(a))                # rows stay whole
    # the filters drop the long ones wherever they fall, and say how many
    f = load_trace(path, qps=1.0, shuffle=True, seed=1, max_total_tokens=44)
    assert sorted(f["num_prompt_tokens"]) == [10, 20, 30, 40] and f.attrs["dropped"] == 2


def test_shuffle_is_refused_where_it_means_nothing():
    with pytest.raises(ValueError, match="trace.shuffle"):
        load_trace("azure_conv", num_requests=5, qps=1.0, shuffle=True)
    with pytest.raises(ConfigError, match="shuffle"):
        parse_trace_config({"path": None, "num_requests": 5, "qps": 1.0, "prompt_len": 8,
                            "output_len": 4, "shuffle": True})


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_a_seed_sweep_samples_different_requests_from_the_cli(tmp_path):
    lens = []
    for seed in (0, 1):
        d = tmp_path / f"s{seed}"
        r = subprocess.run([*CLI, "trace.shuffle=true", "trace.num_requests=20", f"seed={seed}",
                            f"hydra.run.dir={d}"], env=ENV, capture_output=True, text=True,
                           timeout=patience(300))
        assert r.returncode == 0, r.stderr
        s = json.loads((d / "summary.json").read_text())
        assert s["config"]["trace"]["shuffle"] is True
        lens.append(pd.read_parquet(d / "requests.parquet")["num_prompt_tokens"].tolist())
    assert lens[0] != lens[1]
    full = set(load_trace("sharegpt", qps=1.0)["num_prompt_tokens"])
    assert set(lens[0]) <= full and set(lens[1]) <= full


def test_without_unread_removes_exactly_the_noted_settings():
    c = {"scheduler": {"name": "vllm", "token_budget": 512, "max_num_seqs": 64},
         "cluster": {"num_replicas": 1, "load": "tokens"}, "seed": 0}
    out = without_unread(c, ["scheduler.token_budget: not read by policy 'vllm'",
                             "cluster.load: read only with cluster.num_replicas > 1 (a fleet)"])
    assert out == {"scheduler": {"name": "vllm", "max_num_seqs": 64},
                   "cluster": {"num_replicas": 1}, "seed": 0}
    assert c["scheduler"]["token_budget"] == 512   # the original is untouched


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_capacity_multirun_over_policies_with_a_budget_only_sarathi_reads(tmp_path):
    r = subprocess.run([*CLI, "-m", f"results_root={tmp_path}", "name=cap", "mode=capacity",
                        "scheduler=vllm,sarathi", "scheduler.token_budget=256",
                        "trace.num_requests=30", "capacity.max_probes=2"], env=ENV,
                       capture_output=True, text=True, timeout=patience(300))
    assert r.returncode == 0, r.stdout + r.stderr
    found = {}
    for p in (tmp_path / "sweeps" / "cap").glob("*/capacity.json"):
        res = json.loads(p.read_text())
        found[res["policy"]] = res["config"]["scheduler"].get("token_budget")
    # vLLM ran without the budget it does not read; Sarathi with it
    assert found == {"vllm": None, "sarathi": 256}
