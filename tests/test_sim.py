"""The simulator executor and its roofline cost model."""
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from sarathi_lab.costmodels.roofline import RooflineCostModel
from sarathi_lab.executors.base import Executor, StepResult
from sarathi_lab.executors.sim import SimExecutor
from sarathi_lab.request import Request
from sarathi_lab.schedulers.output import SchedulerOutput

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
MODELS = ["llama-3-8b", "mistral-7b", "yi-34b", "llama-2-7b", "llama-2-70b"]
HARDWARE = ["a100-80gb", "h100-sxm", "h200"]


def preset(group, name):
    return yaml.safe_load((CONFIGS / group / f"{name}.yaml").read_text())


def sim(model="llama-2-7b", hw="a100-80gb", **executor):
    cfg = preset("executor", "sim")
    cfg.update(executor)
    return SimExecutor.from_config(cfg, preset("model", model), preset("hardware", hw))


def decode_req(rid, context, prompt=4):
    """A running request whose next step decodes, with `context` tokens in its KV cache."""
    r = Request(rid, 0.0, prompt, 10_000)
    r.num_output_tokens = context + 1 - prompt
    r.num_computed_tokens = context
    assert r.is_decoding
    return r


# ---- presets -------------------------------------------------------------------------------

# Parameter counts of the Hugging Face checkpoints (no biases: weights = these x 2 bytes).
PARAMS = {"llama-2-7b": 6_738_415_616, "llama-2-70b": 68_976_648_192,
          "llama-3-8b": 8_030_261_248, "mistral-7b": 7_241_732_096, "yi-34b": 34_388_917_248}


@pytest.mark.parametrize("name", MODELS)
def test_model_presets_share_a_schema_and_match_parameter_counts(name):
    cfg = preset("model", name)
    assert set(cfg) == set(preset("model", "mistral-7b"))
    assert cfg["name"] == name and cfg["hidden_size"] == cfg["num_heads"] * cfg["head_dim"]
    tp = 4 if name == "llama-2-70b" else 1
    cm = RooflineCostModel(cfg, preset("hardware", "h200"), tp)
    assert cm.weight_bytes * tp == pytest.approx(2 * PARAMS[name], rel=1e-3 if tp > 1 else 1e-12)


@pytest.mark.parametrize("name", HARDWARE)
def test_hardware_presets_load_with_calibrated_factors(name):
    cfg = preset("hardware", name)
    assert cfg["name"] == name
    for key in ("peak_flops", "mem_bandwidth", "link_bandwidth"):
        assert isinstance(cfg[key], float) and cfg[key] > 1e11
    for key in ("compute_eff", "attn_eff", "mem_eff", "attn_kv_eff", "link_eff", "fast_ar_eff"):
        assert 0.1 < cfg[key] <= 1.0
    assert 1 <= cfg["ridge_exponent"] <= 3 and 0 < cfg["request_overhead_s"] < 1e-3
    # the one-shot all-reduce is latency-bound (faster than NCCL's ring on small messages), or
    # absent (1 s: A100, where it was not measured)
    assert 0 < cfg["fast_ar_latency_s"] < cfg["link_latency_s"] or cfg["fast_ar_latency_s"] == 1.0
    assert 0 < cfg["layer_overhead_s"] < 1e-3 and 0 < cfg["iteration_overhead_s"] < 1e-2


# ---- the roofline's shape ------------------------------------------------------------------

def test_decode_batch1_is_the_weight_read_plus_overheads():
    ex = sim()
    hw = preset("hardware", "a100-80gb")
    out = SchedulerOutput()
    out.add(decode_req(0, 100), 1)
    expected = ex.cost_model.weight_bytes / (hw["mem_bandwidth"] * hw["mem_eff"]) \
        + hw["iteration_overhead_s"] + hw["request_overhead_s"] + 32 * hw["layer_overhead_s"]
    got = ex.execute(out).duration
    assert got == pytest.approx(expected, rel=0.10)
    assert 8e-3 < got < 15e-3     # Llama-2-7B on an A100: ~13.5 GB at ~1.5 TB/s + overheads


def test_decode_time_grows_with_context():
    cm = sim().cost_model
    times = [cm.iteration_time([], [k] * 16) for k in (16, 512, 2048, 4000)]
    assert times == sorted(times) and times[-1] > times[0] * 1.2
    # attention reads k + 1 tokens of KV per decode
    assert cm.attention_time([], [99]) == pytest.approx(100 * cm.decode_per_kv_token)


def test_tensor_parallel_halves_the_weight_read_and_adds_all_reduces():
    one, two = sim().cost_model, sim(tensor_parallel=2).cost_model
    assert two.linear_time(1) == pytest.approx(one.linear_time(1) / 2, rel=1e-12)
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert one.allreduce_time(256) == 0.0
    hw = preset("hardware", "a100-80gb")
    # ring all-reduce: each GPU moves 2 (tp - 1) / tp = 1 x the message at tp = 2 (the 2 MiB of
    # 256 tokens: past the one-shot kernel's range)
    per = hw["link_latency_s"] + 2 * hw["ar_step_latency_s"] \
        + 1.0 * 256 * 4096 * 2 / (hw["link_bandwidth"] * hw["link_eff"])
    assert two.allreduce_time(256) == pytest.approx(2 * 32 * per, rel=1e-12)
    b1, b2 = one.breakdown([(256, 0)], []), two.breakdown([(256, 0)], [])
    assert b2["allreduce"] > 0 and b2["linear"] < b1["linear"]


def test_tensor_parallel_must_divide_the_heads():
    with pytest.raises(ValueError, match="tensor_parallel=3"):
        sim(tensor_parallel=3)


def test_efficiency_overrides_from_the_executor_config():
    half = preset("hardware", "a100-80gb")["mem_eff"] / 2
    base, slow = sim(), sim(mem_eff=half)
    assert slow.cost_model.lin_weights == pytest.approx(2 * base.cost_model.lin_weights)
    assert sim(mem_eff=None).cost_model.lin_weights == base.cost_model.lin_weights


# ---- the executor --------------------------------------------------------------------------

def test_execute_on_real_requests_equals_iteration_time():
    ex = sim("mistral-7b", "h100-sxm", tensor_parallel=2)
    assert isinstance(ex, Executor) and ex.supports_fast_forward
    first = Request("a", 0.0, 1000, 50)            # first chunk of a long prompt: no sample
    last = Request("b", 0.0, 700, 50)              # last chunk: samples
    last.num_computed_tokens = 512
    recompute = Request("c", 0.0, 300, 50)         # preempted after 20 outputs: recomputes all
    recompute.num_output_tokens = 20
    decodes = [decode_req(i, 100 + 37 * i) for i in range(5)]
    out = SchedulerOutput()
    for r in decodes[:3]:
        out.add(r, 1)
    out.add(first, 256)
    out.add(last, 188)
    for r in decodes[3:]:
        out.add(r, 1)
    out.add(recompute, 320)
    step = ex.execute(out)
    assert isinstance(step, StepResult) and step.sampled is None
    expected = ex.cost_model.iteration_time(
        [(256, 0), (188, 512), (320, 0)], [r.num_computed_tokens for r in decodes], num_sampled=7)
    assert step.duration == pytest.approx(expected, rel=1e-12)
    parts = ex.cost_model.breakdown([(256, 0), (188, 512), (320, 0)],
                                    [r.num_computed_tokens for r in decodes], num_sampled=7)
    assert parts["total"] == pytest.approx(expected, rel=1e-12)


def test_decode_run_equals_repeated_steps():
    ex = sim("llama-3-8b", "a100-80gb", tensor_parallel=2)
    reqs = [decode_req(i, c) for i, c in enumerate([5, 80, 1023, 4000, 17])]
    ctx = np.array([r.num_computed_tokens for r in reqs])
    k = 50
    fast = ex.decode_run(ctx, k)
    slow = []
    for _ in range(k):
        out = SchedulerOutput()
        for r in reqs:
            out.add(r, 1)
        slow.append(ex.execute(out).duration)
        for r in reqs:                       # what the engine does after a decode step
            r.num_computed_tokens += 1
            r.num_output_tokens += 1
    assert fast.shape == (k,)
    np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=0)
    assert np.all(np.diff(fast) > 0)


def test_num_kv_blocks_mistral_on_a100_by_hand():
    ex = sim("mistral-7b", "a100-80gb")
    weights = 7_241_732_096 * 2                         # bf16 parameters
    kv_per_token = 32 * 2 * 8 * 128 * 2                 # layers x (K, V) x kv heads x dim x bytes
    activations = 8192 * 2 * (2 * 4096 + 48 * 128 + 3 * 14336) + 256 * 32000 * 4
    free = 81920 * 2**20 * 0.9 - weights - 2**30 - activations
    assert ex.num_kv_blocks(16) == int(free // (16 * kv_per_token))
    assert 26_000 < ex.num_kv_blocks(16) < 30_000      # ~440k tokens, ~55 GiB of KV
    assert ex.max_model_len() == 32768


def test_num_kv_blocks_rejects_a_model_that_does_not_fit():
    with pytest.raises(ValueError, match=r"llama-2-70b.*a100-80gb.*tensor_parallel=1") as e:
        sim("llama-2-70b", "a100-80gb").num_kv_blocks(16)
    assert "tensor_parallel=2" in str(e.value)          # the suggestion
    assert sim("llama-2-70b", "a100-80gb", tensor_parallel=4).num_kv_blocks(16) > 10_000


def test_accepts_dictconfigs_and_stays_fast():
    from omegaconf import OmegaConf
    ex = SimExecutor.from_config(OmegaConf.create({"name": "sim", "tensor_parallel": 2}),
                                 OmegaConf.load(CONFIGS / "model/yi-34b.yaml"),
                                 OmegaConf.load(CONFIGS / "hardware/h200.yaml"))
    out = SchedulerOutput()
    for i in range(29):
        out.add(decode_req(i, 200 + i), 1)
    out.add(Request("p", 0.0, 2000, 10), 512)
    import time
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        ex.execute(out)
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 100e-6          # a few µs in practice; loose for busy CI machines


def test_num_kv_blocks_beyond_the_simulated_gpu_is_an_error():
    from sarathi_lab.run.runner import build
    cfg = {"executor": preset("executor", "sim"), "model": preset("model", "mistral-7b"),
           "hardware": preset("hardware", "a100-80gb"),
           "scheduler": {"name": "sarathi", "num_kv_blocks": 10**9}}
    fit = sim("mistral-7b").num_kv_blocks(16)
    with pytest.raises(ValueError, match=f"num_kv_blocks=1000000000: more than the {fit} blocks"):
        build(cfg)
    cfg["scheduler"]["num_kv_blocks"] = fit    # exactly what fits: fine
    assert build(cfg)[0].kv.num_blocks == fit


# ---- step jitter -------------------------------------------------------------------------------

def _decode_batch(n=4):
    out = SchedulerOutput()
    for i in range(n):
        out.add(decode_req(i, 200 + 10 * i), 1)
    return out


def test_step_jitter_by_hand():
    """Each executed batch: the cost model's time times exp(sigma z), z the seeded stream's
    next standard normal, one draw per batch, in order; no fast-forward."""
    plain, jittered = sim(), sim(step_jitter=0.3, step_jitter_seed=7)
    assert plain.supports_fast_forward and not jittered.supports_fast_forward
    z = np.random.default_rng(7).standard_normal(5)
    base = plain.execute(_decode_batch()).duration
    got = [jittered.execute(_decode_batch()).duration for _ in range(5)]
    assert got == pytest.approx(list(base * np.exp(0.3 * z)), rel=1e-12)
    assert len(set(got)) == 5


def test_step_jitter_keeps_the_median_and_its_seed_gives_the_same_run():
    a = sim(step_jitter=0.2, step_jitter_seed=1)
    base = sim().execute(_decode_batch()).duration
    f = np.array([a.execute(_decode_batch()).duration for _ in range(4000)]) / base
    assert np.median(f) == pytest.approx(1.0, abs=0.02)
    # log-sd 0.2: p90/p10 = exp(2 x 1.2816 x 0.2)
    assert np.percentile(f, 90) / np.percentile(f, 10) == pytest.approx(np.exp(0.5126), rel=0.05)
    again = sim(step_jitter=0.2, step_jitter_seed=1)
    other = sim(step_jitter=0.2, step_jitter_seed=2)
    first = [again.execute(_decode_batch()).duration for _ in range(3)]
    assert first == pytest.approx(list(f[:3] * base), rel=1e-12)
    assert [other.execute(_decode_batch()).duration for _ in range(3)] != first


def test_step_jitter_with_memory_by_hand():
    """rho = 0.8, sigma = 0.3, seed 5: the first log factor e_0 = sigma z_0 (the stationary
    law), then per batch e_t = 0.8 e_(t-1) + 0.6 sigma z_t (sqrt(1 - 0.64) = 0.6), the z's the
    seeded stream's standard normals in order; each batch's time the cost model's times
    exp(e_t)."""
    base = sim().execute(_decode_batch()).duration
    a = sim(step_jitter=0.3, step_jitter_seed=5, step_jitter_memory=0.8)
    z = np.random.default_rng(5).standard_normal(7)
    e, want = 0.3 * z[0], []
    for k in range(1, 7):
        e = 0.8 * e + 0.6 * 0.3 * z[k]
        want.append(base * np.exp(e))
    assert [a.execute(_decode_batch()).duration for _ in range(6)] == pytest.approx(want,
                                                                                    rel=1e-12)


def test_step_jitter_memory_keeps_the_spread_and_makes_slow_steps_come_in_runs():
    """Over 20,000 batches: the log factors' sd stays sigma and their lag-1 correlation is rho
    (independent draws: about 0)."""
    base = sim().execute(_decode_batch()).duration
    for rho in (0.0, 0.85):
        a = sim(step_jitter=0.2, step_jitter_seed=2, step_jitter_memory=rho)
        e = np.log([a.execute(_decode_batch()).duration / base for _ in range(20_000)])
        assert e.std() == pytest.approx(0.2, rel=0.1)
        assert np.corrcoef(e[:-1], e[1:])[0, 1] == pytest.approx(rho, abs=0.03)


@pytest.mark.parametrize("over, match", [
    ({"step_jitter_seed": 3}, "step_jitter_seed=3: read only with executor.step_jitter"),
    ({"step_jitter_memory": 0.5}, "step_jitter_memory=0.5: read only with executor.step_jitter"),
    ({"step_jitter": 0.1, "step_jitter_memory": 1.0}, "step_jitter_memory"),
    ({"step_jitter": 0.1, "step_jitter_memory": -0.1}, "step_jitter_memory"),
    ({"step_jitter": 0.1, "pipeline_parallel": 2}, "one stage only"),
    ({"step_jitter": 0.0}, "step_jitter"),
    ({"step_jitter": 5.0}, "step_jitter"),
])
def test_step_jitter_settings_are_checked(over, match):
    from sarathi_lab.settings import ConfigError
    with pytest.raises(ConfigError, match=match):
        sim(**over)


@pytest.mark.slow   # a CLI subprocess
def test_step_jitter_from_the_cli(tmp_path):
    import json

    from helpers import cli
    runs = {}
    for name, extra in (("plain", []), ("jitter", ["executor.step_jitter=0.2"])):
        r = cli(f"hydra.run.dir={tmp_path}/{name}", "model=tiny-llama", "hardware=a100-80gb",
                "trace=synthetic", "trace.num_requests=30", "trace.prompt_len=64",
                "trace.output_len=16", *extra, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert runs["jitter"]["settings"]["executor"]["step_jitter"] == 0.2
    assert runs["jitter"]["num_finished"] == runs["plain"]["num_finished"] == 30
    assert runs["jitter"]["tbt"]["p99"] != runs["plain"]["tbt"]["p99"]


@pytest.mark.slow   # CLI subprocesses
def test_step_jitter_memory_from_the_cli(tmp_path):
    import json

    from helpers import cli
    base = ["model=tiny-llama", "hardware=a100-80gb", "trace=synthetic", "trace.num_requests=30",
            "trace.prompt_len=64", "trace.output_len=16", "executor.step_jitter=0.2"]
    runs = {}
    for name, extra in (("independent", []), ("memory", ["executor.step_jitter_memory=0.8"])):
        r = cli(f"hydra.run.dir={tmp_path}/{name}", *base, *extra, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert runs["memory"]["settings"]["executor"]["step_jitter_memory"] == 0.8
    assert runs["memory"]["tbt"]["p99"] != runs["independent"]["tbt"]["p99"]
    r = cli(f"hydra.run.dir={tmp_path}/unread", "executor.step_jitter_memory=0.5", cwd=tmp_path)
    assert r.returncode != 0
    assert "step_jitter_memory=0.5: read only with executor.step_jitter" in r.stderr
    assert not (tmp_path / "unread" / "summary.json").exists()


def test_sarathi_on_the_roofline_skips_chunked_prefills_without_changing_the_run():
    # prompts of 100-1500 tokens under a 256-token budget in a cache that preempts (12 times):
    # chunk runs stop at arrivals, at waiting requests, at finishes and at KV growth
    from sarathi_lab.engine import Engine
    from sarathi_lab.run.runner import build
    rng = np.random.default_rng(3)
    cfg = {"scheduler": {"name": "sarathi", "token_budget": 256, "max_num_seqs": 8,
                         "block_size": 16, "num_kv_blocks": 200},
           "executor": preset("executor", "sim"), "model": preset("model", "llama-2-7b"),
           "hardware": preset("hardware", "a100-80gb"), "progress": False}
    spec = [(float(t), int(p), int(o)) for t, p, o in zip(
        np.cumsum(rng.exponential(0.15, 60)), rng.integers(100, 1500, 60),
        rng.integers(1, 400, 60))]
    runs = {}
    for ff in (True, False):
        policy, ex = build(cfg)
        reqs = [Request(i, t, p, o) for i, (t, p, o) in enumerate(spec)]
        n_chunked = [0]
        advance = policy.fast_forward.advance_chunks

        def counted(p, times, r, chunks, _a=advance, _n=n_chunked):
            _n[0] += len(chunks)
            return _a(p, times, r, chunks)
        policy.fast_forward = dataclasses.replace(policy.fast_forward, advance_chunks=counted)
        eng = Engine(policy, ex, fast_forward=ff)
        eng.run(reqs)
        runs[ff] = (eng, reqs, n_chunked[0])
    (eng, reqs, n), (ref_eng, ref, n_ref) = runs[True], runs[False]
    assert n > 20 and n_ref == 0
    np.testing.assert_array_equal(eng.iterations(), ref_eng.iterations())
    assert [r.token_times for r in reqs] == [r.token_times for r in ref]
    assert [(r.finish_time, r.status, r.num_preemptions) for r in reqs] == \
        [(r.finish_time, r.status, r.num_preemptions) for r in ref]
    assert sum(r.num_preemptions for r in reqs) > 0
