"""The model presets the seed papers served (issue 37 item 1): shapes, contexts, windows."""
import pytest
from test_sim import PARAMS, preset

from sarathi_lab.costmodels.roofline import RooflineCostModel

# preset -> (the shape it shares, its context, its sliding window)
PAPER_PRESETS = {
    "mistral-7b-instruct-v0.2": ("mistral-7b", 32768, None),
    "yi-34b-200k": ("yi-34b", 200_000, None),
}


@pytest.mark.parametrize("name", sorted(PAPER_PRESETS))
def test_paper_presets_have_their_context_window_and_parameter_count(name):
    base, context, window = PAPER_PRESETS[name]
    cfg, ref = preset("model", name), preset("model", base)
    assert set(cfg) == set(ref) and cfg["name"] == name
    assert cfg["max_model_len"] == context and cfg["sliding_window"] == window
    cm = RooflineCostModel(cfg, preset("hardware", "h200"), 1)
    assert cm.weight_bytes == pytest.approx(2 * PARAMS[base], rel=1e-12)


def test_mistral_v02_attends_to_the_whole_context_where_v01_stops_at_4096():
    # a decode at context 12,000: v0.1's window reads 4,096 tokens of KV, v0.2 all 12,001
    hw = preset("hardware", "a100-80gb")
    v01 = RooflineCostModel(preset("model", "mistral-7b"), hw, 1)
    v02 = RooflineCostModel(preset("model", "mistral-7b-instruct-v0.2"), hw, 1)
    assert v02.attention_time([], [12_000]) > 2.5 * v01.attention_time([], [12_000])
    assert v02.attention_time([], [1_000]) == pytest.approx(v01.attention_time([], [1_000]))
