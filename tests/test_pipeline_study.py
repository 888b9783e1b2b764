"""experiments/pipeline at toy scale: one command writes the table and the plots, every layout
and policy runs, and the figures say what the design implies."""
import pandas as pd
import pytest
from study_scripts import load_study

pytestmark = pytest.mark.slow   # a study at toy scale


def test_pipeline_study_at_toy_scale(tmp_path):
    study = load_study("pipeline")
    study.main(["--requests", "24", "--qps", "3", "--budgets", "256", "2048",
                "--layouts", "tp4", "tp2pp2", "tp2pp2-2nodes", "tp2pp2-nocpu", "--out",
                str(tmp_path)])
    df = pd.read_csv(tmp_path / "pipeline.csv")
    assert (tmp_path / "pipeline_qps3.png").stat().st_size > 0
    assert len(df) == 4 * 3
    assert set(df["policy"]) == {"sarathi-256", "sarathi-2048", "vllm"}
    assert (df["num_rejected"] == 0).all() and (df["num_finished"] == 24).all()
    d = df.set_index(["layout", "policy"])
    # only pipelined layouts have bubbles, and they have some (a lone micro-batch's fill)
    assert d.loc["tp4", "bubble_fraction"].isna().all()
    pp = d.loc["tp2pp2"]
    assert (pp["bubble_fraction"] > 0).all() and (pp["bubble_fraction"] < 1).all()
    # the same four GPUs hold nearly the same KV: weights and KV bytes per GPU are the same
    assert abs(pp["kv_blocks"].iloc[0] / d.loc["tp4", "kv_blocks"].iloc[0] - 1) < 0.02
    # a request's iteration crosses both stages at TP2: its TBT is above TP4's
    assert (pp["p50_tbt_ms"] > d.loc["tp4", "p50_tbt_ms"]).all()
    # the stage boundary over a NIC only adds transfer time; no CPU side only removes some
    for pol in pp.index:
        assert d.loc[("tp2pp2-2nodes", pol), "p50_tbt_ms"] >= pp.loc[pol, "p50_tbt_ms"]
        assert d.loc[("tp2pp2-nocpu", pol), "p50_tbt_ms"] < pp.loc[pol, "p50_tbt_ms"]
    # a smaller budget makes micro-batches more alike
    assert pp.loc["sarathi-256", "cv_tokens"] < pp.loc["sarathi-2048", "cv_tokens"]
