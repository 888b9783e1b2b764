"""`sarathi-lab-profile`: profile the real executor on a tiny random Llama, fit the profiled cost
model to it and predict iterations it never measured; monotone predictions; a profile used for
another model, dtype or shape fails naming both; the CLI writes the Parquet with its metadata."""
import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from sarathi_lab import profiler as P
from sarathi_lab.costmodels.profiled import ProfiledConfig, ProfiledCostModel
from sarathi_lab.costmodels.profiles import ProfileError
from test_cli import cli
from test_profiled import CONFIGS

# Held-out iterations (shapes the grid never measured, mixed batches among them) are predicted
# within this share of their measured time, as the median over the shapes. Both sides take the
# minimum of repeated steps: on a shared CPU, other jobs preempt a step for milliseconds (noise
# that only adds), which a median of a few steps does not always remove.
TOLERANCE = 0.25
TINY = ["model=tiny-llama"]


@pytest.fixture(scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def measured(tmp_path_factory, one_thread):
    """(profile path, harness): the tiny grid measured on the tiny model."""
    ex, model = P.build_executor(TINY)
    h = P.Harness(ex)
    rows = P.measure(h, P.GRIDS["tiny"], repeats=5, warmup=1, statistic="min")
    path = P.write(rows, P.metadata(ex, model, "tiny", 5, 1, "min"),
                   tmp_path_factory.mktemp("prof") / "tiny.parquet")
    return path, h


def preset(**over):
    return {**yaml.safe_load((CONFIGS / "model" / "tiny-llama.yaml").read_text()), **over}


def cost_model(path, **model_over):
    return ProfiledCostModel(preset(**model_over), P.host_hardware("cpu"), 1,
                             ProfiledConfig(profile=str(path)))


def fastest_step(h, entries, n=9):
    for _ in range(2):
        h.run(entries)
    return min(h.run(entries)["total"] for _ in range(n))


HELD_OUT = [
    [(40, 0)],                                  # a prompt between grid points
    [(100, 100)],                               # a chunk after context
    [(1, 100)] * 6,                             # a decode batch between grid points
    [(20, 50)] + [(1, 80)] * 3,                 # mixed
    [(60, 10), (30, 120)] + [(1, 200)] * 5,     # two chunks and decodes
]


def test_profile_predicts_held_out_iterations(measured):
    path, h = measured
    cm = cost_model(path)
    h.bind(5000)
    errs = []
    for entries in HELD_OUT:
        pre = [(n, k) for n, k in entries if not (n == 1 and k > 0)]
        dec = [k for n, k in entries if n == 1 and k > 0]
        pred = cm.iteration_time(pre, dec, len(entries))
        errs.append(pred / fastest_step(h, entries) - 1)
    assert np.median(np.abs(errs)) <= TOLERANCE, errs
    assert max(np.abs(errs)) <= 3 * TOLERANCE, errs
    # and the profile's own held-out rows (mixed batches measured with the grid)
    checks = P.check(path, P.model_of(P.profile_meta(path)), P.host_hardware("cpu"))
    assert len(checks) == len(P.GRIDS["tiny"].mixed)
    assert np.median([abs(c["error"]) for c in checks]) <= TOLERANCE, checks


def test_rows_are_the_parts_of_real_iterations(measured):
    path, _ = measured
    t = pq.read_table(path).to_pandas()
    g = P.GRIDS["tiny"]
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


def test_harness_splits_an_iteration_into_its_parts(measured, one_thread):
    _, h = measured
    h.bind(5000)
    p = h.run([(32, 16)] + [(1, 40)] * 3)
    assert p["total"] >= p["prepare"] + p["forward"] + p["sample"] - 1e-9
    assert 0 < p["attention"] < p["forward"] and 0 < p["head"] < p["forward"]
    assert p["linear"] == pytest.approx(p["forward"] - p["attention"] - p["head"])


@pytest.mark.parametrize("which", ["linear", "chunk", "context", "batch", "decode_context"])
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


def test_cli_writes_the_parquet_with_its_metadata(tmp_path):
    out = tmp_path / "p.parquet"
    r = subprocess.run([sys.executable, "-m", "sarathi_lab.profiler", *TINY, "--grid", "tiny",
                        "--repeats", "1", "--warmup", "0", "--threads", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "held-out mixed iterations" in r.stdout
    assert "profiling" in r.stderr          # the progress bar
    meta = P.profile_meta(out)
    assert meta["model"] == "tiny-llama" and meta["dtype"] == "float32"
    assert meta["device"] == "cpu" and meta["threads"] == "1" and meta["grid"] == "tiny"
    assert torch.__version__ in meta["versions"] and meta["n_embd"] == "64"
    ops = set(pq.read_table(out).column("operator").to_pylist())
    assert ops == {"linear", "prefill_attention", "decode_attention", "lm_head", "overhead",
                   "iteration"}
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
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "--out" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "sarathi_lab.profiler", "executor.dtyp=float32",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "executor.dtyp" in r.stderr and "Traceback" not in r.stderr
