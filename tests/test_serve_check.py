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
