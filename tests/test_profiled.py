"""The profiled cost model: interpolation of a synthetic profile against held-out points,
monotonicity, extrapolation, mismatched profiles, the Vidur format (a small fixture), chunking,
and one CLI run."""
import csv
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from helpers import cli
from profile_helpers import (
    META,
    OVERHEAD,
    VIDUR,
    VIDUR_RUN,
    dec,
    head,
    lin,
    pre,
    preset,
    profiled,
    synthetic_rows,
    write_csv,
)

from sarathi_lab.costmodels.profiled import ProfiledConfig, ProfiledCostModel
from sarathi_lab.costmodels.profiles import Curve, ProfileError, Surface, monotone
from sarathi_lab.costmodels.roofline import RooflineCostModel

TESTS = Path(__file__).resolve().parent
CONFIGS = TESTS.parent / "configs"


@pytest.fixture
def synthetic(tmp_path):
    return write_csv(tmp_path / "profile.csv", synthetic_rows())


def vidur_model(tp=2, hardware="a100-80gb"):
    return profiled(VIDUR, "llama-2-70b", hardware, tp)


def test_predictions_within_two_percent_of_held_out_points(synthetic):
    cm = profiled(synthetic)
    # none of these points is in the profile
    for c, k in [(200, 0), (700, 300), (1500, 1800), (2600, 1100), (3900, 100)]:
        truth = OVERHEAD + lin(c) + pre(c, k) + head(1)
        assert cm.iteration_time([(c, k)], []) == pytest.approx(truth, rel=0.02)
    for b, k in [(3, 100), (24, 700), (100, 2000), (200, 3000)]:
        truth = OVERHEAD + lin(b) + dec(b, k) + head(b)
        assert cm.iteration_time([], [k] * b) == pytest.approx(truth, rel=0.02)
    # the overhead is the profile's measured one unless set
    assert cm.iteration_time([], []) == OVERHEAD
    assert profiled(synthetic, iteration_overhead_s=0.0).iteration_time([], []) == 0.0


def test_parquet_profile_with_file_metadata_loads_like_the_csv(synthetic, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [{k: v for k, v in r.items() if k not in META} for r in synthetic_rows()]
    cols = ["operator", "num_tokens", "chunk", "batch", "context", "time_s"]
    table = pa.table({c: [r.get(c) for r in rows] for c in cols})
    table = table.replace_schema_metadata({k: str(v) for k, v in META.items()})
    pq.write_table(table, tmp_path / "p.parquet")
    a, b = profiled(synthetic), profiled(tmp_path / "p.parquet")
    for batch in ([(700, 300)], [(64, 0), (1, 0)]):
        assert a.iteration_time(batch, [5, 900]) == b.iteration_time(batch, [5, 900])


@pytest.mark.parametrize("which", ["synthetic", "vidur"])
def test_more_tokens_never_predict_less_time(which, synthetic):
    cm = profiled(synthetic) if which == "synthetic" else vidur_model()
    grid = [1, 2, 3, 5, 8, 13, 31, 64, 100, 255, 512, 777, 1024, 2000, 3000, 4096, 6000]
    for k in (0, 100, 1000, 3000):
        t = [cm.iteration_time([(c, k)], []) for c in grid if c > 1]
        assert np.all(np.diff(t) >= 0), (k, t)
        d = [cm.iteration_time([], [k] * b) for b in (1, 2, 3, 7, 16, 33, 64, 100, 128, 200)]
        assert np.all(np.diff(d) >= 0), (k, d)
    for b in (1, 8, 100):
        d = [cm.iteration_time([], [k] * b) for k in (0, 10, 31, 100, 700, 2047, 4000, 9000)]
        assert np.all(np.diff(d) >= 0), (b, d)
    assert all(cm.iteration_time([(c, 0)], []) > 0 for c in grid)


def test_beyond_the_profile_extrapolates_linearly_and_warns_once_per_run(synthetic, caplog):
    cm = profiled(synthetic)
    with caplog.at_level(logging.WARNING, logger="sarathi_lab.costmodels.profiled"):
        inside = cm.iteration_time([(4096, 0)], [])
        t1 = cm.iteration_time([(8192, 0)], [])
        t2 = cm.iteration_time([(16384, 0)], [])
        cm.iteration_time([(12000, 0)], [])
        cm.iteration_time([], [9000] * 300)
    assert inside < t1 < t2
    # linear with the last segment's slope (3072 -> 4096 tokens) beyond the last point
    slope = (lin(4096) - lin(3072)) / 1024
    assert cm.profile.linear(8192) == pytest.approx(lin(4096) + slope * 4096)
    lines = [r.getMessage() for r in caplog.records]
    # one warning for the run, at the first batch beyond, saying how far in every dimension
    assert len(lines) == 1, lines
    assert "8192 tokens beyond the profiled 4096" in lines[0]
    assert "a prefill chunk of 8192 tokens beyond the profiled 4096" in lines[0]
    assert str(synthetic) in lines[0]
    # the furthest extents go to the summary's record
    beyond = cm.describe()["beyond_profile"]
    assert beyond["tokens"] == {"furthest": 16384, "profiled": 4096.0}
    assert beyond["decode batch"] == {"furthest": 300, "profiled": 256.0}
    assert beyond["decode context"] == {"furthest": 9000, "profiled": 4096.0}
    assert "prefill context" not in beyond


def test_never_negative_and_never_decreasing_on_noisy_points():
    c = Curve([1, 2, 3, 4], [3e-3, 1e-3, 2e-3, 0.0], "noisy")
    vals = [c(x) for x in (0, 1, 1.5, 2, 3, 4, 10, 100)]
    # every point violates the order: one pool, at the median of the four
    assert vals[0] == pytest.approx(1.5e-3) and np.all(np.diff(vals) >= 0)
    # the fit is flat at the end: beyond it, proportional to x (never negative)
    assert c(8) == pytest.approx(1.5e-3 * 8 / 4)
    with pytest.raises(ProfileError, match="must be finite and >= 0"):
        Curve([1, 2], [1e-3, -1e-3], "negative")


def test_one_slow_point_is_outvoted_not_propagated():
    # 2 tokens measured while another job held the core: a running maximum would price 2-8
    # tokens at 6.3 ms; the isotonic fit pools it with its neighbours at their median
    y = [2.0, 6.3, 2.2, 2.3, 2.95, 7.9]
    assert monotone(y).tolist() == [2.0, 2.3, 2.3, 2.3, 2.95, 7.9]
    assert monotone([1, 2, 3]).tolist() == [1, 2, 3]
    c = Curve([1, 2, 4, 8, 16, 32], np.array(y) * 1e-3, "spike")
    assert c(4) == pytest.approx(2.3e-3)


def test_profile_for_another_model_or_tp_or_dtype_or_device_fails_naming_both(synthetic):
    with pytest.raises(ProfileError, match=r"model=llama-2-7b .*this run is model=llama-3-8b"):
        profiled(synthetic, model="llama-3-8b")
    with pytest.raises(ProfileError, match=r"tensor_parallel=1 but|tensor_parallel=1, but"):
        profiled(synthetic, tp=2)
    with pytest.raises(ProfileError, match=r"device=a100-80gb.*hardware=h100-sxm"):
        profiled(synthetic, hardware="h100-sxm")
    rows = [{**r, "dtype": "float32"} for r in synthetic_rows()]
    other = write_csv(synthetic.with_name("fp32.csv"), rows)
    with pytest.raises(ProfileError, match=r"dtype=float32.*dtype=bfloat16.*differs in: dtype"):
        profiled(other)
    with pytest.raises(ProfileError, match=r"tensor_parallel=4 \(it was measured at \[2\]\)"):
        vidur_model(tp=4)
    with pytest.raises(ProfileError, match=r"model=meta-llama/Llama-2-70b-hf.*model=llama-2-7b"):
        profiled(VIDUR, "llama-2-7b", "a100-80gb", 2)
    with pytest.raises(ProfileError, match=r"executor.profile"):
        ProfiledCostModel(preset("model", "llama-2-7b"), preset("hardware", "a100-80gb"), 1,
                          ProfiledConfig())


def test_malformed_profile_names_the_problem(tmp_path):
    rows = synthetic_rows()
    bad = write_csv(tmp_path / "op.csv", [*rows, {**META, "operator": "softmax", "time_s": 1}])
    with pytest.raises(ProfileError, match="operator 'softmax'"):
        profiled(bad)
    mixed = write_csv(tmp_path / "mixed.csv", [*rows[:-1], {**rows[-1], "model": "yi-34b"}])
    with pytest.raises(ProfileError, match="column 'model' differs"):
        profiled(mixed)
    with pytest.raises(ProfileError, match="no such file"):
        profiled(tmp_path / "missing.csv")


def test_vidur_profile_times_are_per_layer_ms_summed_over_the_model():
    cm = vidur_model()
    with open(VIDUR / "mlp.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["num_tokens"] == "256")
    ms = {k.split(".")[1]: float(v) for k, v in row.items() if k.startswith("time_stats")}
    per_layer = sum(ms[op] for op in ("input_layernorm", "attn_pre_proj", "attn_rope",
                                      "attn_post_proj", "post_attention_layernorm",
                                      "mlp_up_proj", "mlp_act", "mlp_down_proj")) + 2 * ms["add"]
    assert cm.profile.linear(256) == pytest.approx(1e-3 * (ms["emb"] + 80 * per_layer))
    with open(VIDUR / "attention.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["is_prefill"] == "True"
                   and r["prefill_chunk_size"] == "1024" and r["kv_cache_size"] == "512")
    attn_ms = sum(float(row[f"time_stats.{op}.median"] or 0) for op in
                  ("attn_prefill", "attn_input_reshape", "attn_output_reshape"))
    assert cm._prefill(1024, 512) == pytest.approx(max(
        1e-3 * 80 * attn_ms, cm._prefill(1536, 0) - cm._prefill(512, 0)))
    # measured and roofline agree to within a factor of two on a mid-size batch
    roof = RooflineCostModel(preset("model", "llama-2-70b"), preset("hardware", "a100-80gb"), 2)
    for batch, decodes in (([(1024, 512)], []), ([], [1000] * 32)):
        ratio = cm.iteration_time(batch, decodes) / roof.iteration_time(batch, decodes)
        assert 0.5 < ratio < 2, ratio
    # memory and length are the roofline's
    assert cm.num_kv_blocks(16) == roof.num_kv_blocks(16)
    assert cm.max_model_len == roof.max_model_len == 4096


@pytest.mark.parametrize("which", ["synthetic", "vidur"])
def test_chunking_a_prompt_never_predicts_less_than_one_piece(which, synthetic):
    cm = profiled(synthetic) if which == "synthetic" else vidur_model()
    for n in (1000, 4096):
        whole = cm.iteration_time([(n, 0)], [], 1)
        for chunk in (64, 128, 256, 512, 1024, 2048):
            starts = list(range(0, n, chunk))
            total = sum(cm.iteration_time([(min(chunk, n - k), k)], [], int(k == starts[-1]))
                        for k in starts)
            assert total >= whole, (n, chunk, total, whole)


@pytest.mark.slow   # a CLI subprocess
def test_cli_runs_the_profiled_cost_model_on_the_vidur_fixture(tmp_path):
    common = (*VIDUR_RUN, "trace.num_requests=20")
    # executor.profile sits in sim.yaml as null: set without a +
    r = cli(f"hydra.run.dir={tmp_path}/p", *common, "executor.cost_model=profiled",
            f"executor.profile={VIDUR}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert s["num_finished"] == 20
    assert s["settings"]["executor"]["cost_model_settings"]["profile"] == str(VIDUR)
    r = cli(f"hydra.run.dir={tmp_path}/bad", *common, "executor.tensor_parallel=4",
            "executor.cost_model=profiled", f"executor.profile={VIDUR}", cwd=tmp_path)
    assert r.returncode != 0 and "tensor_parallel=4" in r.stderr
    # a profile given to the roofline is read by nobody: an error, not ignored
    r = cli(f"hydra.run.dir={tmp_path}/roof", *common, f"executor.profile={VIDUR}", cwd=tmp_path)
    assert r.returncode != 0 and "executor.profile" in r.stderr and "roofline" in r.stderr
    # and the profiled cost model without one says how to give it
    r = cli(f"hydra.run.dir={tmp_path}/none", *common, "executor.cost_model=profiled",
            cwd=tmp_path)
    assert r.returncode != 0 and "executor.profile=PATH" in r.stderr


def test_a_row_measured_at_one_context_does_not_pull_its_neighbours_down():
    """sarathi-lab-profile times prompts of T tokens at context 0 only (its linear points, which
    also give prefill_attention rows there) beside a grid of chunks at contexts 0-512. Extended
    flat across contexts, the 32-token row sat at its context-0 time next to the 16-token chunk
    at context 512, and the column's monotone fit pooled the measured chunk down to the median
    of the two (2 ms instead of 3 ms, as the CPU profile had it: 1.77 ms for 3.09 ms measured)."""
    pts = [(16, 0, 0.5e-3), (16, 512, 3e-3), (32, 0, 1e-3), (64, 0, 2e-3), (64, 512, 9e-3)]
    s = Surface(*zip(*pts), "prefill_attention")
    assert s(16, 512) == pytest.approx(3e-3) and s(64, 512) == pytest.approx(9e-3)
    # the row measured only at 0 is taken across chunks where it was not measured
    assert s(32, 512) == pytest.approx(3e-3 + (9e-3 - 3e-3) * (32 - 16) / (64 - 16))
    assert s(32, 0) == pytest.approx(1e-3) and s(32, 256) == pytest.approx((1e-3 + 5e-3) / 2)
    # beyond the measured rows of a column: no lower than the largest one
    s = Surface(*zip(*(pts + [(128, 0, 4e-3)])), "prefill_attention")
    assert s(64, 512) == pytest.approx(9e-3) and s(128, 512) == pytest.approx(9e-3)
    assert all(s(a, 512) <= s(a2, 512) for a, a2 in ((16, 32), (32, 64), (64, 128)))
