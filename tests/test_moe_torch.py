"""Mixture-of-experts models (Mixtral, Qwen2-MoE) on the real executor against the Hugging Face
oracle: the MoE block alone, then greedy output ids through the engine (paged KV, chunked
prefill, prefix caching, preemption) equal `transformers`' exactly; checkpoint errors name the
tensor; seeded random weights for a tiny MoE preset; what the real executor refuses. And the
dense config.json models beside them: Mistral's sliding window through the engine."""
import json

import pandas as pd
import pytest
import torch
from helpers import cli

# one_thread is an autouse fixture: imported, it applies here
from hf_oracle import hf_generate, make_hf_model, make_specs, one_thread, run_engine  # noqa: F401

from sarathi_lab.models.loader import load_model, model_shape
from sarathi_lab.models.moe import SparseMoE

# 4 experts, 2 per token: a tiny model still routes rows to different experts
MOE = {
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    # Mixtral's config may set Mistral's sliding window too
    "mixtral-window": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                      shared_expert_intermediate_size=96, norm_topk_prob=False),
    "qwen2_moe-norm": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                           shared_expert_intermediate_size=96, norm_topk_prob=True),
}


def _kind(case):
    return case.split("-")[0]


@pytest.mark.parametrize("case", list(MOE))
def test_moe_block_equals_hugging_face(tmp_path, case):
    """The block alone, on rows of every routing, and on no rows at all."""
    hf = make_hf_model(tmp_path, _kind(case), **MOE[case]).model.layers[0].mlp
    c = MOE[case]
    shared = c.get("shared_expert_intermediate_size", 0)
    ours = SparseMoE(64, c.get("num_experts", c.get("num_local_experts")),
                     c["num_experts_per_tok"], c.get("moe_intermediate_size", 128),
                     c.get("norm_topk_prob", True), shared, shared_gate=bool(shared))
    sd = dict(hf.state_dict())
    if shared:
        sd["shared_expert.gate_up_proj.weight"] = torch.cat(
            (sd.pop("shared_expert.gate_proj.weight"), sd.pop("shared_expert.up_proj.weight")))
    ours.load_state_dict(sd)
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x[None])[0], rtol=1e-5, atol=1e-6)
        assert ours(x[:0]).shape == (0, 64)


SCHEDULES = {
    "sarathi-c16-b4": dict(token_budget=16, block_size=4),
    "sarathi-prefix-b4": dict(token_budget=32, block_size=4, enable_prefix_caching=True),
    "vllm-preempt-b4": dict(name="vllm", block_size=4, num_kv_blocks=24),
}


@pytest.fixture(scope="module", params=list(MOE))
def moe_oracle(request, tmp_path_factory):
    """A tiny HF MoE model on disk, mixed requests and HF's greedy outputs (once per model)."""
    path = tmp_path_factory.mktemp(request.param)
    model = make_hf_model(path, _kind(request.param), **MOE[request.param])
    specs = make_specs(12, seed=4)
    return path, specs, hf_generate(model, specs)


@pytest.mark.parametrize("sched", list(SCHEDULES))
def test_greedy_equals_hugging_face(moe_oracle, sched):
    path, specs, ref = moe_oracle
    reqs, engine = run_engine(path, specs, **SCHEDULES[sched])
    assert [r.output_token_ids for r in reqs] == ref
    if "preempt" in sched:
        assert sum(r.num_preemptions for r in reqs) > 0
    if "prefix" in sched:
        assert sum(engine.iters["prefill_tokens"]) < sum(len(ids) for ids, _ in specs)


@pytest.mark.parametrize("sched", ["sarathi-c16-b4", "vllm-preempt-b4"])
def test_mistral_sliding_window_equals_hugging_face(tmp_path, sched):
    """A window of 8 keys, shorter than most prompts and than a chunk of 16."""
    model = make_hf_model(tmp_path, "mistral", sliding_window=8, seed=2)
    specs = make_specs(10, seed=5)
    reqs, _ = run_engine(tmp_path, specs, **SCHEDULES[sched])
    assert [r.output_token_ids for r in reqs] == hf_generate(model, specs)


def test_the_model_has_the_checkpoints_experts(moe_oracle):
    path, _, _ = moe_oracle
    model = load_model({"path": str(path)}, "cpu", "float32")
    a = model.args
    assert a.num_experts == 4 and a.num_experts_per_tok == 2
    moe = model.model.layers[1].mlp
    assert isinstance(moe, SparseMoE)
    assert (moe.shared_expert is None) == (a.shared_expert_intermediate_size == 0)
    assert sum(p.numel() for p in model.parameters()) == a.num_params()


@pytest.mark.parametrize("kind,key,match", [
    ("mixtral", "model.layers.1.block_sparse_moe.experts.2.w3.weight",
     "lacks model.layers.1.mlp.experts.gate_up_proj"),
    ("qwen2_moe", "model.layers.0.mlp.experts.3.down_proj.weight",
     "lacks model.layers.0.mlp.experts.down_proj"),
    ("qwen2_moe", "model.layers.0.mlp.shared_expert_gate.weight",
     "lacks model.layers.0.mlp.shared_expert_gate.weight"),
])
def test_a_checkpoint_missing_an_expert_is_named(tmp_path, kind, key, match):
    from safetensors.torch import load_file, save_file
    make_hf_model(tmp_path, kind, **MOE[kind])
    f = tmp_path / "model.safetensors"
    sd = load_file(f)
    del sd[key]
    save_file(sd, f, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=match):
        load_model({"path": str(tmp_path)}, "cpu", "float32")


def test_stacked_expert_tensors_load_as_the_per_expert_ones(tmp_path):
    """A checkpoint whose experts are saved stacked ([E, 2I, H] gate and up, [E, H, I] down, the
    layout transformers 5 keeps in memory) loads to the same weights."""
    from safetensors.torch import load_file, save_file
    make_hf_model(tmp_path, "mixtral", **MOE["mixtral"])
    per_expert = load_model({"path": str(tmp_path)}, "cpu", "float32")
    f = tmp_path / "model.safetensors"
    sd = load_file(f)
    for layer in range(2):
        pre = f"model.layers.{layer}.block_sparse_moe.experts"
        w = {n: [sd.pop(f"{pre}.{e}.{n}.weight") for e in range(4)] for n in ("w1", "w2", "w3")}
        sd[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat((g, u)) for g, u in zip(w["w1"], w["w3"])])
        sd[f"model.layers.{layer}.mlp.experts.down_proj"] = torch.stack(w["w2"])
    save_file(sd, f, metadata={"format": "pt"})
    stacked = load_model({"path": str(tmp_path)}, "cpu", "float32")
    for (n, p), q in zip(per_expert.named_parameters(), stacked.parameters()):
        assert torch.equal(p, q), n


def test_an_expert_the_config_lacks_is_named(tmp_path):
    from safetensors.torch import load_file, save_file
    make_hf_model(tmp_path, "mixtral", **MOE["mixtral"])
    f = tmp_path / "model.safetensors"
    sd = load_file(f)
    sd["model.layers.0.block_sparse_moe.experts.4.w1.weight"] = \
        sd["model.layers.0.block_sparse_moe.experts.0.w1.weight"].clone()
    save_file(sd, f, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="experts.4.w1.weight is expert 4, the config says 4 "
                                         "experts"):
        load_model({"path": str(tmp_path)}, "cpu", "float32")


TINY_MOE = dict(name="tiny-moe", num_layers=3, hidden_size=32, intermediate_size=64,
                num_heads=4, num_kv_heads=2, head_dim=8, vocab_size=100, max_model_len=64,
                num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                shared_expert_intermediate_size=32, shared_expert_gate=False,
                first_dense_layers=1, norm_topk_prob=False, init_seed=3)


def test_random_weights_for_a_tiny_moe_preset():
    """Seeded random weights, a dense first layer, an ungated shared expert (DeepSeek's)."""
    a, b = (load_model(TINY_MOE, "cpu", "float32") for _ in range(2))
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
    layers = a.model.layers
    assert not isinstance(layers[0].mlp, SparseMoE)
    assert all(isinstance(layer.mlp, SparseMoE) for layer in layers[1:])
    assert layers[1].mlp.shared_expert_gate is None
    assert layers[1].mlp.experts.down_proj.shape == (4, 32, 16)
    assert sum(p.numel() for p in a.parameters()) == a.args.num_params()


def test_the_memory_estimate_counts_the_experts_activations():
    from sarathi_lab.models.loader import ACTIVATION_TOKENS, memory_estimate
    a = model_shape(TINY_MOE)
    est = memory_estimate(a, 4)
    assert est["weights"] == a.num_params() * 4
    # per token: residual 4*32, q/k/v/o 2*4*8, logits 100; the MoE MLP (wider than the dense
    # first layer's 3*64): 2 experts of 16 and the shared 32, gate/up/product (3*64), router
    # scores and probabilities (2*4), the token's copy and output per expert (2*2*32)
    per_token = 4 * 32 + 2 * 4 * 8 + 100 + 3 * 64 + 2 * 4 + 2 * 2 * 32
    assert est["activations"] == ACTIVATION_TOKENS * per_token * 4


def test_the_real_executor_refuses_what_it_cannot_run(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "deepseek_v3", "num_hidden_layers": 2, "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 256,
        "kv_lora_rank": 16}))
    with pytest.raises(ValueError, match=r"model.path: .*model_type 'deepseek_v3' does not run "
                                         r"on the real executor \(executor=torch runs llama, "
                                         r"mistral, qwen2, mixtral, qwen2_moe"):
        model_shape({"path": str(tmp_path)})
    # DeepSeek-MoE: a shape the simulator prices, but no checkpoint this executor reads
    with pytest.raises(ValueError, match=r"model.hf_config: .*model_type 'deepseek' does not run"):
        model_shape({"hf_config": "deepseek-moe-16b", "random_weights": True})


def test_a_shipped_moe_config_runs_on_random_weights():
    """model.hf_config=mixtral-8x7b's shape, shrunk to a test size: Mixtral's MoE layers."""
    from sarathi_lab.models.shape import read_shape
    big = read_shape("mixtral-8x7b")
    cfg = {**big.to_preset(), "num_layers": 2, "hidden_size": 64, "intermediate_size": 32,
           "moe_intermediate_size": 32, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
           "vocab_size": 128, "max_model_len": 64}
    model = load_model(cfg, "cpu", "float32")
    assert model.model.layers[0].mlp.experts.gate_up_proj.shape == (8, 64, 64)
    assert model.model.layers[0].mlp.top_k == 2 and model.model.layers[0].mlp.norm_topk_prob


@pytest.mark.slow   # a CLI subprocess
def test_cli_runs_a_moe_checkpoint(tmp_path):
    """executor=torch model.path=DIR on a JSONL trace of token ids: HF's greedy tokens."""
    model = make_hf_model(tmp_path / "m", "qwen2_moe", **MOE["qwen2_moe"])
    specs = make_specs(5, seed=6)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"prompt_token_ids": ids, "output_len": n}) + "\n"
                             for ids, n in specs))
    res = cli("executor=torch", f"model.path={tmp_path / 'm'}", "model.name=tiny-qwen2-moe",
              f"trace.path={trace}", "trace.qps=1000", "~hardware", "executor.kv_cache_gib=0.01",
              "scheduler.token_budget=16", "scheduler.block_size=4", "progress=false",
              f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    df = pd.read_parquet(tmp_path / "run" / "requests.parquet").sort_values("request_id")
    assert [list(x) for x in df["output_token_ids"]] == hf_generate(model, specs)
