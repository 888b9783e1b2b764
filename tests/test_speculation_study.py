"""experiments/speculation at toy scale: the study's script runs end to end and its figures show
the effects its README reports (speculation shortens TPOT, its verification tokens shrink the
chunks prompts get while others queue, and slo_dp does speculate)."""
import pandas as pd
import pytest
from study_scripts import load_study


@pytest.mark.slow   # 3 runs of 40 requests, ~4 s
def test_speculation_study_at_toy_scale(tmp_path):
    study = load_study("speculation")
    df = study.study(tmp_path, "test", log=lambda *_: None)
    assert list(df["config"]) == ["k=0", "k=4", "slo_dp"]
    rows = df.set_index("config")
    base, k4, dp = rows.loc["k=0"], rows.loc["k=4"], rows.loc["slo_dp"]
    assert k4["tpot_p50"] < 0.7 * base["tpot_p50"]            # 1 + 0.7 + ... tokens a step
    assert k4["prefill_tok_backlog"] < base["prefill_tok_backlog"]   # 4 x 5 tokens a decode
    assert k4["drafts_per_step"] == 4 and 0 < dp["drafts_per_step"] <= 4
    assert k4["acceptance"] == pytest.approx((0.7 + 0.7 ** 2 + 0.7 ** 3 + 0.7 ** 4) / 4, abs=0.05)
    for f in ("runs.csv", "cells.csv", "speculation.md"):
        assert (tmp_path / f).stat().st_size > 0
    assert "| 3.5 | ratio | 0.7 | slo_dp |" in (tmp_path / "speculation.md").read_text()


@pytest.mark.slow   # 4 runs of 40 requests, ~6 s
def test_rerunning_slo_dp_alone_replaces_its_rows_and_keeps_the_others(tmp_path):
    study = load_study("speculation")
    first = study.study(tmp_path, "test", log=lambda *_: None)
    runs = pd.read_csv(tmp_path / "runs.csv")
    runs.loc[runs["config"] == "k=0", "tpot_p50"] = 123.0     # kept: not rerun
    runs.loc[runs["config"] == "slo_dp", "tpot_p50"] = 999.0  # replaced by the rerun
    runs.to_csv(tmp_path / "runs.csv", index=False)
    study.study(tmp_path, "test", log=lambda *_: None, only="slo_dp")
    again = pd.read_csv(tmp_path / "runs.csv").set_index("config")
    assert list(again.index) == ["k=0", "k=4", "slo_dp"]
    assert again.loc["k=0", "tpot_p50"] == 123.0
    assert again.loc["slo_dp", "tpot_p50"] == pytest.approx(
        first.set_index("config").loc["slo_dp", "tpot_p50"], rel=1e-12)
    assert "rerun of slo_dp's rows alone" in (tmp_path / "speculation.md").read_text()
    # a rerun row the previous results lack is an error, not a silent append
    runs = pd.read_csv(tmp_path / "runs.csv")
    runs[runs["config"] != "slo_dp"].to_csv(tmp_path / "runs.csv", index=False)
    with pytest.raises(ValueError, match="rerun rows not in the previous results"):
        study.study(tmp_path, "test", log=lambda *_: None, only="slo_dp")
