"""The profiled cost model, strict: monotone everywhere (Hypothesis over random batches, inside
and beyond the profiled range, on the committed Vidur fixture and a synthetic profile), a missing
operator an error naming it and the file, the CPU side taken explicitly from the roofline, and a
profile measured under other library versions warned about."""
import json
import logging
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profile_helpers import META, VIDUR, profiled, synthetic_rows, write_csv

from sarathi_lab.costmodels.profiles import ProfileError


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = write_csv(tmp_path_factory.mktemp("p") / "profile.csv", synthetic_rows())
    logging.getLogger("sarathi_lab.costmodels.profiled").setLevel(logging.ERROR)
    yield {"synthetic": profiled(path), "vidur": profiled(VIDUR, "llama-2-70b", "a100-80gb", 2)}
    logging.getLogger("sarathi_lab.costmodels.profiled").setLevel(logging.NOTSET)


# up to ~3x beyond both profiles' ranges (chunks 4096, contexts 4096, batches 256)
CTX = st.integers(0, 12000)
PREFILL = st.tuples(st.integers(2, 12000), CTX)   # a 1-token entry is a decode
BATCH = st.tuples(st.lists(PREFILL, max_size=3), st.lists(CTX, max_size=400))
MORE = st.integers(1, 5000)


def no_less(t_new, t_old):
    # equal up to float rounding in the interpolations (1e-12 relative)
    return t_new >= t_old * (1 - 1e-12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(["synthetic", "vidur"]), batch=BATCH, d=MORE,
       new_decode=CTX, new_prefill=PREFILL, pick=st.integers(0, 10**6))
def test_more_tokens_context_or_requests_never_predict_less(models, which, batch, d, new_decode,
                                                           new_prefill, pick):
    cm = models[which]
    pre, dec = batch
    t = cm.iteration_time(pre, dec)
    if pre:
        i = pick % len(pre)
        c, k = pre[i]
        more_tokens = pre[:i] + [(c + d, k)] + pre[i + 1:]
        more_context = pre[:i] + [(c, k + d)] + pre[i + 1:]
        assert no_less(cm.iteration_time(more_tokens, dec), t), ("chunk", i, d)
        assert no_less(cm.iteration_time(more_context, dec), t), ("prefill context", i, d)
    if dec:
        i = pick % len(dec)
        longer = dec[:i] + [dec[i] + d] + dec[i + 1:]
        assert no_less(cm.iteration_time(pre, longer), t), ("decode context", i, d)
    # one more request, at any context
    assert no_less(cm.iteration_time(pre, dec + [new_decode]), t), ("one more decode",)
    assert no_less(cm.iteration_time(pre + [new_prefill], dec), t), ("one more prefill",)


def test_the_two_reported_dips_are_gone(tmp_path):
    """Issue 22's two cases, rebuilt on a synthetic profile: prefill time at a fixed chunk fell
    as context grew (the increment floor P(k + c) - P(k), P not convex), and decode time beyond
    the profiled batch fell with context (the last segment's slope across batches shrinking as
    context grows; Vidur's A100 profile: batch 256, 141 -> 131.5 ms from context 63 to 94)."""
    rows = [r for r in synthetic_rows() if r["operator"] not in ("prefill_attention",
                                                                  "decode_attention")]
    # whole prompts whose time rises in steps (wave quantization): P is not convex
    steps = {128: 1e-3, 256: 1e-3, 384: 3e-3, 512: 3e-3, 640: 5e-3}
    rows += [{**META, "operator": "prefill_attention", "chunk": c, "context": k,
              "time_s": t + 1e-7 * k} for c, t in steps.items() for k in (0, 1024)]
    # the batch-64 -> 128 step steep at short context, shallow at long context
    dec = {(64, 16): 1e-3, (128, 16): 5e-3, (64, 4096): 6e-3, (128, 4096): 7e-3}
    rows += [{**META, "operator": "decode_attention", "batch": b, "context": k, "time_s": t}
             for (b, k), t in dec.items()]
    cm = profiled(write_csv(tmp_path / "steps.csv", rows))
    t = [cm.iteration_time([(128, k)], [], 0) for k in range(0, 1024, 8)]
    assert np.all(np.diff(t) >= 0)
    t = [cm.iteration_time([], [k] * 256) for k in range(16, 4096, 64)]
    assert np.all(np.diff(t) >= 0)


def test_a_profile_missing_an_operator_fails_naming_it_and_the_file(tmp_path):
    rows = synthetic_rows()
    for op in ("linear", "prefill_attention", "decode_attention"):
        path = write_csv(tmp_path / f"no_{op}.csv", [r for r in rows if r["operator"] != op])
        with pytest.raises(ProfileError, match=rf"{path}.* has no {op} rows"):
            profiled(path)
    # a Vidur directory with mlp.csv alone (as every one but Llama-2-70B's in the shared folder)
    d = tmp_path / "a100" / "meta-llama" / "Llama-2-70b-hf"
    d.mkdir(parents=True)
    shutil.copy(VIDUR / "mlp.csv", d)
    with pytest.raises(ProfileError, match=r"attention.csv does not exist\) has no "
                                           r"prefill_attention and no decode_attention rows"):
        profiled(d, "llama-2-70b", "a100-80gb", 2)


def test_the_cpu_side_is_the_profiles_or_else_the_roofline_s_and_says_so(models, synthetic):
    cm = models["vidur"]
    # Vidur measures no CPU side: the hardware preset's (vLLM v0 as measured by Vidur)
    assert cm.iteration_time([], []) == pytest.approx(1.4e-3)
    assert cm._over(10) == pytest.approx(1.4e-3 + 10 * 1e-4)
    rec = cm.describe()
    assert "iteration_overhead_s=0.0014" in rec["from_roofline"]["overhead"]
    assert set(rec["from_roofline"]) == {"overhead", "lm_head", "allreduce"}
    zero = profiled(VIDUR, "llama-2-70b", "a100-80gb", 2, iteration_overhead_s=0.0)
    assert zero.iteration_time([], []) == 0.0 and "overhead" not in zero.describe()["from_roofline"]
    # a profile with overhead rows: its own, and nothing taken from the roofline at TP 1
    own = profiled(synthetic)
    assert own.iteration_time([], []) == 1.5e-3 and own.describe()["from_roofline"] == {}


@pytest.fixture
def synthetic(tmp_path):
    return write_csv(tmp_path / "profile.csv", synthetic_rows())


def test_a_profile_measured_under_other_versions_warns_once(tmp_path, caplog):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [{k: v for k, v in r.items() if k not in META} for r in synthetic_rows()]
    cols = ["operator", "num_tokens", "chunk", "batch", "context", "time_s"]
    table = pa.table({c: [r.get(c) for r in rows] for c in cols})

    def write(name, versions):
        meta = {**META, "versions": json.dumps(versions)}
        pq.write_table(table.replace_schema_metadata({k: str(v) for k, v in meta.items()}),
                       tmp_path / name)
        return tmp_path / name
    old = write("old.parquet", {"numpy": "0.0.1", "python": "2.7.0"})
    same = write("same.parquet", {"numpy": np.__version__})
    with caplog.at_level(logging.WARNING, logger="sarathi_lab.costmodels.profiled"):
        cm = profiled(old)
        cm.iteration_time([(100, 0)], [5])
        profiled(same)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert f"numpy 0.0.1 (now {np.__version__})" in lines[0] and "python 2.7.0" in lines[0]
    assert str(old) in lines[0]
    assert cm.describe()["measured_with"] == {"numpy": "0.0.1", "python": "2.7.0"}
    assert "Vidur" in profiled(VIDUR, "llama-2-70b", "a100-80gb", 2).describe()["measured_with"]


def test_vectorized_surface_and_increment_floor_agree_with_their_definitions(models):
    rng = np.random.default_rng(0)
    for cm in models.values():
        for surf in (cm.profile.prefill_attention, cm.profile.decode_attention):
            a = rng.uniform(0, 3 * surf.a[-1], 200)
            b = rng.uniform(0, 3 * surf.b[-1], 200)
            assert surf.at(a, b) == pytest.approx([surf(x, y) for x, y in zip(a, b)], rel=1e-12)
        # the floor: the largest whole-prompt increment over every earlier context (brute
        # force over whole tokens; the maximum of a piecewise-linear difference is at a knot)
        P = cm.profile.prefill_attention
        for c, k in ((64, 700), (300, 2500), (1000, 5000)):
            brute = max(P(kk + c, 0) - P(kk, 0) for kk in range(0, k + 1))
            assert cm._increment(c, k) == pytest.approx(brute, rel=1e-9)


def test_subadditive_minorant_lowers_never_raises():
    from sarathi_lab.costmodels.profiles import subadditive_minorant
    # by hand: 3 tokens measured dearer than 1 + 2 (a tile step) drops to 1 + 2; 4 to 2 + 2
    x = np.array([1.0, 2.0, 3.0, 4.0])
    s = subadditive_minorant(x, [1.0, 1.5, 3.0, 3.5])
    assert list(s) == [1.0, 1.5, 2.5, 3.0]
    # random nondecreasing staircases: never above the points, subadditive and nondecreasing
    rng = np.random.default_rng(1)
    for _ in range(20):
        x = np.unique(rng.integers(1, 300, 40)).astype(float)
        y = np.maximum.accumulate(rng.uniform(0, 2, x.size) + 0.1 * x)
        s = subadditive_minorant(x, y)
        assert np.all(s <= y + 1e-12) and np.all(np.diff(s) >= -1e-12)
        for i in range(x.size):
            for j in range(i):
                if x[0] <= x[i] - x[j] <= x[i - 1]:   # splits into points settled before
                    assert s[i] <= s[j] + np.interp(x[i] - x[j], x, s) + 1e-9
