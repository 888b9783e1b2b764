"""The model presets the seed papers served (issue 37 item 1): shapes, contexts, windows."""
import pytest
from profile_helpers import preset

from sarathi_lab.costmodels.roofline import RooflineCostModel

# parameters of the Hugging Face checkpoints whose shapes the presets share
PARAMS = {"mistral-7b": 7_241_732_096, "yi-34b": 34_388_917_248}
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


@pytest.mark.slow
def test_the_papers_arxiv_setting_runs_from_the_cli_under_both_engines(tmp_path):
    # Sarathi-Serve's Mistral-7B on its <= 16k arXiv workload (fitted), as a user types it; the
    # summary says which workload and which engine's CPU side priced it
    import json

    from helpers import cli
    common = ("model=mistral-7b-instruct-v0.2", "trace=arxiv_16k_fitted", "trace.num_requests=8",
              "scheduler=sarathi")
    runs = {}
    for engine in ("vllm-v0", "none"):
        r = cli(f"hydra.run.dir={tmp_path}/{engine}", *common, f"executor.engine={engine}",
                cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        runs[engine] = json.loads((tmp_path / engine / "summary.json").read_text())
    for engine, s in runs.items():
        assert s["cost_model"]["engine"] == engine
        assert s["trace"]["name"] == "arxiv_16k_fitted"
    # the same requests, each iteration cheaper without the CPU side: every request done sooner
    assert runs["none"]["num_requests"] == runs["vllm-v0"]["num_requests"] == 8
    assert runs["none"]["e2e"]["mean"] < runs["vllm-v0"]["e2e"]["mean"]
