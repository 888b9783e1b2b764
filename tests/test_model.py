"""The paged-KV model against Hugging Face: same logits for a flattened batch of prefill chunks,
weight loading (plain, sharded, tied, Qwen2 biases), RoPE scalings, and loader errors."""
import json

import pytest
import torch
from hf_oracle import TINY, make_hf_model

from sarathi_lab.kernels import get_backend
from sarathi_lab.models.llama import AttnMetadata
from sarathi_lab.models.loader import load_model, model_shape


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()   # tiny shapes: threads only add barrier waits
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def paged_logits(model, seqs, block_size=4, chunks=2, backend="torch"):
    """Run `seqs` (lists of ids) through our model in `chunks` steps, each step one flattened
    batch of every sequence's next chunk, over a paged cache with scrambled block ids.
    Returns each sequence's logits for all its positions."""
    a = model.args
    model.setup(get_backend(backend), "cpu")
    max_blocks = -(-max(map(len, seqs)) // block_size)
    nb = max_blocks * len(seqs) + 3
    k = torch.zeros(a.num_layers, nb, block_size, a.num_kv_heads, a.head_dim)
    v = torch.zeros_like(k)
    model.bind_cache(k, v)
    perm = torch.randperm(nb, generator=torch.Generator().manual_seed(1))
    tables = perm[:max_blocks * len(seqs)].view(len(seqs), max_blocks).to(torch.int32)
    out = [[] for _ in seqs]
    done = [0] * len(seqs)
    for step in range(chunks):
        active = [i for i, s in enumerate(seqs) if done[i] < len(s)]
        ids, pos, lens, cu = [], [], [], [0]
        for i in active:
            s = seqs[i]
            end = len(s) if step == chunks - 1 else max(done[i] + 1, len(s) * (step + 1) // chunks)
            ids += s[done[i]:end]
            pos += range(done[i], end)
            lens.append(end)
            cu.append(cu[-1] + end - done[i])
            done[i] = end
        pos, bt = torch.tensor(pos), tables[active]
        seq_of = torch.repeat_interleave(torch.arange(len(active)), torch.tensor(cu).diff())
        slots = bt[seq_of, pos // block_size].long() * block_size + pos % block_size
        meta = AttnMetadata(slots, bt, torch.tensor(cu, dtype=torch.int32),
                            torch.tensor(lens, dtype=torch.int32))
        logits = model(torch.tensor(ids), pos, meta)
        for j, i in enumerate(active):
            out[i].append(logits[cu[j]:cu[j + 1]])
    return [torch.cat(o) for o in out]


VARIANTS = {
    "llama": ("llama", {}),
    "llama-linear-rope": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "llama3-rope": ("llama", {"rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}}),
    "llama-bias-tied": ("llama", {"attention_bias": True, "mlp_bias": True,
                                  "tie_word_embeddings": True}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "mistral-mha": ("mistral", {"num_key_value_heads": 4, "head_dim": 32}),
    # a window shorter than the sequences and than a chunk: it must bite
    "mistral-window": ("mistral", {"sliding_window": 8}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_equal_hugging_face(tmp_path, variant):
    kind, overrides = VARIANTS[variant]
    hf = make_hf_model(tmp_path, kind, **overrides)
    ours = load_model({"name": variant, "path": str(tmp_path)}, "cpu", "float32")
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (1, 9, 37, 70)]
    got = paged_logits(ours, seqs, chunks=3)
    for s, lg in zip(seqs, got):
        with torch.no_grad():
            ref = hf(torch.tensor([s])).logits[0]
        torch.testing.assert_close(lg, ref, rtol=1e-4, atol=1e-4)


def test_sharded_checkpoint_and_logits_rows(tmp_path):
    hf = make_hf_model(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours = load_model({"name": "sharded", "path": str(tmp_path)}, "cpu", "float32")
    seq = list(range(3, 40))
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0]
    torch.testing.assert_close(paged_logits(ours, [seq], chunks=1)[0], ref, rtol=1e-4, atol=1e-4)
    # logits_indices: only the rows that sample go through the head
    meta_rows = torch.tensor([len(seq) - 1])
    k = ours.model.layers[0].self_attn.k_cache
    k.zero_()
    pos = torch.arange(len(seq))
    bt = torch.arange(k.shape[0], dtype=torch.int32)[None]
    meta = AttnMetadata(pos.clone(), bt, torch.tensor([0, len(seq)], dtype=torch.int32),
                        torch.tensor([len(seq)], dtype=torch.int32))
    one = ours(torch.tensor(seq), pos, meta, meta_rows)
    torch.testing.assert_close(one, ref[-1:], rtol=1e-4, atol=1e-4)


def test_random_init_is_seeded_and_sized():
    preset = dict(name="t", num_layers=2, hidden_size=32, intermediate_size=64, num_heads=4,
                  num_kv_heads=2, head_dim=8, vocab_size=100, max_model_len=64,
                  tie_word_embeddings=True, init_seed=3)
    a, b = (load_model(preset, "cpu", "float32") for _ in range(2))
    c = load_model({**preset, "init_seed": 4}, "cpu", "float32")
    for (n, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), n
        if "norm" not in n:
            assert not torch.equal(p, r), n
    assert a.lm_head.weight is a.model.embed_tokens.weight
    assert sum(p.numel() for p in a.parameters()) == a.args.num_params()
    half = load_model(preset, "cpu", "bfloat16")
    assert half.lm_head.weight.dtype == torch.bfloat16
    assert half.lm_head.weight is half.model.embed_tokens.weight


def test_loader_errors_name_the_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json in .*" + tmp_path.name):
        load_model({"path": str(tmp_path)}, "cpu", "float32")
    with pytest.raises(FileNotFoundError, match="nowhere.*no such directory"):
        load_model({"path": str(tmp_path / "nowhere")}, "cpu", "float32")
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "llama"}))
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_model({"path": str(tmp_path)}, "cpu", "float32")
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        model_shape({"path": str(tmp_path)})
    with pytest.raises(ValueError, match="lacks hidden_size, intermediate_size"):
        model_shape({"name": "x", "num_layers": 1})
    with pytest.raises(ValueError, match="executor.dtype=.float8.: the torch executor does not"):
        load_model({"path": None, "name": "x", **_preset()}, "cpu", "float8")


def test_checkpoint_missing_a_weight(tmp_path):
    from safetensors.torch import load_file, save_file
    make_hf_model(tmp_path)
    f = tmp_path / "model.safetensors"
    sd = load_file(f)
    del sd["model.layers.1.mlp.up_proj.weight"]
    save_file(sd, f, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lacks model.layers.1.mlp.gate_up_proj.weight"):
        load_model({"path": str(tmp_path)}, "cpu", "float32")


def _preset():
    return dict(num_layers=1, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2,
                head_dim=8, vocab_size=100, max_model_len=64)
