"""The real executor against the Hugging Face oracle: greedy output ids equal `transformers`
`generate` exactly, under every policy, chunk size, block size, prefix caching and preemption."""
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import patience

# one_thread and oracle are fixtures: imported, they apply here (one_thread is autouse)
from hf_oracle import (  # noqa: F401
    hf_generate,
    make_hf_model,
    make_specs,
    one_thread,
    oracle,
    run_engine,
    with_eos,
)

from sarathi_lab.engine import Engine
from sarathi_lab.request import Request
from sarathi_lab.run import runner

CASES = {
    "request_level-b4": dict(name="request_level", block_size=4, max_num_seqs=6),
    "request_level-b16": dict(name="request_level", block_size=16),
    "orca-b4": dict(name="orca", block_size=4, max_num_seqs=8),
    "orca-b16": dict(name="orca", block_size=16),
    "vllm-b4": dict(name="vllm", block_size=4),
    "vllm-b16": dict(name="vllm", block_size=16, max_num_seqs=5),
    "sarathi-c1-b4": dict(token_budget=1, block_size=4),
    "sarathi-c3-b16": dict(token_budget=3, block_size=16),
    "sarathi-c16-b4": dict(token_budget=16, block_size=4, max_num_seqs=6),
    "sarathi-c64-b16": dict(token_budget=64, block_size=16),
    "sarathi-whole-b4": dict(token_budget=512, block_size=4),
    "vllm-prefix-b4": dict(name="vllm", block_size=4, enable_prefix_caching=True),
    "sarathi-prefix-b16": dict(token_budget=16, block_size=16, enable_prefix_caching=True),
    "sarathi-prefix-b4": dict(token_budget=64, block_size=4, enable_prefix_caching=True),
    # 96 tokens of KV for 18 requests of up to 75 tokens: preemption and recompute
    "vllm-preempt-b4": dict(name="vllm", block_size=4, num_kv_blocks=24),
    "sarathi-preempt-b4": dict(token_budget=16, block_size=4, num_kv_blocks=24),
    "sarathi-preempt-prefix-b16": dict(token_budget=32, block_size=16, num_kv_blocks=6,
                                       enable_prefix_caching=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_hugging_face(oracle, case):
    path, specs, ref = oracle
    sched = CASES[case]
    reqs, engine = run_engine(path, specs, **sched)
    assert [r.output_token_ids for r in reqs] == ref
    if "preempt" in case:
        assert sum(r.num_preemptions for r in reqs) > 0
    if sched.get("enable_prefix_caching") and "preempt" not in case:
        # cache hits skip prompt tokens: fewer prefill tokens than prompts + nothing else
        computed = sum(engine.iters["prefill_tokens"])
        assert computed < sum(len(ids) for ids, _ in specs)


def test_triton_backend_equals_hugging_face(oracle):
    """The Triton kernels (TRITON_INTERPRET=1 on a CPU) on a few short requests, mixing a
    chunked prefill with decodes in one batch."""
    if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
        pytest.skip("needs a GPU or TRITON_INTERPRET=1")
    path, specs, ref = oracle
    picks = [1, 3, 7]   # prompts of 2, 5 and 9 tokens; greedy prefixes of HF's outputs
    reqs, _ = run_engine(path, [(specs[i][0], 4) for i in picks], backend="triton",
                         token_budget=6, block_size=4)
    assert [r.output_token_ids for r in reqs] == [ref[i][:4] for i in picks]


def test_qwen2_tied_equals_hugging_face(tmp_path):
    model = make_hf_model(tmp_path, "qwen2", tie_word_embeddings=True, seed=5)
    specs = make_specs(6, seed=3)
    reqs, _ = run_engine(tmp_path, specs, token_budget=16, block_size=4)
    assert [r.output_token_ids for r in reqs] == hf_generate(model, specs)


def test_sampling_is_seeded_per_request(oracle):
    """temperature > 0: a request's tokens depend on (seed, request, index), not on batching."""
    path, specs, _ = oracle
    outs = []
    for sched in (dict(token_budget=7, block_size=4), dict(name="vllm", block_size=16)):
        cfg = {"executor": {"name": "torch", "device": "cpu", "dtype": "float32",
                            "kv_cache_gib": 0.01, "temperature": 1.0, "top_p": 0.9, "seed": 7},
               "model": {"path": str(path)}, "scheduler": {"name": "sarathi", **sched}}
        policy, ex = runner.build(cfg)
        reqs = [Request(i, 0.0, len(ids), n, prompt_token_ids=list(ids))
                for i, (ids, n) in enumerate(specs[:6])]
        Engine(policy, ex).run(reqs)
        outs.append([r.output_token_ids for r in reqs])
    assert outs[0] == outs[1]
    assert all(0 <= t < 256 for o in outs[0] for t in o)


def test_kv_budget_errors_name_the_setting(oracle, monkeypatch):
    path, _, _ = oracle
    cfg = {"executor": {"name": "torch", "device": "cpu", "kv_cache_gib": 1e-7},
           "model": {"path": str(path)}, "scheduler": {"name": "sarathi", "block_size": 16}}
    with pytest.raises(ValueError, match="executor.kv_cache_gib"):
        runner.build(cfg)
    # room for a few blocks, but request_level reserves max_model_len (128 tokens) per request
    cfg["executor"]["kv_cache_gib"] = 4 * 16 * 512 / 2**30
    cfg["scheduler"]["name"] = "request_level"
    with pytest.raises(ValueError, match="cannot hold one request"):
        runner.build(cfg)
    # more than this machine has: refused before anything is allocated
    cfg["executor"]["kv_cache_gib"] = 100000.0
    cfg["scheduler"]["name"] = "sarathi"
    with pytest.raises(ValueError, match=r"executor.kv_cache_gib=100000.0: more than the"):
        runner.build(cfg)
    cfg["executor"]["kv_cache_gib"] = 0.01
    cfg["scheduler"]["num_kv_blocks"] = 10**9   # set by hand: checked before anything is made
    with pytest.raises(ValueError, match=r"needs .* GiB \(with the torch backend.s contiguous "
                                         r"copies of it\) but .* GiB is the limit on cpu \(the "
                                         r"memory available now"):
        runner.build(cfg)
    # the limit a user sets for sarathi-lab (resources.LIMIT_ENV) holds for the real executor too
    del cfg["scheduler"]["num_kv_blocks"]
    monkeypatch.setenv("SARATHI_LAB_MEMORY_GIB", "0.005")
    with pytest.raises(ValueError, match=r"executor.kv_cache_gib=0.01: more than the 0.00 GiB "
                                         r"host memory limit \(SARATHI_LAB_MEMORY_GIB=0.005\)"):
        runner.build(cfg)


def test_model_load_errors_name_the_file(oracle, tmp_path):
    import shutil
    path, _, _ = oracle
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    for f in bad.glob("*.safetensors"):
        f.write_bytes(b"not a safetensors file")
    cfg = {"executor": {"name": "torch", "device": "cpu", "kv_cache_gib": 0.01},
           "model": {"path": str(bad)}, "scheduler": {"name": "sarathi"}}
    with pytest.raises(ValueError, match=r"\.safetensors: not a readable safetensors file"):
        runner.build(cfg)
    (bad / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ValueError, match="model.safetensors.index.json: not a safetensors index"):
        runner.build(cfg)
    (bad / "model.safetensors.index.json").write_text('{"weight_map": {"x": "gone.safetensors"}}')
    with pytest.raises(FileNotFoundError, match="gone.safetensors, not found"):
        runner.build(cfg)


def test_prepare_trace_attaches_seeded_ids():
    from sarathi_lab.executors.torch_exec import TorchExecutor
    preset = dict(name="t", num_layers=1, hidden_size=32, intermediate_size=64, num_heads=4,
                  num_kv_heads=2, head_dim=8, vocab_size=100, max_model_len=64)
    ex = TorchExecutor.from_config({"device": "cpu", "shared_prefix_len": 5, "seed": 1}, preset)
    assert ex.max_model_len() == 64 and ex.dtype == torch.float32 and ex.backend == "torch"
    df = pd.DataFrame({"arrival_time": [0.0, 1.0], "num_prompt_tokens": [8, 3],
                       "num_output_tokens": [2, 2]})
    a, b = ex.prepare_trace(df, {"seed": 3}), ex.prepare_trace(df, {"seed": 3})
    ids = a["prompt_token_ids"].tolist()
    assert ids == b["prompt_token_ids"].tolist()
    assert [len(x) for x in ids] == [8, 3] and ids[0][:3] == ids[1]
    assert all(0 <= t < 100 for x in ids for t in x)


@pytest.mark.slow   # a CLI subprocess
def test_cli_writes_token_ids(tmp_path):
    # the installed console script, run outside the source tree (the configs are package data)
    script = os.path.join(os.path.dirname(sys.executable), "sarathi-lab")
    cmd = [script, "executor=torch", "model=tiny-llama",
           "~hardware", "trace=synthetic", "trace.num_requests=6", "trace.qps=1000",
           "trace.prompt_len.low=4", "trace.prompt_len.high=40", "trace.output_len.low=2",
           "trace.output_len.high=6", "executor.kv_cache_gib=0.01", "progress=false",
           f"hydra.run.dir={tmp_path}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=patience(120), cwd=tmp_path,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    df = pd.read_parquet(tmp_path / "requests.parquet")
    assert (df["status"] == "finished").all()
    assert [len(x) for x in df["prompt_token_ids"]] == df["num_prompt_tokens"].tolist()
    assert [len(x) for x in df["output_token_ids"]] == df["num_output_tokens"].tolist()
    assert all(0 <= t < 512 for x in df["output_token_ids"] for t in x)
    # executor.device=auto (the default) is recorded, and printed, as it resolved
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["executor"]["device"] == "auto"
    assert summary["settings"]["executor"]["device"] == "cpu"
    assert "| tiny-llama on executor torch (cpu) |" in res.stdout, res.stdout[:300]


def test_requests_without_token_ids_are_refused():
    preset = dict(name="t", num_layers=1, hidden_size=32, intermediate_size=64, num_heads=4,
                  num_kv_heads=2, head_dim=8, vocab_size=100, max_model_len=64)
    cfg = {"executor": {"name": "torch", "device": "cpu", "kv_cache_gib": 0.001},
           "model": preset, "scheduler": {"name": "sarathi", "block_size": 4}, "hardware": None}
    policy, ex = runner.build(cfg)
    with pytest.raises(ValueError, match="request 0 has no prompt_token_ids"):
        Engine(policy, ex).run([Request(0, 0.0, 5, 2)])


# --- EOS ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def eos_case(oracle, tmp_path_factory):
    """The oracle's model declaring as EOS the third token greedy decoding gives one request
    (a token it has not emitted before), and that request's index."""
    path, specs, ref = oracle
    i = next(i for i, (_, n) in enumerate(specs) if n >= 8 and ref[i][2] not in ref[i][:2])
    return with_eos(path, tmp_path_factory.mktemp("eos"), ref[i][2]), i, ref[i][2]


def test_a_request_ends_at_the_eos_it_samples(oracle, eos_case):
    from sarathi_lab.metrics import requests_table
    _, specs, ref = oracle
    d, i, eos = eos_case
    # stop_at_eos null: on, for requests that carry their own prompts
    reqs, engine = run_engine(d, specs, token_budget=16, block_size=4)
    assert reqs[i].output_token_ids == ref[i][:3] and reqs[i].finish_reason == "eos"
    for r, want, (_, n) in zip(reqs, ref, specs):   # every other request: the same rule
        cut = want.index(eos) + 1 if eos in want else n
        assert r.output_token_ids == want[:cut]
        assert r.finish_reason == ("eos" if eos in want else "length")
    df = requests_table(reqs, engine.output_lens).set_index("request_id")
    assert df.loc[i, "status"] == "finished" and df.loc[i, "finish_reason"] == "eos"
    assert df.loc[i, "num_output_tokens"] == 3 and df.loc[i, "target_output_tokens"] == specs[i][1]
    assert len(engine.executor.sequence_kv) == 0   # every request's KV copy was dropped


def test_with_stop_at_eos_off_requests_run_to_their_length(oracle, eos_case):
    _, specs, ref = oracle
    d, i, _ = eos_case
    reqs, _ = run_engine(d, specs, executor={"stop_at_eos": False}, token_budget=16,
                         block_size=4)
    assert [r.output_token_ids for r in reqs] == ref
    assert {r.finish_reason for r in reqs} == {"stop"}


def test_a_length_only_trace_runs_to_its_lengths_unless_asked(eos_case):
    from sarathi_lab.executors.torch_exec import TorchExecutor
    d, _, _ = eos_case
    df = pd.DataFrame({"arrival_time": [0.0], "num_prompt_tokens": [4], "num_output_tokens": [9]})
    own = df.assign(prompt_token_ids=[[1, 2, 3, 4]])
    for setting, trace, on in [(None, df, False), (None, own, True), (True, df, True),
                               (False, own, False)]:
        ex = TorchExecutor.from_config({"device": "cpu", "stop_at_eos": setting}, {"path": str(d)})
        ex.prepare_trace(trace, {})
        assert ex.stop_at_eos is on, (setting, trace.columns)


def test_stop_at_eos_needs_a_model_that_declares_one():
    from sarathi_lab.executors.torch_exec import TorchExecutor
    from sarathi_lab.settings import ConfigError
    preset = dict(name="t", num_layers=1, hidden_size=32, intermediate_size=64, num_heads=4,
                  num_kv_heads=2, head_dim=8, vocab_size=100, max_model_len=64)
    with pytest.raises(ConfigError, match="executor.stop_at_eos=true: the model declares no "
                                          "eos_token_id"):
        TorchExecutor.from_config({"device": "cpu", "stop_at_eos": True}, preset)
    assert not TorchExecutor.from_config({"device": "cpu"}, preset).stop_at_eos


# --- the clock ---------------------------------------------------------------------------------

PRESET = dict(name="t", num_layers=1, hidden_size=32, intermediate_size=64, num_heads=4,
              num_kv_heads=2, head_dim=8, vocab_size=100, max_model_len=64)


def clocked_run(path, specs, clock, monkeypatch, sleep_s=0.0):
    """Four requests under `executor.clock=CLOCK`, sampling made to sleep `sleep_s` a step:
    their outputs, the engine's iteration durations, the executor, and the wall time each of
    its steps took as seen from outside (around `execute`)."""
    import time
    cfg = {"executor": {"name": "torch", "device": "cpu", "dtype": "float32",
                        "kv_cache_gib": 0.01, "clock": clock},
           "model": {"name": "hf-tiny", "path": str(path)}, "scheduler": {"name": "sarathi"}}
    policy, ex = runner.build(cfg)
    sample, execute, outside = ex.sample, ex.execute, []

    def slow_sample(logits, reqs):
        time.sleep(sleep_s)   # off the core: wall time passes, this thread's CPU time does not
        return sample(logits, reqs)

    def timed_execute(out):
        t0 = time.perf_counter()
        res = execute(out)
        outside.append(time.perf_counter() - t0)
        return res
    monkeypatch.setattr(ex, "sample", slow_sample)
    monkeypatch.setattr(ex, "execute", timed_execute)
    reqs = [Request(i, 0.0, len(ids), n, prompt_token_ids=list(ids))
            for i, (ids, n) in enumerate(specs[:4])]
    engine = Engine(policy, ex)
    engine.run(reqs)
    return ([r.output_token_ids for r in reqs], np.asarray(engine.iters["duration"]), ex,
            np.asarray(outside))


def test_the_cpu_clock_leaves_out_time_off_the_core(oracle, monkeypatch):
    """A step that sleeps 50 ms lasts at least that on the wall clock; on the CPU clock the
    sleep is left out: a thread's CPU time cannot pass faster than the wall clock, so a step's
    CPU time is at most its wall time less the sleep, however fast or loaded the machine (no
    speed is assumed). The tokens are the same either way."""
    sleep = 0.05
    path, specs, ref = oracle
    out_w, wall, _, wall_outside = clocked_run(path, specs, "wall", monkeypatch, sleep)
    out_c, cpu, ex, cpu_outside = clocked_run(path, specs, "cpu", monkeypatch, sleep)
    assert out_w == out_c == ref[:4]
    assert len(wall) == len(cpu) == len(cpu_outside) == ex.timers["steps"] > 0
    # every step samples, so every step sleeps; the wall clock counts it, within the call
    assert (wall >= sleep).all() and (wall <= wall_outside).all()
    # the CPU clock does not; the margin is for the few CPU microseconds that sleeping costs
    assert (cpu <= cpu_outside - sleep + 0.005).all(), (cpu, cpu_outside)


def test_a_cpu_clock_step_is_the_sum_of_its_phases(oracle, monkeypatch):
    """time.thread_time made to move 1 s per read: a step reads it four times (start, prepared,
    forward done, sampled), so every iteration lasts 3 s and each phase 1 s a step."""
    import time
    path, specs, ref = oracle
    t = iter(range(10 ** 9))
    monkeypatch.setattr(time, "thread_time", lambda: float(next(t)))
    out, durs, ex, _ = clocked_run(path, specs, "cpu", monkeypatch)
    assert out == ref[:4]
    n = ex.timers["steps"]
    assert n == len(durs) > 0 and set(durs.tolist()) == {3.0}
    assert ex.timers["prepare"] == ex.timers["forward"] == ex.timers["sample"] == n


def test_cpu_clock_needs_one_thread_and_a_valid_name():
    import time

    from sarathi_lab.executors.torch_exec import TorchExecutor
    from sarathi_lab.settings import ConfigError
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(ConfigError, match="executor.clock=cpu counts the calling thread's "
                                              "CPU time, and torch runs 2 threads"):
            TorchExecutor.from_config({"device": "cpu", "clock": "cpu"}, PRESET)
    finally:
        torch.set_num_threads(n)
    assert TorchExecutor.from_config({"device": "cpu", "clock": "cpu"}, PRESET).now \
        is time.thread_time
    assert TorchExecutor.from_config({"device": "cpu"}, PRESET).now is time.perf_counter
    with pytest.raises(ConfigError, match="executor.clock"):
        TorchExecutor.from_config({"device": "cpu", "clock": "gpu"}, PRESET)


@pytest.mark.slow   # a CLI subprocess
def test_cpu_clock_from_the_cli(tmp_path):
    """`executor.clock=cpu num_threads=1` runs; with two torch threads it is refused, naming the
    setting to change; under the simulator no component reads it, which is an error too."""
    script = os.path.join(os.path.dirname(sys.executable), "sarathi-lab")
    base = [script, "model=tiny-llama", "~hardware", "trace=synthetic", "trace.num_requests=4",
            "executor.clock=cpu", "progress=false"]
    torch_ex = ["executor=torch", "executor.kv_cache_gib=0.01"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    def run(*args, d):
        return subprocess.run([*base, *args, f"hydra.run.dir={tmp_path / d}"],
                              capture_output=True, text=True,
                              timeout=patience(180), cwd=tmp_path, env=env)
    bad = run(*torch_ex, "num_threads=2", d="two")
    assert bad.returncode != 0 and "set num_threads=1" in bad.stderr, bad.stderr[-2000:]
    ok = run(*torch_ex, "num_threads=1", d="one")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert (pd.read_parquet(tmp_path / "one" / "requests.parquet")["status"] == "finished").all()
    sim = run("executor=sim", d="sim")
    assert sim.returncode != 0 and "executor.clock" in sim.stderr, sim.stderr[-2000:]
