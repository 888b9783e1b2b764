"""The serving-economics studies (experiments/admission, priorities, fairness) at toy scale:
each preset's sweep through the command line, then its analysis script, and what the study
claims checked on the toy run; the scripts' own figures checked by hand."""
import importlib.util
import json

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT, cli, composed

from sarathi_lab.cli.main import check_config

STUDIES = ("admission", "priorities", "fairness")


def study(name):
    """experiments/<name>/analyze.py as a module."""
    path = ROOT / "experiments" / name / "analyze.py"
    spec = importlib.util.spec_from_file_location(f"study_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sweep(tmp_path, name, *overrides):
    r = cli("-m", f"results_root={tmp_path}", f"experiment={name}", *overrides, cwd=tmp_path,
            timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp_path / "sweeps" / name


@pytest.mark.parametrize("name", STUDIES)
def test_presets_are_valid_and_run_scripts_call_them(name):
    check_config(composed(f"experiment={name}"))
    run = (ROOT / "experiments" / name / "run.sh").read_text()
    assert f"experiment={name}" in run and f"experiments/{name}/analyze.py" in run


def test_admission_rule_labels_and_capacity_by_hand():
    adm = study("admission")
    assert adm.rule({"max_queue_len": None, "deadline_admission": False}) == "none"
    assert adm.rule({"max_queue_len": 5, "deadline_admission": True}) == "queue <= 5 + deadline"
    df = pd.DataFrame({"qps": [1, 2, 3, 3, 4], "attainment_target": 0.9,
                       "admission": ["none", "none", "none", "deadline", "deadline"],
                       "attainment": [1.0, 0.95, 0.5, 0.97, 0.95]})
    assert adm.capacity(df) == 2       # only the runs without control count
    assert adm.capacity(df.assign(attainment=0.1)) is None


@pytest.mark.slow   # a study at toy scale
def test_admission_study_toy(tmp_path):
    d = sweep(tmp_path, "admission", "trace.num_requests=60", "trace.qps=1.0,8.0",
              "scheduler.max_queue_len=null", "scheduler.deadline_admission=false,true")
    out = tmp_path / "res"
    study("admission").main(d, out)
    df = pd.read_csv(out / "admission.csv").set_index(["qps", "admission"])
    assert len(df) == 4 and (out / "goodput_ttft.png").stat().st_size > 0
    low, high = df.loc[1.0], df.loc[8.0]
    assert (low["rejected"] == 0).all()
    assert low.loc["none", "goodput_rps"] == low.loc["deadline", "goodput_rps"]
    # past capacity: deadline admission refuses, and what it serves is faster, more of it on time
    assert high.loc["none", "rejected"] == 0 < high.loc["deadline", "rejected"]
    assert high.loc["deadline", "ttft_p99_s"] < high.loc["none", "ttft_p99_s"]
    assert high.loc["deadline", "goodput_rps"] > high.loc["none", "goodput_rps"]
    # goodput in tokens by hand from the run's requests (TTFT <= 2.5 s, TPOT <= 0.15 s)
    run = next(p for p in d.iterdir() if "deadline_admission=True" in p.name and "qps=8.0" in p.name)
    req = pd.read_parquet(run / "requests.parquet")
    s = json.loads((run / "summary.json").read_text())
    met = (req["status"] == "finished") & (req["ttft"] <= 2.5) & (req["tpot"].fillna(0) <= 0.15)
    tok = (req["num_prompt_tokens"] + req["num_output_tokens"])[met].sum() / s["makespan_s"]
    assert high.loc["deadline", "goodput_tok_s"] == pytest.approx(tok)
    assert high.loc["deadline", "prompt_mean_rejected"] == pytest.approx(
        req.loc[req["status"] == "rejected", "num_prompt_tokens"].mean())


@pytest.mark.slow   # a study at toy scale
def test_priorities_study_toy(tmp_path):
    d = sweep(tmp_path, "priorities", "trace.num_requests=80", "scheduler=sarathi,sarathi_priority",
              "trace.components.batch.qps=3.0", "scheduler.aging_rate=0.0")
    out = tmp_path / "res"
    study("priorities").main(d, out)
    df = pd.read_csv(out / "priorities.csv").set_index("policy")
    assert set(df.index) == {"sarathi", "sarathi_priority (aging 0/s)"}
    assert (out / "classes.png").stat().st_size > 0
    fcfs, prio = df.loc["sarathi"], df.loc["sarathi_priority (aging 0/s)"]
    # overloaded by the batch job: FCFS makes chat wait behind it, priorities do not
    assert prio["chat_ttft_p99_s"] < 2.5 < fcfs["chat_ttft_p99_s"]
    assert prio["batch_ttft_p50_s"] > fcfs["batch_ttft_p50_s"]        # what the batch loses
    assert prio["chat_requests"] + prio["batch_requests"] == 80


def test_service_over_time_by_hand(tmp_path):
    """Two tenants: a's request (prompt 10) emits tokens at 1 and 3 s, b's (prompt 4) at 2 s;
    c's request never started. Prompt weight 1 at the first token, output weight 2."""
    pd.DataFrame({"tenant": ["a", "b", "c"], "num_prompt_tokens": [10, 4, 7],
                  "token_times": [np.array([1.0, 3.0]), np.array([2.0]), np.array([])]}
                 ).to_parquet(tmp_path / "requests.parquet")
    got = study("fairness").service_over_time(tmp_path, np.array([0.5, 1.0, 2.5, 3.0]))
    assert got["a"].tolist() == [0, 12, 12, 14]
    assert got["b"].tolist() == [0, 0, 6, 6]
    assert got["c"].tolist() == [0, 0, 0, 0]


@pytest.mark.slow   # a study at toy scale
def test_fairness_study_toy(tmp_path):
    d = sweep(tmp_path, "fairness", "trace.num_requests=150", "trace.qps=4.0")
    out = tmp_path / "res"
    fair = study("fairness")
    fair.main(d, out)
    df = pd.read_csv(out / "fairness.csv").set_index("policy")
    assert set(df.index) == {"sarathi", "vtc"}
    for f in ("tenants.csv", "service_over_time.png", "tenant_ttft.png"):
        assert (out / f).stat().st_size > 0
    # overloaded: VTC serves the light tenants first, the heavy one waits
    assert df.loc["vtc", "light_ttft_p50_s_worst"] < df.loc["sarathi", "light_ttft_p50_s_worst"]
    assert df.loc["vtc", "heavy_ttft_p50_s"] > df.loc["sarathi", "heavy_ttft_p50_s"]
    assert df.loc["vtc", "jain_by_last_arrival"] > df.loc["sarathi", "jain_by_last_arrival"]
    # the curves end at each tenant's service in the summary
    for run in d.iterdir():
        if not (run / "summary.json").exists():
            continue
        s = json.loads((run / "summary.json").read_text())
        end = fair.service_over_time(run, np.array([s["makespan_s"] + 1e9]))
        for tenant, t in s["tenants"].items():
            assert end[tenant][0] == pytest.approx(t["service_tokens"])


@pytest.mark.parametrize("option, classes, tenants", [
    ("chat", {"interactive"}, {"default"}),
    ("chat_batch", {"interactive", "batch"}, {"default"}),
    ("heavy_tenant", {"interactive"}, {f"chat{i}" for i in range(9)} | {"heavy"})])
def test_study_workloads_build(option, classes, tenants):
    from sarathi_lab.traces import build_trace
    cfg = composed(f"trace={option}", "trace.num_requests=400")["trace"]
    df = build_trace(cfg)
    assert len(df) == 400
    assert set(df["slo_class"]) == classes and set(df["tenant"]) == tenants
    # chat requests carry their 2.5 s TTFT as a deadline where deadline admission reads it
    if option != "heavy_tenant":
        chat = df[df["slo_class"] == "interactive"]
        assert (chat["deadline"] == 2.5).all()
