"""The planning study (experiments/planning) at toy scale: one case of Mixtral-8x7B on A100 with
a tensor-parallel and an expert-parallel layout; every candidate ranked or pruned with its reason,
the cheapest-deployment and policy tables checked against the ranked rows, and a rerun resumed."""
import json

import pandas as pd
import pytest
from conftest import slow_fixture
from study_scripts import load_study

pytestmark = pytest.mark.slow   # a study at toy scale (~10-20 s)

CASE = "mixtral-8x7b_chat_strict"
ARGS = ["--requests", "30", "--models", "mixtral-8x7b", "--workloads", "chat", "--slos",
        "strict", "--hardware", "a100-80gb", "--load", "chat=2", "--n-jobs", "1"]


@slow_fixture(scope="module")
def toy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planning")
    study = load_study("planning")
    # two layouts instead of the study's eight: TP2, and TP1 x EP2
    study.LAYOUTS = {"mixtral-8x7b": [{"tensor_parallel": [2]},
                                      {"tensor_parallel": [1], "expert_parallel": [2]}]}
    argv = ARGS + ["--root", str(tmp / "plans"), "--out", str(tmp / "out")]
    study.main(argv)
    return study, tmp, argv


def test_every_candidate_is_ranked_or_says_why_not(toy):
    _, tmp, _ = toy
    r = pd.read_csv(tmp / "out" / CASE / "ranked.csv")
    # 2 layouts x {colocated, 1:1} x {sarathi/512, sarathi/2048, vllm}
    assert len(r) == 12 and r["candidate"].is_unique
    # every one evaluated: both layouts fit an A100 pair, and disaggregated pools of
    # expert-parallel replicas are modelled (each pool's GPUs tensor x expert parallel)
    assert set(r["status"]) <= {"feasible", "infeasible"}
    ep_disagg = r[(r["layout"] == "TP1 EP2") & (r["split"] == "1:1") & (r["status"] == "feasible")]
    assert (ep_disagg["gpus"] == 4 * ep_disagg["units"]).all()
    f = r[r["status"] == "feasible"]
    assert len(f) >= 1
    assert list(f["rank"]) == list(range(1, len(f) + 1))
    assert f["usd_per_1m_output_tokens"].is_monotonic_increasing
    assert set(r["load_qps"].dropna()) == {2.0}
    for cmd in f["command"]:
        for part in ("model=mixtral-8x7b", "slo=mixtral-8x7b-strict", "trace=azure_conv",
                     "trace.max_total_tokens=8192", "hardware=a100-80gb"):
            assert part in cmd
    assert (tmp / "out" / CASE / "pareto.png").stat().st_size > 0


def test_cheapest_and_policy_tables_follow_the_ranked_rows(toy):
    _, tmp, _ = toy
    r = pd.read_csv(tmp / "out" / CASE / "ranked.csv")
    f = r[r["status"] == "feasible"]
    cheapest = pd.read_csv(tmp / "out" / "cheapest.csv")
    assert set(cheapest["on"]) == {"any", "a100-80gb"}
    best = cheapest[cheapest["on"] == "any"].iloc[0]
    top = f.iloc[0]
    assert best["usd_per_1m_output_tokens"] == pytest.approx(top["usd_per_1m_output_tokens"])
    assert (best["gpus"], best["layout"], best["split"], best["policy"]) == \
        (top["gpus"], top["layout"], top["split"], top["policy"])
    assert best["feasible"] == len(f)
    pol = pd.read_csv(tmp / "out" / "policy.csv").iloc[0]

    def cheapest_of(mask):
        d = f[mask]
        return d["usd_per_1m_output_tokens"].min() if len(d) else float("nan")
    sar = f["policy"] == "sarathi"
    for b in (512, 2048):
        assert pol[f"sarathi/{b}"] == pytest.approx(cheapest_of(sar & (f["token_budget"] == b)),
                                                    nan_ok=True)
    assert pol["vllm"] == pytest.approx(cheapest_of(f["policy"] == "vllm"), nan_ok=True)
    assert pol["split colocated"] == pytest.approx(cheapest_of(f["split"] == "colocated"),
                                                   nan_ok=True)
    assert pol["vllm_over_sarathi"] == pytest.approx(
        cheapest_of(f["policy"] == "vllm") / cheapest_of(sar), nan_ok=True)
    md = (tmp / "out" / "summary.md").read_text()
    assert "mixtral-8x7b" in md and "vllm_over_sarathi" in md
    # the case's cheapest answer was re-run long (--check 10): 10 x its probe's requests, its
    # command and whether it held in the table
    assert best["check_requests"] == 10 * top["probe_requests"]
    assert best["check_held"] in (True, False) and "mode=run" in best["check_command"]
    assert top["check_command"] == best["check_command"]
    info = json.loads((tmp / "out" / "run_info.json").read_text())
    assert info["command"].startswith("python experiments/planning/run.py --requests 30")


def test_a_rerun_resumes_every_search_and_gives_the_same_tables(toy):
    study, tmp, argv = toy
    before = pd.read_csv(tmp / "out" / "cheapest.csv")
    study.main(argv)   # the same root: every candidate's result.json is reused
    assert pd.read_csv(tmp / "out" / "cheapest.csv").equals(before)


def test_a_bad_load_names_the_option(capsys):
    study = load_study("planning")
    for bad, why in (("talk=3", "not a workload"), ("chat=x", "not a rate"),
                     ("chat=0", "must be > 0")):
        with pytest.raises(SystemExit):
            study.main(["--load", bad])
        err = capsys.readouterr().err
        assert f"--load {bad}" in err and why in err
    assert study.layout_label({"tensor_parallel": 2, "expert_parallel": float("nan")}) == "TP2"
    assert study.layout_label({"tensor_parallel": 1, "expert_parallel": 4}) == "TP1 EP4"
