"""Decodes right after a prompt step run slower (a CPU profile's decode_rewarm rows): the factors
read from a profile, the state a run keeps of them, and the simulator charging them by hand."""
import pandas as pd
import pytest
from helpers import composed
from profile_helpers import META, dec, head, lin, profiled, synthetic_rows, write_csv

from sarathi_lab.costmodels.profiles import ProfileError
from sarathi_lab.costmodels.rewarm import Rewarm, prompt_tokens
from sarathi_lab.request import Request
from sarathi_lab.settings import ConfigError


def rewarm_rows(times):
    """decode_rewarm rows: {T: [steady, place 1, place 2, ...]} (seconds)."""
    return [{**META, "operator": "decode_rewarm", "num_tokens": T, "place": p, "time_s": t}
            for T, ts in times.items() for p, t in enumerate(ts)]


def write(path, rows):
    cols = ["operator", "num_tokens", "chunk", "batch", "context", "place", "time_s", *META]
    import csv
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows(rows)
    return path


def test_factors_by_hand():
    rw = Rewarm([100, 300], [1, 2, 3], [[1.5, 1.2, 1.0], [2.5, 1.6, 1.1]])
    assert rw.factor(100, 1) == 1.5 and rw.factor(300, 2) == 1.6
    assert rw.factor(200, 1) == pytest.approx(2.0)          # halfway between 1.5 and 2.5
    assert rw.factor(50, 2) == 1.2 and rw.factor(900, 1) == 2.5   # flat beyond the sizes
    assert rw.factor(300, 4) == 1.0 and rw.factor(300, 0) == 1.0  # beyond the places
    assert rw.factor(0, 1) == 1.0                          # no prompt step yet


def test_noise_is_pooled_into_monotone_factors():
    """Never below 1, nonincreasing in place, nondecreasing in the prompt step's tokens."""
    rw = Rewarm([100, 300], [1, 2, 3], [[1.5, 1.6, 0.9], [1.4, 1.2, 1.1]])
    f = rw.factors
    assert f.min() >= 1.0
    assert all((f[:, :-1] >= f[:, 1:]).ravel()) and all((f[1] >= f[0]).ravel())
    # row 100: 1.5 < 1.6 pooled at 1.55, 0.9 raised to 1; then across T, 1.55 > 1.4 and
    # 1.55 > 1.2 pooled at their medians
    assert f.ravel().tolist() == pytest.approx([1.475, 1.375, 1.0, 1.475, 1.375, 1.1])


def test_a_run_follows_the_steps():
    w = Rewarm([64], [1, 2], [[2.0, 1.5]]).track()
    assert [w.step(t) for t in (0, 64, 0, 0, 0, 32, 0, 128, 0)] == \
        [1.0, 1.0, 2.0, 1.5, 1.0, 1.0, 2.0, 1.0, 2.0]


def test_what_counts_as_a_prompt_step():
    def req(prompt, outputs, computed):
        r = Request(0, 0.0, prompt, 10)
        r.num_output_tokens, r.num_computed_tokens = outputs, computed
        return r
    chunk, last_one = req(100, 0, 32), req(100, 0, 99)
    decode, recompute = req(100, 5, 104), req(100, 5, 0)
    spec = req(100, 5, 104)        # a decode verifying 3 drafts: 4 tokens from its last one
    assert prompt_tokens([chunk, decode], [32, 1]) == 32
    assert prompt_tokens([last_one], [1]) == 0          # a one-token entry is priced a decode
    assert prompt_tokens([recompute], [105]) == 105
    assert prompt_tokens([spec, decode], [4, 1]) == 0


def test_bad_rows_name_what_is_wrong(tmp_path):
    base = synthetic_rows()
    no_steady = [r for r in rewarm_rows({64: [1e-3, 2e-3]}) if r["place"] != 0]
    with pytest.raises(ProfileError, match="num_tokens=64 lack the steady time"):
        profiled(write(tmp_path / "a.csv", base + no_steady))
    uneven = rewarm_rows({64: [1e-3, 2e-3, 1.5e-3], 128: [1e-3, 2e-3]})
    with pytest.raises(ProfileError, match="num_tokens=128 have places"):
        profiled(write(tmp_path / "b.csv", base + uneven))
    gap = [r for r in rewarm_rows({64: [1e-3, 2e-3, 1.5e-3, 1.2e-3]}) if r["place"] != 2]
    with pytest.raises(ProfileError, match="1..n without gaps"):
        profiled(write(tmp_path / "c.csv", base + gap))
    # without rows: no rewarm, and the summary says so
    cm = profiled(write_csv(tmp_path / "d.csv", base))
    assert cm.rewarm is None and cm.describe()["rewarm"] is None


PROMPT, OUTPUT = 300, 6


def _run(profile, tmp_path, name, *extra):
    from sarathi_lab.run.runner import run
    cfg = composed("model=llama-2-7b", "hardware=a100-80gb", "executor.cost_model=profiled",
                   f"executor.profile={profile}", "trace=synthetic", "trace.num_requests=1",
                   f"trace.prompt_len={PROMPT}", f"trace.output_len={OUTPUT}", "progress=false",
                   *extra)
    s = run(cfg, tmp_path / name)
    return s, pd.read_parquet(tmp_path / name / "iterations.parquet")


def test_the_simulator_charges_each_decode_its_place(tmp_path):
    """One request of 300 prompt tokens and 6 outputs: the prompt step at its price, then five
    decodes, the first two at the profile's factors for a 300-token prompt step (read halfway
    between the rows of 200 and 400), the rest steady."""
    rows = synthetic_rows() + rewarm_rows({200: [1e-3, 1.8e-3, 1.3e-3],
                                           400: [2e-3, 4.4e-3, 2.8e-3]})
    path = write(tmp_path / "p.csv", rows)
    s, it = _run(path, tmp_path, "on")
    assert len(it) == OUTPUT and s["cost_model"]["rewarm"]["places"] == 2
    assert s["cost_model"]["rewarm"]["first_place"] == [1.8, 2.2]
    from profile_helpers import OVERHEAD

    def decode(k):   # the synthetic machine's decode step at context k, steady
        return OVERHEAD + lin(1) + dec(1, k) + head(1)
    factors = [(1.8 + 2.2) / 2, (1.3 + 1.4) / 2, 1.0, 1.0, 1.0]
    want = [decode(PROMPT + j) * f for j, f in enumerate(factors)]
    assert it["duration"].tolist()[1:] == pytest.approx(want, rel=1e-9)
    # the same profile without the rows prices the prompt step the same and every decode steady
    _, plain = _run(write_csv(tmp_path / "q.csv", synthetic_rows()), tmp_path, "off")
    assert plain["duration"].iloc[0] == pytest.approx(it["duration"].iloc[0], rel=1e-12)
    assert plain["duration"].tolist()[1:] == pytest.approx(
        [decode(PROMPT + j) for j in range(OUTPUT - 1)], rel=1e-9)
    # fast-forward (on by default) skips through steady runs, which the step order it prices
    # forbids: the run stepped every batch, and asking for fast-forward changes nothing
    _, off = _run(path, tmp_path, "ff_off", "fast_forward=false")
    assert off["duration"].tolist() == it["duration"].tolist()


def test_pipeline_stages_refuse_a_profile_that_prices_step_order(tmp_path):
    from sarathi_lab.run.runner import run
    path = write(tmp_path / "p.csv", synthetic_rows() + rewarm_rows({200: [1e-3, 2e-3]}))
    cfg = composed("model=llama-2-7b", "hardware=a100-80gb", "executor.cost_model=profiled",
                   f"executor.profile={path}", "executor.pipeline_parallel=2", "trace=synthetic",
                   "trace.num_requests=1", "progress=false")
    with pytest.raises(ConfigError, match="pipeline_parallel=2.*decode_rewarm"):
        run(cfg, None, write=False)


@pytest.mark.slow   # a CLI subprocess
def test_a_profile_with_rewarm_rows_from_the_cli(tmp_path):
    """`sarathi-lab ... executor.profile=PATH` with decode_rewarm rows: the summary says the
    factors, and the decodes after the prompt step cost more than the same profile's without."""
    import json

    from helpers import cli
    rows = synthetic_rows()
    paths = {"on": write(tmp_path / "p.csv", rows + rewarm_rows({200: [1e-3, 2e-3, 1.5e-3]})),
             "off": write_csv(tmp_path / "q.csv", rows)}
    got = {}
    for name, path in paths.items():
        r = cli(f"hydra.run.dir={tmp_path}/{name}", "model=llama-2-7b", "hardware=a100-80gb",
                "executor.cost_model=profiled", f"executor.profile={path}", "trace=synthetic",
                "trace.num_requests=1", f"trace.prompt_len={PROMPT}",
                f"trace.output_len={OUTPUT}", "progress=false", cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        got[name] = (json.loads((tmp_path / name / "summary.json").read_text()),
                     pd.read_parquet(tmp_path / name / "iterations.parquet")["duration"])
    assert got["on"][0]["cost_model"]["rewarm"]["first_place"] == [2.0]
    assert got["off"][0]["cost_model"]["rewarm"] is None
    # the default fast_forward=true cannot act on a run priced by its step order, and says so
    assert got["on"][0]["fast_forward"] == {
        "enabled": False, "why_not": "the profile's decode_rewarm rows price each decode by "
                                     "its place after the last prompt step"}
    assert got["off"][0]["fast_forward"] == {"enabled": True, "why_not": None}
    on, off = got["on"][1], got["off"][1]
    assert on.iloc[1] == pytest.approx(2.0 * off.iloc[1], rel=1e-9)    # the 1st decode: x2
    assert on.iloc[2] == pytest.approx(1.5 * off.iloc[2], rel=1e-9)    # the 2nd: x1.5
    assert on.iloc[3:].tolist() == pytest.approx(off.iloc[3:].tolist(), rel=1e-12)
