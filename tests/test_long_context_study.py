"""experiments/long_context at toy scale: the study's script runs end to end; the context-aware
controllers keep chat decodes inside the 100 ms TBT target beside 32k-128k-token prompts, by
shrinking the chunk at long context, where a static 2048 budget breaks it."""
import pytest
from study_scripts import load_study


@pytest.mark.slow   # 4 runs of 60 requests, three of them 32k-128k prompts, ~4 s
def test_long_context_study_at_toy_scale(tmp_path):
    study = load_study("long_context")
    df = study.study(tmp_path, "test", log=lambda *_: None)
    assert list(df["config"]) == ["static 512", "static 2048", *study.CONTROLLERS]
    rows = df.set_index("config")
    assert (rows["num_long"] > 0).all()
    for ctl in study.CONTROLLERS:
        assert rows.loc[ctl, "chat_tbt_p99"] <= study.TBT + 1e-9
        assert rows.loc[ctl, "chat_gaps_over"] == 0
        assert rows.loc[ctl, "chunk_at_long_ctx"] < rows.loc["static 512", "chunk_at_long_ctx"]
    assert rows.loc["static 2048", "chat_tbt_p99"] > 2 * study.TBT
    assert rows.loc["static 2048", "chat_gaps_over"] > 0
    assert "| 0.05 | tbt_target |" in (tmp_path / "long_context.md").read_text()
