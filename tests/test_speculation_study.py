"""experiments/speculation at toy scale: the study's script runs end to end and its figures show
the effects its README reports (speculation shortens TPOT, its verification tokens shrink the
chunks prompts get while others queue, and slo_dp does speculate)."""
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
