"""The tiny Hugging Face oracle that the real-executor tests share (a test module imports no
other test module): a tiny random HF model saved to disk, mixed requests, HF's greedy outputs for
them, and a run of the same requests through the engine on our executor."""
import pytest
import torch
import transformers

from sarathi_lab.engine import Engine
from sarathi_lab.request import Request, Status
from sarathi_lab.run import runner

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def make_hf_model(path, kind="llama", seed=0, std=0.1, max_shard_size=None, **overrides):
    """A tiny random Hugging Face model saved as safetensors in `path`; returns it (fp32, eval).

    Weights are larger than HF's default init (std 0.1, not 0.02) so logits spread out and greedy
    decoding has no near-ties; norms and biases are random too, so a misloaded one shows."""
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
        "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM),
    }[kind]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**{**TINY, "initializer_range": std, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, std)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(path, **kw)
    return model


PREFIX = 24   # shared "system prompt": a full block at block_size 16, six at 4


def make_specs(n=18, seed=0):
    """(prompt ids, output length) of mixed lengths; even requests share a prefix."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, 256, (PREFIX,), generator=g).tolist()
    lens = [1, 2, 70, 5, 33, 16, 47, 9, 26, 64, 3, 40, 17, 55, 12, 29, 8, 36][:n]
    outs = [1, 12, 5, 20, 9, 2, 16, 24, 7, 3, 18, 11, 6, 14, 22, 4, 10, 8][:n]
    specs = []
    for i, (p, o) in enumerate(zip(lens, outs)):
        ids = torch.randint(0, 256, (p,), generator=g).tolist()
        if i % 2 == 0 and p > PREFIX:
            ids[:PREFIX] = prefix
        specs.append((ids, o))
    return specs


def hf_generate(model, specs):
    out = []
    for ids, n in specs:
        with torch.no_grad():
            seq = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                                 do_sample=False, max_new_tokens=n, min_new_tokens=n)
        out.append(seq[0, len(ids):].tolist())
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and the suite then no longer stalls on OpenMP
    barriers when other processes share the cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """A tiny HF Llama on disk, the requests, and HF's greedy outputs (computed once)."""
    path = tmp_path_factory.mktemp("hf-llama")
    model = make_hf_model(path)
    specs = make_specs()
    return path, specs, hf_generate(model, specs)


def run_engine(path, specs, *, backend="torch", kv_cache_gib=0.01, executor=None, **sched):
    cfg = {"executor": {"name": "torch", "device": "cpu", "dtype": "float32",
                        "attention_backend": backend, "kv_cache_gib": kv_cache_gib, "seed": 0,
                        **(executor or {})},
           "model": {"name": "hf-tiny", "path": str(path)},
           "scheduler": {"name": "sarathi", **sched}}
    policy, executor = runner.build(cfg)
    reqs = [Request(i, 0.0, len(ids), n, prompt_token_ids=list(ids))
            for i, (ids, n) in enumerate(specs)]
    engine = Engine(policy, executor)
    engine.run(reqs)
    assert all(r.status is Status.FINISHED for r in reqs), reqs
    return reqs, engine


def with_eos(path, tmp_path, eos):
    """A copy of the model directory whose checkpoint declares `eos` its EOS id."""
    import json
    import shutil
    d = tmp_path / "eos-model"
    shutil.copytree(path, d)
    for name in ("config.json", "generation_config.json"):
        f = d / name
        if f.is_file():
            f.write_text(json.dumps({**json.loads(f.read_text()), "eos_token_id": eos}))
    return d
