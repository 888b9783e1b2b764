"""`sarathi-lab-profile`: profile the real executor on a tiny random Llama, fit the profiled cost
model to it and predict iterations it never measured; monotone predictions; a profile used for
another model, dtype or shape fails naming both; the CLI writes the Parquet with its metadata."""
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import slow_fixture
from helpers import CONFIGS, cli, patience

from sarathi_lab import profiler as P
from sarathi_lab.costmodels.profiled import ProfiledConfig, ProfiledCostModel
from sarathi_lab.costmodels.profiles import ProfileError

# Held-out iterations (shapes the fit never uses) are predicted within this share of their
# measured time, as the median over the shapes. They are measured as the profile's `mixed` rows,
# in the same rounds as the grid, on the thread's CPU clock, each row the minimum of the rounds
# (other jobs' noise only ever adds time): on this shared machine a step's speed drifts by tens
# of percent between minutes (a CI run measured held-out steps taken a minute after the profile
# 22-33% slower than it). What remains differs between executors built alike: over 12 profiles
# on a quiet machine, the median |error| ranged 5-26% (steps of 3-6 ms, of which 0.5-1.3 ms
# input preparation and sampling), the errors of one profile sharing their sign. So a second,
# fresh profile is taken when the first misses: a wrong composition (a part dropped or counted
# twice) misses on both.
TOLERANCE = 0.25
TINY = ["model=tiny-llama"]


@pytest.fixture(scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def profile_tiny(directory):
    """(profile path, harness): the tiny grid and the held-out shapes measured on the tiny
    model, by a freshly built executor."""
    ex, model = P.build_executor([*TINY, "executor.clock=cpu"])
    h = P.Harness(ex)
    rows = P.measure(h, GRID, repeats=5, warmup=1, statistic="min")
    return P.write(rows, P.metadata(ex, model, "tiny", 5, 1, "min"),
                   directory / "tiny.parquet"), h


@slow_fixture(scope="module")
def measured(tmp_path_factory, one_thread):
    return profile_tiny(tmp_path_factory.mktemp("prof"))


def preset(**over):
    return {**yaml.safe_load((CONFIGS / "model" / "tiny-llama.yaml").read_text()), **over}


def cost_model(path, **model_over):
    return ProfiledCostModel(preset(**model_over), P.host_hardware("cpu"), 1,
                             ProfiledConfig(profile=str(path)))


# (chunk, context, decodes, decode context): one chunk and `decodes` decodes
HELD_OUT = (
    (40, 0, 0, 0),                              # a prompt between grid points
    (100, 100, 0, 0),                           # a chunk after context
    (20, 50, 3, 80),                            # mixed
    (90, 120, 5, 200),                          # a chunk and decodes off the grid
)
GRID = dataclasses.replace(P.GRIDS["tiny"], mixed=P.GRIDS["tiny"].mixed + HELD_OUT)


@pytest.mark.slow   # a real model measured (fixture `measured`)
def test_profile_predicts_held_out_iterations(measured, tmp_path):
    tries = []
    for path in (measured[0], None):
        path = path or profile_tiny(tmp_path)[0]
        checks = P.check(path, P.model_of(P.profile_meta(path)), P.host_hardware("cpu"))
        assert {(c["chunk"], c["context"], c["batch"], c["decode_context"]) for c in checks} \
            == set(GRID.mixed)
        errs = np.abs([c["error"] for c in checks])
        tries.append([round(c["error"], 3) for c in checks])
        if np.median(errs) <= TOLERANCE and errs.max() <= 3 * TOLERANCE:
            return
    pytest.fail(f"held-out errors of two profiles: {tries}")


@pytest.mark.slow   # a real model measured (fixture `measured`)
def test_rows_are_the_parts_of_real_iterations(measured):
    path, _ = measured
    t = pq.read_table(path).to_pandas()
    g = GRID
    assert sorted(t.loc[t.operator == "linear", "num_tokens"]) == sorted(g.linear)
    assert len(t[t.operator == "decode_attention"]) == len(g.decode)
    assert len(t[t.operator == "iteration"]) == len(g.mixed)
    assert (t["time_s"] >= 0).all() and (t["repeats"] == 5).all()
    # time_s is the minimum of the rounds here (statistic="min"): below their 10th percentile
    assert (t["time_s"] <= t["time_p10_s"]).all() and (t["time_p10_s"] <= t["time_p90_s"]).all()
    # the overhead (preparation + sampling) is measured per batch size, and is a real cost
    over = t[t.operator == "overhead"]
    assert sorted(set(over["batch"])) == sorted({b for b, _ in g.decode})
    assert (over["time_s"] > 0).all()


@pytest.mark.slow   # a real model measured (fixture `measured`)
def test_harness_splits_an_iteration_into_its_parts(measured, one_thread):
    _, h = measured
    h.bind(5000)
    p = h.run([(32, 16)] + [(1, 40)] * 3)
    assert p["total"] >= p["prepare"] + p["forward"] + p["sample"] - 1e-9
    assert 0 < p["attention"] < p["forward"] and 0 < p["head"] < p["forward"]
    assert p["linear"] == pytest.approx(p["forward"] - p["attention"] - p["head"])


@pytest.mark.parametrize("which", ["linear", "chunk", "context", "batch", "decode_context"])
@pytest.mark.slow   # a real model measured (fixture `measured`)
def test_more_tokens_never_predict_less(measured, which):
    cm = cost_model(measured[0])

    def t(x):
        return {"linear": lambda: cm.iteration_time([(x, 0)], [], 1),
                "chunk": lambda: cm.iteration_time([(x, 64)], [], 1),
                "context": lambda: cm.iteration_time([(32, x)], [], 1),
                "batch": lambda: cm.iteration_time([], [100] * x, x),
                "decode_context": lambda: cm.iteration_time([], [x] * 4, 4)}[which]()
    xs = range(2, 400, 3) if which != "batch" else range(1, 40)
    ts = [t(x) for x in xs]
    assert all(b >= a for a, b in zip(ts, ts[1:])), which
    assert min(ts) > 0


@pytest.mark.slow   # a real model measured (fixture `measured`)
def test_profile_for_another_model_dtype_or_shape_fails_clearly(measured):
    path = measured[0]
    with pytest.raises(ProfileError, match=r"model=tiny-llama.*model=llama-other.*differs in: "
                                           r"model"):
        cost_model(path, name="llama-other")
    with pytest.raises(ProfileError, match=r"dtype=float32.*dtype=bfloat16.*differs in: dtype"):
        cost_model(path, dtype="bfloat16")
    with pytest.raises(ProfileError, match=r"shape \(n_embd: 64 in the profile, 128 in the run"):
        cost_model(path, hidden_size=128)
    with pytest.raises(ProfileError, match=r"device=cpu.*hardware=a100-80gb"):
        ProfiledCostModel(preset(), yaml.safe_load((CONFIGS / "hardware" / "a100-80gb.yaml")
                                                   .read_text()), 1,
                          ProfiledConfig(profile=str(path)))


@pytest.mark.slow   # a sweep in CLI subprocesses
def test_cli_writes_the_parquet_with_its_metadata(tmp_path):
    out = tmp_path / "p.parquet"
    r = subprocess.run([sys.executable, "-m", "sarathi_lab.profiler", *TINY, "executor.clock=cpu",
                        "--grid", "tiny", "--repeats", "1", "--warmup", "0", "--threads", "1",
                        "--out", str(out)],
                       capture_output=True, text=True, timeout=patience(300))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "held-out mixed iterations" in r.stdout
    assert "profiling" in r.stderr          # the progress bar
    meta = P.profile_meta(out)
    assert meta["model"] == "tiny-llama" and meta["dtype"] == "float32"
    assert meta["device"] == "cpu" and meta["threads"] == "1" and meta["grid"] == "tiny"
    assert meta["clock"] == "cpu"
    assert torch.__version__ in meta["versions"] and meta["n_embd"] == "64"
    ops = set(pq.read_table(out).column("operator").to_pylist())
    assert ops == {"linear", "prefill_attention", "decode_attention", "lm_head", "overhead",
                   "decode_rewarm", "iteration"}
    # and the simulator runs on it from the CLI (the hardware preset named as the profile's device)
    r = cli(f"hydra.run.dir={tmp_path}/sim", *TINY, "executor.cost_model=profiled",
            f"executor.profile={out}", "hardware.name=cpu", "scheduler.num_kv_blocks=4096",
            "trace=synthetic", "trace.num_requests=20", "trace.prompt_len=100",
            "trace.output_len=8", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert s["num_finished"] == 20 and s["simulated"]
    # bad input: a clean message naming it, no traceback
    r = subprocess.run([sys.executable, "-m", "sarathi_lab.profiler", *TINY, "--out",
                        str(tmp_path / "p.csv"), "--grid", "tiny", "--repeats", "1"],
                       capture_output=True, text=True, timeout=patience(300))
    assert r.returncode != 0 and "--out" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "sarathi_lab.profiler", *TINY, "executor.clock=cpu",
                        "--out", str(out), "--grid", "tiny", "--threads", "2"],
                       capture_output=True, text=True, timeout=patience(300))
    assert r.returncode != 0 and "executor.clock=cpu" in r.stderr and "2 threads" in r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "sarathi_lab.profiler", "executor.dtyp=float32",
                        "--out", str(out)], capture_output=True, text=True, timeout=patience(300))
    assert r.returncode != 0 and "executor.dtyp" in r.stderr and "Traceback" not in r.stderr


def test_a_cpu_clock_profile_times_its_parts_on_that_clock(tmp_path, one_thread, monkeypatch):
    """`executor.clock=cpu`: the parts (attention, LM head) are read on the executor's clock,
    not the wall's, and the metadata says which clock. thread_time made to move 1 s a read:
    every part is a whole number of seconds."""
    import time
    ex, model = P.build_executor([*TINY, "executor.clock=cpu"])
    t = iter(range(10 ** 9))
    monkeypatch.setattr(ex, "now", lambda: float(next(t)))
    h = P.Harness(ex)
    h.bind(256)
    parts = h.run([(32, 0), (1, 16)])
    assert all(float(v).is_integer() for v in parts.values()), parts
    # two attention kernel calls per layer at most, each 1 s: a whole, positive count
    assert parts["attention"] >= 1 and parts["head"] == 1
    assert P.metadata(ex, model, "tiny", 1, 0)["clock"] == "cpu"
    assert P.metadata(ex, model, "tiny", 1, 0)["warm_steps"] == str(P.WARM_STEPS)
    monkeypatch.setattr(time, "perf_counter", lambda: pytest.fail("the wall clock was read"))
    h.run([(1, 16)])


def test_a_measured_step_reads_only_its_new_tokens_out_of_the_paged_cache(one_thread):
    """A request at context k has computed those k tokens in earlier steps of a real run: the
    torch backend's per-sequence copy of its KV holds them, and a step copies only its new tokens
    out of the paged cache. The profile's steps must be measured in that state: without the
    unmeasured step before each point, a decode batch's step gathered every context token of
    every request (in this run 3 x 101 slots instead of 3), a cost a steady decode never pays
    (on experiments/fidelity's model: 8 decodes at context 256, 21.5 ms measured so, 14.9 ms
    after a prime)."""
    ex, _ = P.build_executor([*TINY, "executor.clock=cpu"])
    h = P.Harness(ex)
    h.bind(1024)
    copied = []
    prepare = ex.prepare

    def spy(out, *drafts):
        res = prepare(out, *drafts)
        copied.append((list(out.num_new_tokens), len(res[2].attn_kwargs["sequence_kv"].slots)))
        return res
    ex.prepare = spy
    for entries in ([(64, 0), (1, 16)], [(1, 100)] * 3, [(32, 64), (1, 200)], [(1, 40)] * 3,
                    [(48, 0)]):
        copied.clear()
        parts = h.run(entries)
        new, slots = copied[-1]
        assert new == [n for n, _ in entries] and slots == sum(new), (entries, copied)
        assert parts["total"] > 0


class _Machine:
    """A harness on a made-up machine (seconds, exact): the attention kernels cost a fixed 1 ms
    an iteration plus 1 us per KV token read, and the rest of a forward 2 ms + 0.1 ms a token,
    plus 2 us per KV token its batch reads (the weights that KV evicts from the cache), plus
    COLD for a step that is not deep in a stream of steps of its own shape (`warm`: the steps of
    its shape run just before it; a CPU's caches on a quiet machine)."""

    COLD = 1e-3

    class ex:
        @staticmethod
        def max_model_len():
            return 4096

    def bind(self, max_tokens):
        pass

    @staticmethod
    def parts(entries, warm=0):
        T = sum(n for n, _ in entries)
        kv = sum(n + k for n, k in entries)
        S = len(entries)
        attention, head, over = 1e-3 + 1e-6 * kv, 1e-4 * S, 3e-4 + 5e-5 * S
        rest = 2e-3 + 1e-4 * T + 2e-6 * sum(k for _, k in entries) \
            + (0.0 if warm >= 8 else _Machine.COLD)
        forward = rest + attention + head
        return {"prepare": over, "sample": 0.0, "forward": forward, "attention": attention,
                "head": head, "linear": rest, "overhead": over, "total": forward + over}

    def run(self, entries, warm=0, settle=0, after_chunk=False):
        return self.parts(entries, warm)

    def stream(self, prompt, steps):
        """The decodes after a prompt step: the j-th (from 0) at context prompt + j, after j
        decode steps of its own."""
        return [self.parts([(1, prompt + j)], warm=j)["total"] for j in range(steps)]


def test_a_decode_batch_is_priced_with_what_its_kv_costs_the_rest_of_the_forward(tmp_path):
    """A decode batch's projections and MLP read as many weights as a prompt of as many tokens
    but run slower while its KV passes through the cache. Attention measured as its kernels alone
    (the old attribution: 1 us a KV token) left that out, and the profile under-predicted the
    decode batches it was measured on (8 decodes at context 256: 7.36 ms, not 11.45 ms)."""
    rows = P.measure(_Machine(), P.GRIDS["tiny"], repeats=1, warmup=0)
    meta = {"model": "tiny-llama", "dtype": "float32", "device": "cpu", "tensor_parallel": 1}
    cm = cost_model(P.write(rows, meta, tmp_path / "made_up.parquet"))
    for b, k in P.GRIDS["tiny"].decode:
        want = _Machine.parts([(1, k)] * b, warm=P.WARM_STEPS)["total"]
        assert cm.iteration_time([], [k] * b, b) == pytest.approx(want, rel=1e-9), (b, k)
    for c, k in P.GRIDS["tiny"].prefill:
        want = _Machine.parts([(c, k)])["total"]
        assert cm.iteration_time([(c, k)], [], 1) == pytest.approx(want, rel=1e-9), (c, k)


def test_decodes_are_priced_as_a_steady_stream_and_chunks_as_one_step(tmp_path):
    """A run decodes step after step, and a step deep in a stream of its shape costs less than
    the first ones (_Machine.COLD; on experiments/fidelity's model a single decode took 4.0 ms
    as the second step of its shape and 3.0 ms from the 17th on, on a quiet machine); a prefill
    chunk comes alone, between decodes. The profile times each so: every decode batch after
    WARM_STEPS decode steps, the linear layers after as many repeats of their prompt, chunks
    (after context, and first chunks, from the linear points' first step) as they come. Timed
    after one prime step (warm=0, the profiles before), a single decode was priced COLD too
    slow: the real runs' single-request decodes took 0.71-0.81 of the prediction."""
    meta = {"model": "tiny-llama", "dtype": "float32", "device": "cpu", "tensor_parallel": 1}
    grid = P.GRIDS["tiny"]
    steady = cost_model(P.write(P.measure(_Machine(), grid, repeats=1, warmup=0), meta,
                                tmp_path / "steady.parquet"))
    old = cost_model(P.write(P.measure(_Machine(), grid, repeats=1, warmup=0, warm=0), meta,
                             tmp_path / "old.parquet"))
    for k in (16, 128, 256):
        warm = _Machine.parts([(1, k)], warm=P.WARM_STEPS)["total"]
        assert steady.iteration_time([], [k], 1) == pytest.approx(warm, rel=1e-9), k
        assert old.iteration_time([], [k], 1) == pytest.approx(warm + _Machine.COLD, rel=1e-9)
    for T in grid.linear[1:]:   # first chunks (context 0) come alone, as the first of their shape
        cold = _Machine.parts([(T, 0)])["total"]
        assert steady.iteration_time([(T, 0)], [], 1) == pytest.approx(cold, rel=1e-9), T


def test_a_decode_batch_is_timed_after_a_stream_of_its_own_decodes(one_thread):
    """`Harness.run(entries, warm=w)`: a decode batch runs w unmeasured decode steps of the same
    requests just before it, at the contexts before its own, each sampling (a whole decode step,
    LM head included), as a run's stream of decodes; a batch of prompts at context 0 runs its
    prompts w times. The measured step still copies only its new tokens into the KV copies."""
    ex, _ = P.build_executor([*TINY, "executor.clock=cpu"])
    h = P.Harness(ex)
    h.bind(1024)
    steps = []
    execute = ex.execute

    def spy(out):
        res = execute(out)
        steps.append(([r.request_id for r in out.reqs], list(out.num_new_tokens),
                      [r.num_computed_tokens for r in out.reqs],
                      sum(t != -1 for t in res.sampled)))
        return res
    ex.execute = spy
    prepare = ex.prepare
    copied = []

    def slots(out, *drafts):
        res = prepare(out, *drafts)
        copied.append(len(res[2].attn_kwargs["sequence_kv"].slots))
        return res
    ex.prepare = slots
    h.run([(1, 100)] * 3, warm=5)
    assert steps == [([0, 1, 2], [1, 1, 1], [k] * 3, 3) for k in range(95, 101)]
    assert copied[-1] == 3
    steps.clear()
    h.run([(1, 4)], warm=16)           # a stream back to the first output token at most
    assert steps == [([0], [1], [k], 1) for k in (1, 2, 3, 4)]
    steps.clear()
    h.run([(1, 1)], warm=4)            # no decode before the first output token: the one prime
    assert [s[2] for s in steps] == [[0], [1]]
    steps.clear()
    h.run([(64, 0)], warm=3)
    assert steps == [([0], [64], [0], 1)] * 4
    steps.clear()
    h.run([(1, 100)] * 2)              # warm=0: the one prime step of before
    assert [s[2] for s in steps] == [[99, 99], [100, 100]] and steps[0][3] == 0
    with pytest.raises(ValueError, match=r"warm=2: for a batch of decodes only .*\(32, 16\)"):
        h.run([(32, 16), (1, 40)], warm=2)
    # settle: after the prime, another request's short prompt and decodes, then the measured
    # step on its own requests' blocks; the other request's KV copy is dropped
    from sarathi_lab.profiler.harness import SETTLE_PROMPT
    steps.clear()
    h.run([(32, 64)], settle=3)
    assert steps == [([0], [64], [0], 0), ([1], [SETTLE_PROMPT], [0], 1),
                     *[([1], [1], [SETTLE_PROMPT + j], 1) for j in range(3)],
                     ([0], [32], [64], 1)]
    assert 1 not in ex.sequence_kv.seqs and ex.kv.tables == {0: [0, 1, 2, 3, 4, 5]}
    with pytest.raises(ValueError, match="settle=2 with warm=1"):
        h.run([(1, 40)], warm=1, settle=2)
    # after_chunk: the context before the previous chunk in one step, the settling decodes,
    # the previous chunk, then the measured one
    steps.clear()
    h.run([(32, 96)], settle=2, after_chunk=True)
    assert steps == [([0], [64], [0], 0), ([1], [SETTLE_PROMPT], [0], 1),
                     *[([1], [1], [SETTLE_PROMPT + j], 1) for j in range(2)],
                     ([0], [32], [64], 0), ([0], [32], [96], 1)]
    steps.clear()
    h.run([(64, 16)], after_chunk=True)   # context shorter than the chunk: it is the previous
    assert steps == [([0], [16], [0], 0), ([0], [64], [16], 1)]
    steps.clear()   # and with settling decodes: once, before it
    h.run([(64, 16)], settle=2, after_chunk=True)
    assert steps == [([1], [SETTLE_PROMPT], [0], 1),
                     *[([1], [1], [SETTLE_PROMPT + j], 1) for j in range(2)],
                     ([0], [16], [0], 0), ([0], [64], [16], 1)]
    with pytest.raises(ValueError, match=r"after_chunk: for one chunk at a context > 0"):
        h.run([(32, 0)], after_chunk=True)


def _part(path, times, model="tiny-llama", points=((1, None), (8, None))):
    rows = []
    for (T, ctx), (t, lo, hi) in zip(points, times):
        rows.append({**dict.fromkeys(P.COLUMNS, float("nan")), "operator": "linear",
                     "num_tokens": T, "context": float("nan") if ctx is None else ctx,
                     "time_s": t, "time_p10_s": lo, "time_p90_s": hi, "repeats": 5})
    meta = {"model": model, "dtype": "float32", "device": "cpu", "grid": "tiny", "repeats": 5,
            "created": str(path)}
    return P.write(rows, meta, path)


def test_merged_profile_by_hand(tmp_path):
    """Each point: the medians of the parts' times, p10s and p90s, the repeats summed; the
    metadata counts the parts."""
    parts = [_part(tmp_path / "a.parquet", [(1.0, 0.9, 1.2), (4.0, 3.0, 5.0)]),
             _part(tmp_path / "b.parquet", [(3.0, 2.5, 3.5), (2.0, 1.0, 6.0)]),
             _part(tmp_path / "c.parquet", [(2.0, 1.5, 2.2), (8.0, 7.0, 9.0)])]
    out = P.merge(parts, tmp_path / "m.parquet")
    rows = pq.read_table(out).to_pylist()
    assert [r["time_s"] for r in rows] == [2.0, 4.0]
    assert [r["time_p10_s"] for r in rows] == [1.5, 3.0]
    assert [r["time_p90_s"] for r in rows] == [2.2, 6.0]
    assert [r["repeats"] for r in rows] == [15, 15]
    meta = P.profile_meta(out)
    assert meta["parts"] == "3" and meta["repeats"] == "15" and meta["model"] == "tiny-llama"
    assert meta["created"] == str(tmp_path / "c.parquet")


def test_merge_refuses_profiles_of_different_runs_or_points(tmp_path):
    a = _part(tmp_path / "a.parquet", [(1.0, 0.9, 1.2), (4.0, 3.0, 5.0)])
    other = _part(tmp_path / "o.parquet", [(1.0, 0.9, 1.2), (4.0, 3.0, 5.0)], model="smollm2")
    with pytest.raises(ValueError, match=r"o\.parquet differs .* in model"):
        P.merge([a, other], tmp_path / "m.parquet")
    moved = _part(tmp_path / "p.parquet", [(1.0, 0.9, 1.2), (4.0, 3.0, 5.0)],
                  points=((1, None), (16, None)))
    with pytest.raises(ValueError, match="different points"):
        P.merge([a, moved], tmp_path / "m.parquet")
    with pytest.raises(ValueError, match="no profiles"):
        P.merge([], tmp_path / "m.parquet")


def test_a_profile_of_means_from_the_same_rounds():
    """Rounds on the made-up machine, the last of five three times as slow (a burst of load):
    the profile of medians reads the machine's times, the profile of means 1.4 times them (a
    latency sums steps, whose expectation is their mean), from the very same measurement; the
    10th/90th percentiles are the same in both (the linear rows carry the attention floor,
    itself a statistic of the rounds)."""
    from sarathi_lab.profiler.measure import profile_rows, rounds
    pts, parts = rounds(_Machine(), P.GRIDS["tiny"], repeats=5, warmup=0)
    slow = np.array([1.0, 1.0, 1.0, 1.0, 3.0])
    parts = [{k: v * slow for k, v in p.items()} for p in parts]
    med, mean = profile_rows(pts, parts, "median"), profile_rows(pts, parts, "mean")
    assert len(med) == len(mean)
    for a, b in zip(med, mean):
        if a["operator"] in ("lm_head", "overhead", "iteration"):   # one part each, unshifted
            assert b["time_s"] == pytest.approx(1.4 * a["time_s"], rel=1e-12), a
            assert b["time_p10_s"] == a["time_p10_s"] and b["time_p90_s"] == a["time_p90_s"]
    decode = [r for r in med if r["operator"] == "lm_head"]
    assert decode and all(r["time_s"] == pytest.approx(1e-4 * r["num_tokens"]) for r in decode)
    with pytest.raises(ValueError, match="statistic='mode'"):
        profile_rows(pts, parts, "mode")


def test_merged_profile_of_means_by_hand(tmp_path):
    """Parts of a profile of means (of as many rounds each) merge to the mean of their means;
    the p10s and p90s still to their medians."""
    parts = []
    for name, times in (("a", [(1.0, 0.9, 1.2), (4.0, 3.0, 5.0)]),
                        ("b", [(3.0, 2.5, 3.5), (2.0, 1.0, 6.0)]),
                        ("c", [(5.0, 1.5, 2.2), (9.0, 7.0, 9.0)])):
        path = _part(tmp_path / f"{name}.parquet", times)
        meta = {**P.profile_meta(path), "statistic": "mean"}
        parts.append(P.write(pq.read_table(path).to_pylist(), meta, path))
    rows = pq.read_table(P.merge(parts, tmp_path / "m.parquet")).to_pylist()
    assert [r["time_s"] for r in rows] == [3.0, 5.0]
    assert [r["time_p10_s"] for r in rows] == [1.5, 3.0]


def test_rewarm_rows_time_the_decodes_after_a_prompt_step():
    """Per rewarm prompt size T: the decodes after a prompt step of T tokens, each timed at its
    place p (context T + p - 1, after p - 1 decodes of its own: _Machine.COLD for the first 8),
    and place 0, the median of the REWARM_STEADY steps after WARM_STEPS places. Without a warm
    stream (warm=0) the decode points are not steady, and no rewarm point is measured."""
    from sarathi_lab.profiler.measure import REWARM_STEADY
    grid = P.GRIDS["tiny"]
    rows = [r for r in P.measure(_Machine(), grid, repeats=1, warmup=0)
            if r["operator"] == "decode_rewarm"]
    W = P.WARM_STEPS
    assert len(rows) == len(grid.rewarm) * (W + 1)
    for T in grid.rewarm:
        got = {r["place"]: r["time_s"] for r in rows if r["num_tokens"] == T}
        steady = np.median([_Machine.parts([(1, T + j)], warm=j)["total"]
                            for j in range(W, W + REWARM_STEADY)])
        assert got[0] == pytest.approx(steady, rel=1e-12)
        for p in range(1, W + 1):
            want = _Machine.parts([(1, T + p - 1)], warm=p - 1)["total"]
            assert got[p] == pytest.approx(want, rel=1e-12), (T, p)
        assert got[1] - steady > 0.9 * _Machine.COLD      # the first decodes run cold
    assert not [r for r in P.measure(_Machine(), grid, repeats=1, warmup=0, warm=0)
                if r["operator"] == "decode_rewarm"]


def test_cpu_grid_measures_every_small_size():
    """A CPU prices an odd row count above the even one after it, which a curve read between
    powers of two cannot show: every prompt and decode batch size up to SMALL is a point."""
    from sarathi_lab.profiler.grids import GRIDS, SMALL
    g = GRIDS["cpu"]
    assert set(range(1, SMALL + 1)) <= set(g.linear)
    contexts = {k for _, k in g.decode}
    for b in range(1, SMALL + 1):
        assert {(b, k) for k in contexts} <= set(g.decode), b
