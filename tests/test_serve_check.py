"""Sim vs server (experiments/serve_check/run.py): its comparison computed by hand, and the whole
check at toy scale — a profile, sarathi-lab-serve in a subprocess on a free 127.0.0.1 port
(stopped by the study), sarathi-lab-replay against it, the simulation — in seconds."""
import importlib.util
import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from helpers import ROOT, patience

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


def test_steps_against_offline_and_the_gaps_by_hand(tmp_path):
    """With the offline run: the served steps' excess over the same steps offline, by hand;
    the gaps between back-to-back decode steps of one batch size, and no others."""
    def its(rows):   # (start s, duration s, prefill tokens, decode tokens, requests)
        return pd.DataFrame(rows, columns=["start", "duration", "prefill_tokens",
                                           "decode_tokens", "num_requests"])
    sides = {"served": [(0.0, 0.004, 32, 0, 1), (0.005, 0.002, 0, 1, 1),
                        (0.0075, 0.0021, 0, 1, 1), (0.0100, 0.0022, 0, 1, 1),
                        (0.0130, 0.003, 0, 2, 2), (0.0200, 0.003, 0, 2, 2)],
             "offline": [(0.0, 0.004, 32, 0, 1), (0.0041, 0.002, 0, 1, 1),
                         (0.0062, 0.002, 0, 1, 1), (0.0083, 0.0025, 0, 2, 2)],
             "sim": [(0.0, 0.004, 32, 0, 1), (0.004, 0.0015, 0, 1, 1)]}
    for name, rows in sides.items():
        (tmp_path / name).mkdir()
        its(rows).to_parquet(tmp_path / name / "iterations.parquet")
    t = S.steps(tmp_path / "served", tmp_path / "sim", max_batch=3,
                offline=tmp_path / "offline").set_index("steps")
    assert t.loc["decode x1", "served_ms"] == pytest.approx(2.1)   # median of 2, 2.1, 2.2
    assert t.loc["decode x1", "served_vs_offline"] == pytest.approx(0.05)   # 2.1 against 2
    assert t.loc["decode x1", "served_vs_sim"] == pytest.approx(0.4)   # 2.1 against 1.5
    assert t.loc["decode x2", "served_vs_offline"] == pytest.approx(0.2)    # 3 against 2.5
    assert t.loc["prefill only", "served_vs_offline"] == pytest.approx(0)
    # P10 by linear interpolation: served 2 + 0.2 * (2.1 - 2) = 2.02 ms, offline 2
    assert t.loc["decode x1", "served_p10_ms"] == pytest.approx(2.02)
    assert t.loc["decode x1", "served_vs_offline_p10"] == pytest.approx(0.01)
    md = S.steps_markdown(t.reset_index())
    assert "| decode x1 | 2.100 | 2.000 | +5.0% | +1.0% | 1.500 | +40.0% | 3 / 2 / 1 |" in md
    # served: x1 -> x1 twice (7.5 - 7 ms, 10 - 9.6 ms), x2 -> x2 once (20 - 16 ms); the
    # prefill -> decode and x1 -> x2 pairs are left out
    assert list(S.decode_gaps(tmp_path / "served")) == pytest.approx([0.0005, 0.0004, 0.004])
    assert list(S.decode_gaps(tmp_path / "offline")) == pytest.approx([0.0001])


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
    offline = pd.read_parquet(tmp_path / "offline" / "requests.parquet")
    assert len(replay) == len(sim) == len(offline) == n and served["num_finished"] == n
    assert sorted(offline["num_output_tokens"]) == sorted(sim["num_output_tokens"])
    steps = pd.read_csv(tmp_path / "steps.csv")
    assert steps["n_offline"].sum() > 0 and set(info["loads"]) == {"profile", "served",
                                                                    "offline"}
    assert (replay["status"] == "finished").all()
    # the same requests: the client asked for what the simulator served
    assert sorted(replay["num_prompt_tokens"]) == sorted(sim["num_prompt_tokens"])
    assert sorted(replay["num_output_tokens"]) == sorted(sim["num_output_tokens"])
    # every output token reached the client: throughput is set by the load on all three sides
    thr = t.set_index("metric").loc["throughput_tok_s"]
    assert thr["sim_error"] == pytest.approx(0, abs=0.25)
    assert thr["server_error"] == pytest.approx(0, abs=0.25)


@pytest.mark.slow
def test_step_gap_measures_each_side():
    """experiments/serve_check/step_gap.py as a user runs it: offline, the worker without and
    with the pipe, each a decode step and a gap; the pipe's send timed."""
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "serve_check" /
                                               "step_gap.py"),
                           "--requests", "2", "--tokens", "6", "--rounds", "1"],
                          capture_output=True, text=True, timeout=patience(300),
                          env={**os.environ, "WANDB_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("round 1")]
    assert [ln.split(":")[0].split()[2] for ln in lines] == ["offline", "no", "pipe"]
    assert ", send " in lines[2] and ", send " not in lines[1]
    assert "worker's own loop" in lines[1]
