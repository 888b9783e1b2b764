"""What a new user tripped on (issue 40, item 5) and rejected requests made prominent (issue 35,
item 5): the printed summary's labels, a run refused at start-up, the help text, the README's
commands."""
from helpers import composed

from sarathi_lab.runner import run
from sarathi_lab.summary_text import format_summary

SMALL = ["trace=synthetic", "trace.num_requests=4", "trace.prompt_len=64", "trace.output_len=4",
         "trace.qps=50", "progress=false"]


def test_a_model_from_a_config_json_is_labelled_with_its_name():
    s = run(composed("model=hf", "model.hf_config=qwen2.5-7b", "slo=mistral-7b-strict", *SMALL),
            None, write=False)
    assert s["config"]["model"]["name"] is None   # as composed: named after its config.json
    assert format_summary(s).splitlines()[0].startswith("sarathi | qwen2.5-7b on simulated ")
