"""Sim vs server (experiments/serve_check/run.py): its comparison computed by hand, and the whole
check at toy scale — a profile, sarathi-lab-serve in a subprocess on a free 127.0.0.1 port
(stopped by the study), sarathi-lab-replay against it, the simulation — in seconds."""
import importlib.util
import json

import pandas as pd
import pytest
from helpers import ROOT

spec = importlib.util.spec_from_file_location("serve_check_run",
                                              ROOT / "experiments" / "serve_check" / "run.py")
S = importlib.util.module_from_spec(spec)
spec.loader.exec_module(S)


def test_compare_by_hand():
    t = S.compare({"ttft_p50": 0.2, "tbt_p99": 0.05}, {"ttft_p50": 0.15, "tbt_p99": 0.05},
                  {"ttft_p50": 0.25, "tbt_p99": 0.04})
    r = t.set_index("metric")
    assert r.loc["ttft_p50", "sim_error"] == pytest.approx(0.25 / 0.2 - 1)       # +25%
    assert r.loc["ttft_p50", "server_error"] == pytest.approx(0.15 / 0.2 - 1)    # -25%
    assert r.loc["tbt_p99", "sim_error"] == pytest.approx(-0.2)
    assert r.loc["tbt_p99", "server_error"] == 0
    md = S.markdown(t, {"policy": "scheduler=vllm", "requests": 2, "qps": 1.0,
                        "load_before": 0.5, "load_after": 0.6, "wall_s": 3.0})
    assert "| ttft_p50 | 0.2 | 0.15 | 0.25 | +25.0% | -25.0% |" in md


def test_steps_by_hand(tmp_path):
    """Median step durations by batch composition, each side's: decode-only steps of 1 and 2
    requests, prefill-only, mixed; the served side's excess over the simulation's."""
    def its(rows):   # (prefill tokens, decode tokens, requests, duration s)
        return pd.DataFrame(rows, columns=["prefill_tokens", "decode_tokens", "num_requests",
                                           "duration"])
    for name, rows in (("served", [(0, 1, 1, 0.004), (0, 1, 1, 0.006), (0, 1, 1, 0.005),
                                   (0, 2, 2, 0.008), (32, 0, 1, 0.02), (16, 1, 2, 0.012)]),
                       ("sim", [(0, 1, 1, 0.004), (0, 2, 2, 0.0064), (32, 0, 1, 0.02),
                                (16, 1, 2, 0.01), (16, 1, 2, 0.014)])):
        (tmp_path / name).mkdir()
        its(rows).to_parquet(tmp_path / name / "iterations.parquet")
    t = S.steps(tmp_path / "served", tmp_path / "sim", max_batch=3).set_index("steps")
    assert t.loc["decode x1", "served_ms"] == pytest.approx(5.0)   # median of 4, 6, 5
    assert t.loc["decode x1", "served_vs_sim"] == pytest.approx(0.25)
    assert t.loc["decode x2", "served_vs_sim"] == pytest.approx(0.25)   # 8 against 6.4
    assert t.loc["prefill only", "served_vs_sim"] == pytest.approx(0)
    assert t.loc["mixed", "sim_ms"] == pytest.approx(12.0)
    assert (t.loc["decode x3+", ["n_served", "n_sim"]] == 0).all()
    assert "| decode x1 | 5.000 | 4.000 | +25.0% | 3 / 1 |" in S.steps_markdown(t.reset_index())


def test_trace_overrides_are_the_same_requests_for_client_and_simulator():
    o = S.trace_overrides(S.SCALES["toy"], 5.0, 7, 3)
    assert "trace=synthetic" in o and "trace.num_requests=7" in o and "trace.qps=5.0" in o
    assert "seed=3" in o


@pytest.mark.slow
def test_toy_study_serves_replays_and_simulates_the_same_requests(tmp_path):
    S.main(["--toy", "--out", str(tmp_path)])
    t = pd.read_csv(tmp_path / "serve_check.csv")
    assert list(t["metric"]) == [f"{m}_{q}" if q else m for m, q in S.METRICS]
    n = S.SCALES["toy"]["requests"]
    replay = pd.read_parquet(tmp_path / "replay" / "requests.parquet")
    sim = pd.read_parquet(tmp_path / "sim" / "requests.parquet")
    info = json.loads((tmp_path / "serve_check.json").read_text())
    served = json.loads((tmp_path / info["served_dir"] / "summary.json").read_text())
    assert len(replay) == len(sim) == n and served["num_finished"] == n
    assert (replay["status"] == "finished").all()
    # the same requests: the client asked for what the simulator served
    assert sorted(replay["num_prompt_tokens"]) == sorted(sim["num_prompt_tokens"])
    assert sorted(replay["num_output_tokens"]) == sorted(sim["num_output_tokens"])
    # every output token reached the client: throughput is set by the load on all three sides
    thr = t.set_index("metric").loc["throughput_tok_s"]
    assert thr["sim_error"] == pytest.approx(0, abs=0.25)
    assert thr["server_error"] == pytest.approx(0, abs=0.25)
