"""experiments/real_check at toy scale: on real runs of a random Llama (torch executor, CPU
clock), vllm stalls the decodes behind whole prompts and sarathi does not, P99 TBT rises and
TTFT falls with the token budget; the tables say what the runs say; the claims' test flags a
wrong ordering; a profile on another clock is refused."""
import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from conftest import slow_fixture
from study_scripts import load_study

from sarathi_lab.metrics import tbt_gaps

# a study at toy scale; its tests share one toy run of real CPU-clock timings, made once on one
# xdist worker (--dist loadgroup) rather than on two workers at once, each disturbing the other
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("real_check")]

S = load_study("real_check")


@slow_fixture(scope="module")
def toy(tmp_path_factory):
    n = torch.get_num_threads()
    out = tmp_path_factory.mktemp("real_check")
    S.main(["--toy", "--out", str(out)])
    torch.set_num_threads(n)
    return out


def runs_of(out, policy, kind="real"):
    d = out / "runs" / policy / kind
    return pd.read_parquet(d / "requests.parquet"), pd.read_parquet(d / "iterations.parquet")


def test_real_runs_show_the_stall_and_budget_shapes(toy):
    scale = S.SCALES["toy"]
    budgets = sorted(scale["budgets"])
    # from the real runs' own records, not from the study's tables
    req, it = runs_of(toy, "vllm")
    assert (it["duration"] > 0).all() and len(req) == scale["num_requests"]
    # vllm's prefill iterations hold whole prompts and no decode
    pre = it[it["prefill_tokens"] > 0]
    assert (pre["prefill_tokens"] >= scale["prompt_len"]["low"]).all()
    whole_prompt_step = pre["duration"].min()
    assert whole_prompt_step > 2 * it.loc[it["prefill_tokens"] == 0, "duration"].median()
    assert tbt_gaps(req)[0].max() >= whole_prompt_step
    p99 = []
    for b in budgets:
        req_s, it_s = runs_of(toy, f"sarathi-{b}")
        assert it_s["prefill_tokens"].max() <= b
        gaps = tbt_gaps(req_s)[0]
        p99.append(np.percentile(gaps, 99))
        if b == budgets[0]:
            assert gaps.max() < whole_prompt_step
    assert np.all(np.diff(p99) > 0), p99
    summ = {p: json.loads((toy / "runs" / p / "real" / "summary.json").read_text())
            for p in ("vllm", f"sarathi-{budgets[0]}")}
    assert summ["vllm"]["stalls"]["count"] > summ[f"sarathi-{budgets[0]}"]["stalls"]["count"]
    ttft = [json.loads((toy / "runs" / f"sarathi-{b}" / "real" / "summary.json").read_text())
            ["ttft"]["p50"] for b in budgets]
    assert np.all(np.diff(ttft) < 0), ttft


def test_the_tables_say_what_the_runs_say(toy):
    pols = list(S.policies(S.SCALES["toy"]))
    runs = pd.read_csv(toy / "runs.csv")
    assert len(runs) == 2 * len(pols) and set(runs["policy"]) == set(pols)
    assert set(runs["executor"]) == {"real", "sim"}
    assert (runs["num_finished"] == S.SCALES["toy"]["num_requests"]).all()
    for r in runs.itertuples():
        s = json.loads((toy / "runs" / r.policy / r.executor / "summary.json").read_text())
        assert r.tbt_p99_s == pytest.approx(s["tbt"]["p99"])
        assert r.stalls == s["stalls"]["count"] and r.ttft_p50_s == pytest.approx(s["ttft"]["p50"])
    gap = pd.read_csv(toy / "gap.csv")
    g = gap[(gap.policy == "vllm") & (gap.metric == "tbt_max_s")].iloc[0]
    real = runs[(runs.policy == "vllm") & (runs.executor == "real")].iloc[0]
    simr = runs[(runs.policy == "vllm") & (runs.executor == "sim")].iloc[0]
    assert g.error == pytest.approx(simr.tbt_max_s / real.tbt_max_s - 1)
    shapes = pd.read_csv(toy / "shapes.csv")
    assert len(shapes) == 5 and shapes["real_holds"].all()   # as the first test found
    assert (toy / "real_check.png").stat().st_size > 10_000
    info = json.loads((toy / "run_info.json").read_text())
    assert info["profile_meta"]["clock"] == "cpu" and info["torch_threads"] == 1
    assert info["load_average"] and info["wall_time_s"] > 0


def fake_runs(p99, ttft):
    """runs.csv rows: vllm and sarathi at 16/32/64, the same for real and sim."""
    rows = []
    for kind in ("real", "sim"):
        rows.append(dict(policy="vllm", executor=kind, stalls=5, tbt_max_s=1.0, tbt_p99_s=0.9,
                         prefill_step_min_s=0.5, ttft_p50_s=0.1))
        for b, t, f in zip((16, 32, 64), p99, ttft):
            rows.append(dict(policy=f"sarathi-{b}", executor=kind, stalls=0, tbt_max_s=t,
                             tbt_p99_s=t, prefill_step_min_s=0.01, ttft_p50_s=f))
    return pd.DataFrame(rows)


def test_claims_flag_a_wrong_ordering():
    ok = S.shapes(fake_runs([0.1, 0.2, 0.3], [3, 2, 1]), (16, 32, 64))
    assert ok["real_holds"].all() and ok["sim_holds"].all()
    bad = S.shapes(fake_runs([0.1, 0.3, 0.2], [3, 2, 2]), (16, 32, 64)).set_index("claim")
    assert not bad.loc["P99 TBT rises with the budget", "real_holds"]
    assert not bad.loc["P50 TTFT falls with the budget", "sim_holds"]
    assert bad.loc["vllm stalls more than sarathi-16", "real_holds"]
    # sarathi's worst gap above a whole-prompt step: the stall claim fails
    worse = S.shapes(fake_runs([0.6, 0.7, 0.8], [3, 2, 1]), (16, 32, 64)).set_index("claim")
    assert not worse.filter(like="worst TBT gap", axis=0)["real_holds"].iloc[0]


def test_a_profile_on_the_wall_clock_is_refused(toy, tmp_path):
    t = pq.read_table(toy / "profile.parquet")
    meta = {**t.schema.metadata, b"clock": b"wall"}
    pq.write_table(t.replace_schema_metadata(meta), tmp_path / "wall.parquet")
    with pytest.raises(SystemExit, match="wall clock"):
        S.main(["--toy", "--profile", str(tmp_path / "wall.parquet"), "--out",
                str(tmp_path / "out")])
