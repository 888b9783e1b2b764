"""Defaults that follow the run, and settings that cannot act refused (issue 23, items 1 and 6):
a user's trace keeps its own times and requests, the SLO follows the model, a real model needs
its weights (and the memory for them), text prompts get the chat template, and a setting that
cannot act on this run is an error naming it."""
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import CONFIGS, cli, composed

from sarathi_lab.cli.main import check_config
from sarathi_lab.run.config import check_settings_act
from sarathi_lab.settings import ConfigError

N = 40   # requests in the test's own traces


def _check(*overrides) -> tuple[dict, object]:
    """The config as the command line would compose and check it (defaults followed)."""
    c = composed(*overrides)
    return c, check_config(c, list(overrides))


@pytest.fixture
def timed_csv(tmp_path) -> Path:
    """A trace with its own arrival times: one request every 0.25 s (4 req/s)."""
    p = tmp_path / "timed.csv"
    pd.DataFrame({"arrived_at": np.arange(N) * 0.25, "num_prefill_tokens": np.full(N, 64),
                  "num_decode_tokens": np.full(N, 8)}).to_csv(p, index=False)
    return p


@pytest.fixture
def lengths_csv(tmp_path) -> Path:
    p = tmp_path / "lengths.csv"
    pd.DataFrame({"num_prefill_tokens": np.full(N, 64),
                  "num_decode_tokens": np.full(N, 8)}).to_csv(p, index=False)
    return p


# -- a user's trace keeps its times and its requests ------------------------------------------

def test_a_timestamped_trace_keeps_its_times_and_every_request(timed_csv, tmp_path):
    from sarathi_lab.run.runner import run
    c, r = _check(f"trace.path={timed_csv}", "progress=false")
    assert (c["trace"]["qps"], c["trace"]["num_requests"]) == (None, None)   # not 2.0 and 1000
    assert c["trace"]["name"] == str(timed_csv)
    s = run(c, tmp_path / "run", resolved=r)
    assert s["trace"] == {"name": str(timed_csv), "source": str(timed_csv), "num_requests": N,
                          "arrivals": "own", "qps": None, "cut_to": None}
    arrivals = pd.read_parquet(tmp_path / "run" / "requests.parquet")["arrival_time"]
    assert np.allclose(np.sort(arrivals), np.arange(N) * 0.25)


def test_a_rate_or_count_asked_for_retimes_and_cuts_and_says_so(timed_csv, tmp_path):
    from sarathi_lab.run.runner import run
    from sarathi_lab.run.summary_text import format_summary
    c, r = _check(f"trace.path={timed_csv}", "trace.qps=8", "trace.num_requests=10",
                  "trace.name=mine", "progress=false")
    s = run(c, tmp_path / "run", resolved=r)
    assert s["trace"] == {"name": "mine", "source": str(timed_csv), "num_requests": 10,
                          "arrivals": "retimed", "qps": 8.0, "cut_to": 10}
    assert "| trace mine (re-timed to 8 req/s, first 10 requests)" in \
        format_summary(s).splitlines()[0]


def test_the_shipped_presets_keep_their_documented_rate_and_count():
    c, _ = _check("trace.seed=1")
    assert (c["trace"]["name"], c["trace"]["qps"], c["trace"]["num_requests"]) == \
        ("sharegpt", 2.0, 1000)
    c, _ = _check("trace.path=arxiv")   # a shipped trace by name: labelled by it
    assert (c["trace"]["name"], c["trace"]["qps"], c["trace"]["num_requests"]) == \
        ("arxiv", 2.0, 1000)


def test_a_lengths_only_trace_of_ones_own_needs_a_rate(lengths_csv, tmp_path):
    from sarathi_lab.run.runner import run
    c, r = _check(f"trace.path={lengths_csv}")
    with pytest.raises(ValueError) as e:
        run(c, tmp_path / "run", resolved=r)
    assert str(e.value) == (f"trace {lengths_csv} has token lengths but no arrival times: set "
                            "trace.qps=<req/s> so that arrivals can be drawn "
                            "(trace.arrival=poisson)")
    c, r = _check(f"trace.path={lengths_csv}", "trace.qps=5", "progress=false")
    s = run(c, tmp_path / "run2", resolved=r)
    assert (s["trace"]["arrivals"], s["trace"]["num_requests"]) == ("drawn", N)


@pytest.mark.slow   # a CLI subprocess
def test_the_header_names_the_file_and_what_was_done_to_it(timed_csv, tmp_path):
    r = cli(f"hydra.run.dir={tmp_path}/run", f"trace.path={timed_csv}", "progress=false",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].endswith(
        f"| trace {timed_csv} (its own arrival times, all {N} requests)")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["trace"]["arrivals"] == "own" and s["config"]["trace"]["qps"] is None


# -- the SLO follows the model ----------------------------------------------------------------

@pytest.mark.parametrize("model", sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml")))
def test_every_model_is_judged_by_its_own_slo(model):
    if model == "hf":   # no shape until a config.json is named, and no SLO of its own
        with pytest.raises(ConfigError, match="^slo=hf-strict: model=hf .* has no SLO"):
            _check("model=hf", "model.hf_config=llama-3-8b")
        return
    c, r = _check(f"model={model}")
    assert r.slo.name == f"{model}-strict" and r.slo.model == model


def test_an_slo_set_for_another_model_is_refused_unless_chosen():
    with pytest.raises(ConfigError) as e:
        _check("experiment=capacity", "model=yi-34b", "executor.tensor_parallel=2")
    assert str(e.value) == (
        "slo=mistral-7b-strict: its limits were set for model mistral-7b, but this run's model "
        "is yi-34b; choose this model's SLO (slo=yi-34b-strict or slo=yi-34b-relaxed, "
        "configs/slo), or name slo=mistral-7b-strict on the command line to judge yi-34b by "
        "mistral-7b's limits anyway")
    _, r = _check("experiment=capacity", "model=yi-34b", "executor.tensor_parallel=2",
                  "slo=mistral-7b-strict")   # chosen: judged by it, as asked
    assert r.slo.name == "mistral-7b-strict"
    _, r = _check("model.name=my-own-model")   # no preset of its own to offer instead
    assert r.slo.name == "mistral-7b-strict"


def test_the_summary_names_the_slo_and_its_model(tmp_path):
    from sarathi_lab.run.runner import run
    c, r = _check("model=llama-2-7b", "trace=synthetic", "trace.num_requests=5",
                  "progress=false")
    s = run(c, tmp_path / "run", resolved=r)
    assert (s["slo"]["name"], s["slo"]["model"], s["slo"]["p99_tbt"]) == \
        ("llama-2-7b-strict", "llama-2-7b", 0.1)


# -- a real model needs weights, and the memory for them --------------------------------------

def _model(name: str) -> dict:
    return composed(f"model={name}")["model"]


def test_a_real_model_without_weights_is_refused():
    from sarathi_lab.models.loader import check_weights, model_shape
    m = _model("mistral-7b")
    with pytest.raises(ValueError) as e:
        check_weights(m, model_shape(m))
    assert str(e.value) == (
        "model mistral-7b: 7.24B parameters and no model.path: set model.path=DIR (a Hugging "
        "Face model directory: config.json and *.safetensors) to run its weights, or "
        "model.random_weights=true to run seeded random ones (only models of up to 100M "
        "parameters get them without asking)")
    check_weights({**m, "random_weights": True}, model_shape(m))   # asked for: allowed
    tiny = _model("tiny-llama")
    check_weights(tiny, model_shape(tiny))                          # test-sized: random
    with pytest.raises(ValueError, match=r"^model.random_weights=true with model.path=/m: "):
        check_weights({**m, "path": "/m", "random_weights": True}, model_shape(m))


def test_the_memory_is_estimated_and_checked_before_anything_is_allocated():
    from sarathi_lab.models.loader import ACTIVATION_TOKENS, check_memory, memory_estimate
    from sarathi_lab.models.shape import ModelShape
    m = {**_model("mistral-7b"), "random_weights": True}
    shape = ModelShape.from_config(m)
    est = memory_estimate(shape, 4)
    assert est["weights"] == shape.num_params() * 4
    per_token = 4 * 4096 + 2 * 32 * 128 + 3 * 14336 + 32000
    assert est["activations"] == ACTIVATION_TOKENS * per_token * 4
    need = est["weights"] + est["activations"] + 2**30
    check_memory(m, "float32", 2**30, "executor.kv_cache_gib", need, "cpu")   # just fits
    with pytest.raises(ValueError) as e:
        check_memory(m, "float32", 2**30, "executor.kv_cache_gib", need - 1, "cpu")
    assert str(e.value) == (
        f"model mistral-7b: about {need / 2**30:.1f} GiB (weights 26.98 GiB in float32, KV cache "
        "1.00 GiB (executor.kv_cache_gib), activations 3.04 GiB for a 8192-token step) but "
        f"{(need - 1) / 2**30:.1f} GiB is free on cpu; use a smaller model, a narrower "
        "executor.dtype or a smaller executor.kv_cache_gib, or a machine with more memory")


def test_a_model_is_built_in_its_own_dtype():
    import torch

    from sarathi_lab.models.loader import _empty_model, model_shape
    m = _empty_model(model_shape(_model("tiny-llama")), "cpu", torch.bfloat16)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32   # restored


@pytest.mark.slow   # CLI subprocesses (torch imported)
def test_the_real_executor_refuses_a_model_it_cannot_hold(tmp_path):
    base = (f"hydra.run.dir={tmp_path}/run", "executor=torch", "executor.device=cpu",
            "trace.num_requests=2")
    r = cli(*base, "model=mistral-7b", cwd=tmp_path)
    assert r.returncode == 1
    assert "sarathi-lab: error: model mistral-7b: 7.24B parameters and no model.path" in r.stderr
    # 69B parameters in float32: 257 GiB of weights, more than any machine here has free
    r = cli(*base, "model=llama-2-70b", "model.random_weights=true", cwd=tmp_path)
    assert r.returncode == 1
    assert "sarathi-lab: error: model llama-2-70b: about " in r.stderr
    # the KV budget (1 GiB) twice: the torch backend's contiguous copies of it
    assert "(weights 256.96 GiB in float32, KV cache 2.00 GiB (executor.kv_cache_gib)" \
        in r.stderr


# -- text prompts in the chat template --------------------------------------------------------

TEMPLATE = ("{% for m in messages %}<|user|> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _tokenizer(tmp_path, template: str | None) -> Path:
    """A word-level tokenizer saved as a local directory, with or without a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = ["<unk>", "<|user|>", "<|assistant|>", "what", "is", "the", "capital", "of",
             "france", "?"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>",
                                  additional_special_tokens=["<|user|>", "<|assistant|>"])
    if template is not None:
        tok.chat_template = template
    d = tmp_path / ("chat" if template else "plain")
    tok.save_pretrained(d)
    return d


@pytest.mark.slow   # imports transformers
def test_text_prompts_get_the_chat_template_when_the_tokenizer_has_one(tmp_path):
    from sarathi_lab.traces import build_trace
    trace = tmp_path / "q.jsonl"
    trace.write_text('{"prompt": "what is the capital of france ?", "output_len": 4}\n')
    chat, plain = _tokenizer(tmp_path, TEMPLATE), _tokenizer(tmp_path, None)

    def ids(tokenizer, mode="auto"):
        df = build_trace({"path": str(trace), "tokenizer": str(tokenizer), "qps": 1.0,
                          "chat_template": mode})
        return list(df["prompt_token_ids"][0])
    assert ids(chat) == [1, 3, 4, 5, 6, 7, 8, 9, 2]          # <|user|> ... <|assistant|>
    assert ids(chat, True) == ids(chat)
    assert ids(chat, False) == ids(plain) == [3, 4, 5, 6, 7, 8, 9]
    with pytest.raises(ValueError, match=r"^trace.chat_template=true: the tokenizer for trace "
                                         r".*q.jsonl has no chat template; set "
                                         r"trace.chat_template=false \(or auto\)"):
        ids(plain, True)


def test_trace_tokenizer_is_settable_as_documented_and_read_only_with_text(timed_csv):
    c, _ = _check("trace.tokenizer=/some/dir")    # declared: no + needed
    assert c["trace"]["tokenizer"] == "/some/dir" and c["trace"]["chat_template"] == "auto"
    from sarathi_lab.traces import build_trace
    with pytest.raises(ValueError) as e:
        build_trace({"path": str(timed_csv), "tokenizer": "/some/dir"})
    assert str(e.value) == (f"trace.tokenizer=/some/dir: trace {timed_csv} is a CSV of token "
                            "counts, with no prompt text to tokenize (only a JSONL trace holds "
                            "text); leave trace.tokenizer unset")


SMOLLM2 = Path(os.environ.get("SARATHI_LAB_SMOLLM2_DIR")
               or Path.home() / ".cache" / "sarathi_lab" / "models" / "smollm2")


@pytest.mark.slow   # SmolLM2 on a CPU, in a CLI subprocess
# as tests/test_smollm2.py: SARATHI_LAB_REQUIRE_SMOLLM2=1 (.ci/run) makes a missing model a failure
@pytest.mark.skipif(not (SMOLLM2 / "prepared.json").exists()
                    and os.environ.get("SARATHI_LAB_REQUIRE_SMOLLM2") != "1",
                    reason="SmolLM2 not prepared (sarathi-lab-prepare-model smollm2); the "
                           "template itself is tested with a tokenizer built above")
def test_smollm2_answers_a_question_in_its_chat_template(tmp_path):
    from transformers import AutoTokenizer
    trace = tmp_path / "q.jsonl"
    trace.write_text('{"prompt": "What is the capital of France?", "output_len": 12}\n')
    tok = AutoTokenizer.from_pretrained(SMOLLM2, local_files_only=True)
    answers = {}
    for mode in ("auto", "false"):
        r = cli(f"hydra.run.dir={tmp_path}/{mode}", "executor=torch", f"model.path={SMOLLM2}",
                "model.name=smollm2", f"trace.path={trace}", f"trace.tokenizer={SMOLLM2}",
                f"trace.chat_template={mode}", "trace.qps=1", "executor.stop_at_eos=true",
                "progress=false", cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr
        out = pd.read_parquet(tmp_path / mode / "requests.parquet")["output_token_ids"][0]
        answers[mode] = tok.decode(list(out))
    assert "Paris" in answers["auto"]
    assert answers["false"] == "<|im_end|>"   # no template: an immediate end of turn


# -- settings that cannot act are refused -----------------------------------------------------

def test_deadline_admission_without_deadlines_is_refused(tmp_path):
    from sarathi_lab.run.runner import run
    c, r = _check("scheduler.deadline_admission=true", "trace.num_requests=5")
    with pytest.raises(ConfigError) as e:
        run(c, tmp_path / "run", resolved=r)
    assert str(e.value) == (
        "scheduler.deadline_admission=true: no request of trace sharegpt has a deadline, so "
        "admission by deadline cannot act; use a trace whose requests carry one (a deadline "
        "column or key, or a mix component's deadline, e.g. trace=chat) or leave "
        "deadline_admission off")
    from sarathi_lab.traces import build_trace, to_requests
    c, r = _check("scheduler.deadline_admission=true", "trace=chat", "slo=distserve-chat",
                  "trace.num_requests=5")
    check_settings_act(r, to_requests(build_trace(c["trace"])), "chat")   # deadlines: acts


def test_a_sampling_or_prompt_setting_that_cannot_act_is_refused():
    from sarathi_lab.executors.torch_exec import TorchExecutor
    with pytest.raises(ConfigError, match=r"^executor.top_p=0.9: read only with "
                                          r"executor.temperature > 0"):
        TorchExecutor.parse_config({"top_p": 0.9})
    TorchExecutor.parse_config({"top_p": 0.9, "temperature": 0.7})   # sampling: it acts
    ex = TorchExecutor.from_config({"device": "cpu", "shared_prefix_len": 4}, _model("tiny-llama"))
    own = pd.DataFrame({"arrival_time": [0.0], "num_prompt_tokens": [3],
                        "num_output_tokens": [2], "prompt_token_ids": [[5, 6, 7]]})
    with pytest.raises(ConfigError, match=r"^executor.shared_prefix_len=4: the trace carries its "
                                          r"own prompt_token_ids"):
        ex.prepare_trace(own)


@pytest.mark.parametrize("overrides, message", [
    (["trace.cv=2"], "trace.cv=2.0: read only with arrival=gamma"),
    (["trace.think_time=1"], "trace.think_time=1.0: read only with clients=N (closed loop)"),
    (["mode=capacity", "capacity.rule=fixed", "capacity.min_requests=500"],
     "capacity.min_requests: read only with capacity.rule=steady"),
    (["mode=capacity", "capacity.min_requests=20000"],
     "capacity.min_requests=20000: over the (1 - warmup) x max_requests = 15000 requests"),
    (["trace.chat_template=false"],
     "trace.chat_template=False: read only with trace.tokenizer (a JSONL trace of prompt text)"),
    (["model.random_weights=true"],
     "model.random_weights: executor 'sim' does not read it (it reads the model's shape)"),
    (["executor=torch", "model=tiny-llama", "model.path=/m", "model.init_seed=3"],
     "model.init_seed: random weights only: the weights are loaded from model.path=/m"),
    (["executor.cost_model=profiled", "executor.profile=/p", "executor.compute_eff=0.5"],
     "executor.compute_eff: not a setting of the sim executor nor of its cost model "
     "'profiled'"),
])
def test_a_setting_that_cannot_act_is_refused_by_name(overrides, message):
    with pytest.raises(ConfigError) as e:
        _check(*overrides)
    assert str(e.value).startswith(message), str(e.value)


def test_a_capacity_search_keeps_the_slo_the_user_named_for_another_model(tmp_path):
    # checked once with the command line's overrides; the search's probes resolve the run
    # again without them, and refused the SLO the user had named (slo=... on the command line)
    from sarathi_lab.sweeps.capacity import search
    ov = ["model=llama-2-7b", "slo=mistral-7b-strict", "mode=capacity", "trace=synthetic",
          "trace.num_requests=30", "capacity.precision=0.25", "capacity.max_probes=6"]
    c, r = _check(*ov)
    assert r.slo.name == "mistral-7b-strict"
    result = search(c, tmp_path)
    assert result["config"]["slo"]["name"] == "mistral-7b-strict"
