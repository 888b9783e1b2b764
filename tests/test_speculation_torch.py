"""Speculative decoding on the real executor: a truncated-layer draft over the target's paged KV,
greedy verification. The oracle: the tokens equal non-speculative greedy decoding (Hugging Face
`generate`, which the executor's plain greedy output already equals), for every k, draft depth,
attention backend, and with prefill chunks in the same batches."""
from types import SimpleNamespace

import pytest
import torch
from helpers import patience

# one_thread and oracle are fixtures: imported, they apply here (one_thread is autouse)
from hf_oracle import one_thread, oracle, run_engine, with_eos  # noqa: F401

from sarathi_lab.request import Request, Status
from sarathi_lab.run import runner
from sarathi_lab.settings import ConfigError


def build(path, draft, backend="torch", block_size=4, **executor):
    cfg = {"executor": {"name": "torch", "device": "cpu", "dtype": "float32",
                        "attention_backend": backend, "kv_cache_gib": 0.01, "seed": 0,
                        "draft": draft, **executor},
           "model": {"name": "hf-tiny", "path": str(path)},
           "scheduler": {"name": "sarathi", "block_size": block_size}}
    policy, ex = runner.build(cfg)
    ex.bind(policy.kv)
    return ex, policy.kv


def drive(ex, kv, specs, k, chunk):
    """A hand-built schedule, no policy: each step every decoding request speculates k tokens
    (fewer when its stop is nearer: it never needs more), and the first unfinished prompt
    advances by a chunk of up to `chunk` tokens in the same batch. Returns the requests and,
    per speculative entry, (k, accepted)."""
    reqs = [Request(i, 0.0, len(ids), n, prompt_token_ids=list(ids))
            for i, (ids, n) in enumerate(specs)]
    for r in reqs:
        assert ex.add_request(r, r.take_output_len()) is None
    stop = ex.stop_lengths()
    live, spec_log = list(reqs), []
    while live:
        out = SimpleNamespace(reqs=[], num_new_tokens=[], spec_lens=[], preempted=[], rejected=[],
                              swapped_out=[], swapped_in=[])
        for r in live:
            if r.num_output_tokens:   # a decode: its last token + k drafts
                kk = min(k, stop[r.request_id] - r.num_output_tokens - 1)
                n = 1 + kk
            elif r.num_computed_tokens < r.num_prompt_tokens and \
                    not any(x.num_output_tokens == 0 for x in out.reqs):
                kk, n = 0, min(chunk, r.num_prompt_tokens - r.num_computed_tokens)
            else:
                continue
            assert kv.allocate_slots(r, n) is not None
            out.reqs.append(r)
            out.num_new_tokens.append(n)
            out.spec_lens.append(kk)
        step = ex.execute(out)
        for i, (r, n, kk) in enumerate(zip(out.reqs, out.num_new_tokens, out.spec_lens)):
            a = step.accepted[i] if kk else 0
            if kk:
                spec_log.append((kk, a))
                assert len(step.accepted_ids[i]) == a
            m = step.emitted[i] if step.emitted is not None else int(step.sampled[i] >= 0)
            assert m == (min(1 + a, stop[r.request_id] - r.num_output_tokens) if kk else
                         int(step.sampled[i] >= 0))
            r.num_computed_tokens += m if kk else n
            r.output_token_ids += ((step.accepted_ids[i] if kk else []) + [step.sampled[i]])[:m]
            r.num_output_tokens += m
            if i in step.finished:
                assert r.num_output_tokens == stop[r.request_id]
                kv.free(r)
                live.remove(r)
            else:
                assert r.num_output_tokens < stop[r.request_id]
    return reqs, spec_log


@pytest.mark.parametrize("k,draft,chunk", [(1, "layers:1", 16), (3, "layers:1", 7),
                                           (3, "layers:2", 16)])
def test_hand_built_speculative_steps_equal_greedy(oracle, k, draft, chunk):
    """k drafts per decode, prefill chunks beside them: the tokens are greedy decoding's."""
    path, specs, ref = oracle
    ex, kv = build(path, draft)
    reqs, log = drive(ex, kv, specs, k, chunk)
    assert [r.output_token_ids for r in reqs] == ref
    proposed, accepted = sum(kk for kk, _ in log), sum(a for _, a in log)
    assert proposed > 100
    if draft == "layers:2":   # the whole model as its own draft: every draft is right
        assert accepted == proposed
    else:                     # one layer of two: some right, not all
        assert 0 < accepted < proposed


@pytest.mark.slow   # the Triton interpreter
def test_triton_kernels_speculate_the_same(oracle):
    """The Triton kernels (TRITON_INTERPRET=1 on a CPU, tests/conftest.py) on a few short
    requests: drafts, verification chunks and a prefill chunk in one batch."""
    path, specs, ref = oracle
    picks = [1, 3, 7]   # prompts of 2, 5 and 9 tokens; greedy prefixes of HF's outputs
    ex, kv = build(path, "layers:2", backend="triton")
    reqs, log = drive(ex, kv, [(specs[i][0], 6) for i in picks], 2, 4)
    assert [r.output_token_ids for r in reqs] == [ref[i][:6] for i in picks]
    assert log and all(a == kk for kk, a in log)


@pytest.mark.parametrize("draft,words", [
    ("layers:0", "expected layers:N with N >= 1"),
    ("layers:x", "expected layers:N with N >= 1"),
    ("layers:3", "the model has 2 layers"),
    ("tiny llama", "expected layers:N or a model preset's name"),
    ("no-such-model", "no such model preset"),
    ("tiny-llama", "its vocabulary of 512 tokens is not the target's 256"),
])
def test_a_bad_draft_names_the_setting(oracle, draft, words):
    with pytest.raises(ConfigError, match=f"executor.draft='?{draft}'?: .*{words}"):
        build(oracle[0], draft)


def test_drafts_are_verified_greedily_only(oracle):
    with pytest.raises(ConfigError, match="temperature=0.5: the drafts are verified greedily"):
        build(oracle[0], "layers:1", temperature=0.5)


def test_a_speculative_entry_must_be_a_decode(oracle):
    path, specs, _ = oracle
    ex, kv = build(path, "layers:1")
    r = Request(0, 0.0, len(specs[2][0]), 4, prompt_token_ids=list(specs[2][0]))
    ex.add_request(r, r.take_output_len())
    kv.allocate_slots(r, 3)
    out = SimpleNamespace(reqs=[r], num_new_tokens=[3], spec_lens=[2], preempted=[], rejected=[],
                          swapped_out=[], swapped_in=[])
    with pytest.raises(ValueError, match="request 0: a speculative entry of k=2 must be a "
                                         "decode of 1 \\+ k tokens after all of its KV"):
        ex.execute(out)


# --- through the engine: the policy schedules 1 + k tokens per decode -------------------------

ENGINE_CASES = {
    # k, draft, scheduler settings
    "sarathi-k1-c16": (1, "layers:1", dict(token_budget=16, block_size=4)),
    "sarathi-k3-c16": (3, "layers:1", dict(token_budget=16, block_size=4)),
    "sarathi-k3-all-layers": (3, "layers:2", dict(token_budget=32, block_size=16)),
    "vllm-k2": (2, "layers:1", dict(name="vllm", block_size=4)),
    # 96 tokens of KV for 18 requests of up to 75 tokens: preemption, recompute, then swap
    "sarathi-k3-preempt": (3, "layers:2", dict(token_budget=16, block_size=4, num_kv_blocks=24)),
    "sarathi-k2-swap": (2, "layers:1", dict(token_budget=16, block_size=4, num_kv_blocks=24,
                                            preemption_mode="swap", num_swap_blocks=40)),
}


@pytest.mark.parametrize("case", list(ENGINE_CASES))
def test_speculative_runs_equal_greedy(oracle, case):
    path, specs, ref = oracle
    k, draft, sched = ENGINE_CASES[case]
    reqs, engine = run_engine(path, specs, executor={"draft": draft},
                              num_speculative_tokens=k, **sched)
    assert [r.output_token_ids for r in reqs] == ref
    proposed = sum(r.spec_proposed for r in reqs)
    accepted = sum(r.spec_accepted for r in reqs)
    it = engine.iteration_columns()
    assert proposed == it["spec_proposed"].sum() > 50
    assert accepted == it["spec_accepted"].sum()
    if "sarathi" in case:   # prefill chunks ran beside speculative decodes
        assert ((it["spec_steps"] > 0) & (it["prefill_tokens"] > 0)).sum() > 5
    if draft == "layers:2":   # the target as its own draft
        assert accepted == proposed
    else:
        assert 0 < accepted < proposed
    if "preempt" in case or "swap" in case:
        assert sum(r.num_preemptions for r in reqs) > 0
    assert len(engine.executor.sequence_kv) == 0   # every request's KV copy was dropped


def test_an_accepted_eos_ends_the_request_there(oracle, tmp_path):
    """EOS inside the accepted drafts: the tokens after it are not emitted; the drafts the
    target accepted past it still count as accepted (they measure the draft)."""
    path, specs, ref = oracle
    i = next(i for i, (_, n) in enumerate(specs) if n >= 8 and ref[i][2] not in ref[i][:2])
    eos = ref[i][2]
    d = with_eos(path, tmp_path, eos)
    reqs, _ = run_engine(d, specs, executor={"draft": "layers:2"}, num_speculative_tokens=3,
                         token_budget=16, block_size=4)
    for r, want, (_, n) in zip(reqs, ref, specs):
        cut = want.index(eos) + 1 if eos in want else n
        assert r.output_token_ids == want[:cut]
        assert r.finish_reason == ("eos" if eos in want else "length")
    # request i's first decode step (output 1) proposes 3 drafts: tokens 2, 3 and 4 of its
    # output; the EOS is token 3, so the step emits 2 and ends it, with all 3 accepted
    assert reqs[i].num_output_tokens == 3
    assert reqs[i].spec_proposed == reqs[i].spec_accepted == 3


def test_speculation_settings_are_checked_at_start_up(oracle):
    from sarathi_lab.run.config import resolve
    base = {"executor": {"name": "torch", "device": "cpu"},
            "model": {"name": "hf-tiny", "path": str(oracle[0])},
            "scheduler": {"name": "sarathi"}}
    no_draft = {**base, "scheduler": {"name": "sarathi", "num_speculative_tokens": 2}}
    with pytest.raises(ConfigError, match="num_speculative_tokens=2: the torch executor needs "
                                          "a draft model.*set executor.draft"):
        resolve(no_draft)
    no_k = {**base, "executor": {**base["executor"], "draft": "layers:1"}}
    with pytest.raises(ConfigError, match="executor.draft: read only with "
                                          "scheduler.num_speculative_tokens > 0"):
        resolve(no_k, ["executor.draft=layers:1"])


@pytest.mark.slow   # CLI subprocesses
def test_cli_speculation_equals_plain_greedy(tmp_path):
    """From the command line, on tiny-llama's random weights: the same output ids with and
    without speculation, and the summary's acceptance is the requests' own."""
    import json
    import os
    import subprocess
    import sys

    import pandas as pd
    script = os.path.join(os.path.dirname(sys.executable), "sarathi-lab")
    base = [script, "executor=torch", "model=tiny-llama", "trace=synthetic",
            "trace.num_requests=6", "executor.kv_cache_gib=0.01", "progress=false",
            "num_threads=1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    runs = {"plain": [], "spec": ["scheduler.num_speculative_tokens=3",
                                  "executor.draft=layers:1"]}
    for d, args in runs.items():
        p = subprocess.run([*base, *args, f"hydra.run.dir={tmp_path / d}"], capture_output=True,
                           text=True, timeout=patience(300), cwd=tmp_path, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
    plain, spec = (pd.read_parquet(tmp_path / d / "requests.parquet").sort_values("request_id")
                   for d in runs)
    assert [list(x) for x in spec["output_token_ids"]] == \
        [list(x) for x in plain["output_token_ids"]]
    s = json.loads((tmp_path / "spec" / "summary.json").read_text())["speculation"]
    assert s["proposed"] == spec["spec_proposed"].sum() > 0
    assert s["accepted"] == spec["spec_accepted"].sum() > 0
    assert s["acceptance_rate"] == pytest.approx(s["accepted"] / s["proposed"])


def test_a_speculating_server_refuses_sampling():
    """A request's temperature > 0 is refused (400, naming it) before it reaches the engine,
    where the greedy verification could not honour it; temperature 0 is taken."""
    import asyncio
    from types import SimpleNamespace

    from sarathi_lab.engine import Engine
    from sarathi_lab.serve.app import Server
    from sarathi_lab.serve.engine_process import _info
    from sarathi_lab.serve.protocol import ApiError
    policy, ex = runner.build({
        "executor": {"name": "torch", "device": "cpu", "kv_cache_gib": 0.01,
                     "draft": "layers:1"},
        "model": {"name": "tiny-llama", "num_layers": 2, "hidden_size": 32,
                  "intermediate_size": 64, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8,
                  "vocab_size": 100, "max_model_len": 64},
        "scheduler": {"name": "sarathi", "num_speculative_tokens": 2}})
    # what the engine process tells the HTTP side (`EngineClient.info`)
    info = _info(Engine(policy, ex), policy, ex)
    assert info["greedy_only"]
    server = Server(SimpleNamespace(info=info), "tiny-llama", 8)

    class Body:
        def __init__(self, temperature):
            self.body = {"model": "tiny-llama", "prompt": [1, 2, 3], "max_tokens": 4,
                         "temperature": temperature}

        async def text(self):   # the server reads the raw body (aiohttp's request.text)
            import json
            return json.dumps(self.body)

    with pytest.raises(ApiError, match="temperature=0.7: this server decodes speculatively") \
            as e:
        asyncio.run(server._read(Body(0.7), chat=False))
    assert e.value.status == 400
    assert asyncio.run(server._read(Body(0), chat=False)).temperature == 0


# --- a separate draft model with a KV cache of its own -----------------------------------------

def run_tiny(specs, noise, draft=None, k=0, backend="torch", **sched):
    """tiny-llama (seeded random weights) as the target, its last MLP perturbed by `noise`
    (a seeded Gaussian of that std), through the engine."""
    from sarathi_lab.engine import Engine
    from sarathi_lab.executors.sim import model_preset
    cfg = {"executor": {"name": "torch", "device": "cpu", "dtype": "float32",
                        "kv_cache_gib": 0.01, "draft": draft, "attention_backend": backend},
           "model": model_preset("tiny-llama"),
           "scheduler": {"name": "sarathi", "num_speculative_tokens": k, **sched}}
    policy, ex = runner.build(cfg)
    w = ex.model.model.layers[-1].mlp.down_proj.weight
    with torch.no_grad():
        w += noise * torch.randn(w.shape, generator=torch.Generator().manual_seed(7))
    reqs = [Request(i, 0.0, len(ids), n, prompt_token_ids=list(ids))
            for i, (ids, n) in enumerate(specs)]
    engine = Engine(policy, ex)
    engine.run(reqs)
    assert all(r.status is Status.FINISHED for r in reqs)
    return reqs, ex


NOISE = 0.05   # the perturbed target accepts about half of the unperturbed draft's tokens


@pytest.fixture(scope="module")
def tiny_specs():
    g = torch.Generator().manual_seed(1)
    lens, outs = [3, 40, 17, 9, 28, 5], [20, 12, 30, 8, 16, 25]
    return [(torch.randint(0, 512, (p,), generator=g).tolist(), o) for p, o in zip(lens, outs)]


@pytest.mark.parametrize("noise,k,sched", [
    (0.0, 3, dict(token_budget=16, block_size=4)),                    # the draft is the target
    (NOISE, 2, dict(token_budget=16, block_size=4)),                  # a perturbed target
    (NOISE, 3, dict(token_budget=16, block_size=4, num_kv_blocks=14)),  # preempted, recomputed
    (NOISE, 3, dict(token_budget=16, block_size=4, num_kv_blocks=14, preemption_mode="swap",
                    num_swap_blocks=40)),
])
def test_a_draft_model_with_its_own_kv_equals_greedy(tiny_specs, noise, k, sched):
    """draft=tiny-llama proposes for tiny-llama: unperturbed it is the same model, so every
    draft is accepted (its lazily computed KV is right); perturbed, some; either way the output
    is the plain run's, also when preemption takes the blocks away."""
    plain, _ = run_tiny(tiny_specs, noise, **sched)
    reqs, ex = run_tiny(tiny_specs, noise, "tiny-llama", k, **sched)
    assert [r.output_token_ids for r in reqs] == [r.output_token_ids for r in plain]
    proposed = sum(r.spec_proposed for r in reqs)
    accepted = sum(r.spec_accepted for r in reqs)
    assert proposed > 40
    assert accepted == proposed if noise == 0 else 0 < accepted < proposed
    if "num_kv_blocks" in sched:
        assert sum(r.num_preemptions for r in reqs) > 0
    assert not ex.draft.valid   # forgotten as the requests ended


@pytest.mark.slow   # the Triton interpreter
def test_triton_kernels_run_a_draft_model_the_same(tiny_specs):
    specs = [(ids, 6) for ids, _ in tiny_specs[:3]]
    plain, _ = run_tiny(specs, NOISE, backend="triton", token_budget=8, block_size=4)
    reqs, _ = run_tiny(specs, NOISE, "tiny-llama", 2, backend="triton", token_budget=8,
                       block_size=4)
    assert [r.output_token_ids for r in reqs] == [r.output_token_ids for r in plain]
    assert sum(r.spec_accepted for r in reqs) > 0
